"""``python -m bench [NAMES...] [--quick] [--pairs N] [--wall | --instructions]``: run benchmarks, print the table.

Names: overhead (training with and without the default callbacks, evaluation), import, startup,
checkpoint, ddp, sharded_checkpoint. Without names, all run. The exit status is 0 even when a target is missed: a benchmark
reports, it does not gate. ``--instructions`` (overhead only) runs the benchmark under valgrind's
callgrind and compares instructions executed instead of CPU time: one exact pair, where a noisy
machine's timings scatter (docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable

import torch

from bench import checkpoint_stall, ddp, overhead, sharded_checkpoint, startup
from bench.core import CALLGRIND_ENV, Result, format_table, use_instruction_counts, use_wall_clock

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
    parser.add_argument(
        "--instructions", action="store_true", help="instructions executed (under valgrind) instead of CPU time"
    )
    args = parser.parse_args(argv)
    names = args.names or list(GROUPS)
    use_wall_clock(args.wall)
    if args.instructions:
        if set(names) != {"overhead"} or args.wall:
            parser.error("--instructions counts the overhead rows only: python -m bench overhead --instructions")
        if not use_instruction_counts():
            raise SystemExit(_under_callgrind(argv if argv is not None else sys.argv[1:]))
    pairs = args.pairs or (1 if args.instructions else 3 if args.quick else 7)
    started = time.perf_counter()
    results: list[Result] = []
    for name in names:
        results += GROUPS[name](args.quick, pairs)
    clock = (
        "instructions executed (callgrind; one pair)"
        if args.instructions
        else "wall time"
        if args.wall
        else "CPU time (of the process; of the child for whole-process rows)"
    )
    print(
        f"geartrain benchmarks, {time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}; {clock}, checkpoint stall always wall time; medians of per-pair ratios"
    )
    print(format_table(results))
    print(f"({time.perf_counter() - started:.0f} s)")
    return results


def _under_callgrind(argv: list[str]) -> int:
    """Run this command again under valgrind's callgrind, which counts from the first measured pair on."""
    import shutil
    import subprocess
    import tempfile

    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    if missing:
        print(f"--instructions needs {' and '.join(missing)} (Debian/Ubuntu: apt install valgrind)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        command = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={folder}/cg.out",
            "--log-file=/dev/null", sys.executable, "-m", "bench", *argv,
        ]  # fmt: skip
        print("running under callgrind: torch's import alone takes about a minute, each measured run a few")
        return subprocess.run(command, env={**os.environ, CALLGRIND_ENV: folder}, check=False).returncode


if __name__ == "__main__":
    main()
