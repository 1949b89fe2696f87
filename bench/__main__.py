"""``python -m bench [NAMES...] [--quick] [--pairs N] [--wall]``: run benchmarks, print the table.

Names: overhead (training with and without the default callbacks, evaluation), import, startup,
checkpoint, ddp, sharded_checkpoint. Without names, all run. The exit status is 0 even when a target is missed: a benchmark
reports, it does not gate.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable

import torch

from bench import checkpoint_stall, ddp, overhead, sharded_checkpoint, startup
from bench.core import Result, format_table, use_wall_clock

GROUPS: dict[str, Callable[[bool, int], list[Result]]] = {
    "overhead": overhead.run,
    "import": startup.run_import,
    "startup": lambda quick, pairs: startup.run_startup(quick, min(pairs, 3)),
    "checkpoint": checkpoint_stall.run,
    "ddp": ddp.run,
    "sharded_checkpoint": sharded_checkpoint.run,
}


def main(argv: list[str] | None = None) -> list[Result]:
    """Parse the arguments, run the chosen groups, print and return the results."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", choices=[*GROUPS, []], help="benchmarks to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and 3 pairs: checks that it runs")
    parser.add_argument("--pairs", type=int, default=None, help="geartrain/hand-written pairs (default 7; 3 quick)")
    parser.add_argument("--wall", action="store_true", help="in-process wall time instead of process CPU time")
    args = parser.parse_args(argv)
    pairs = args.pairs or (3 if args.quick else 7)
    use_wall_clock(args.wall)
    names = args.names or list(GROUPS)
    started = time.perf_counter()
    results: list[Result] = []
    for name in names:
        results += GROUPS[name](args.quick, pairs)
    clock = "wall time" if args.wall else "CPU time (of the process; of the child for whole-process rows)"
    print(
        f"geartrain benchmarks, {time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}; {clock}, checkpoint stall always wall time; medians of per-pair ratios"
    )
    print(format_table(results))
    print(f"({time.perf_counter() - started:.0f} s)")
    return results


if __name__ == "__main__":
    main()
