"""Pairing, timing and the result table shared by every benchmark."""

from __future__ import annotations

import gc
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "REPO_ROOT", "Result", "clock", "format_table", "paired", "process_time", "use_instruction_counts",
    "use_wall_clock",
]  # fmt: skip

#: The checkout these benchmarks belong to; subprocesses get it as PYTHONPATH.
REPO_ROOT = Path(__file__).resolve().parent.parent

#: What in-process measurements read. CPU time of this process (all its threads) by default: on a
#: shared machine, wall time mostly measures the other jobs' scheduling. ``--wall`` switches.
_CLOCK: list[Callable[[], float]] = [time.process_time]
WALL = False


def clock() -> float:
    """Seconds on the chosen clock (process CPU time, or wall time after :func:`use_wall_clock`).

    Under ``--instructions``: the instructions this process has executed since counting began (see
    :func:`use_instruction_counts`), 0.0 while it is not counting (the warm-up runs).
    """
    return _CLOCK[0]()


#: Where callgrind writes its dumps when this process counts instructions (``--instructions``).
CALLGRIND_ENV = "GEARTRAIN_BENCH_CALLGRIND"


class _Instructions:
    """A clock that reads instruction counts from callgrind, the process running under valgrind.

    Each reading asks callgrind to dump its counters (which zeroes them) and adds the dump's total to
    a running sum, so differences between readings are the instructions executed in between. Exact and
    repeatable where CPU time is not (a shared virtual machine): a ratio of instructions is what the
    trainer's own Python work adds to a step, not what that work costs in time on a given machine.
    """

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.counting = False
        self.total = 0

    def control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True, capture_output=True)

    def count(self, on: bool) -> None:
        """Start (or stop) counting; the warm-up runs before it are not counted."""
        if on != self.counting:
            if on:
                self.control("--zero")
            self.control("--instr=" + ("on" if on else "off"))
            self.counting = on

    def __call__(self) -> float:
        if not self.counting:
            return 0.0
        before = set(self.folder.glob("cg.out.*"))
        self.control("--dump=clock")
        (dump,) = set(self.folder.glob("cg.out.*")) - before
        for line in dump.read_text().splitlines():
            if line.startswith("totals:"):
                self.total += int(line.split()[1])
        dump.unlink()
        return float(self.total)


def use_instruction_counts() -> bool:
    """Read instruction counts (this process runs under callgrind: ``--instructions``); False if it does not."""
    folder = os.environ.get(CALLGRIND_ENV)
    if not folder:
        return False
    _CLOCK[0] = _Instructions(folder)
    return True


def _instruction_clock() -> _Instructions | None:
    """The instruction clock, where ``--instructions`` chose it."""
    chosen = _CLOCK[0]
    return chosen if isinstance(chosen, _Instructions) else None


def use_wall_clock(wall: bool) -> None:
    """Measure wall time (``True``) or this process's CPU time (``False``, the default)."""
    global WALL
    WALL = wall
    _CLOCK[0] = time.perf_counter if wall else time.process_time


@dataclass
class Result:
    """One row of the table.

    Args:
        name: what was measured.
        ours: geartrain's time (median over pairs), seconds.
        theirs: the hand-written twin's time (median over pairs), seconds.
        ratio: median of the per-pair ratios ``ours / theirs``.
        target: the budget as text, e.g. ``"<= 1.03x"``.
        passed: whether the budget was met.
        note: extra context (pairs, sizes).
    """

    name: str
    ours: float
    theirs: float
    ratio: float
    target: str
    passed: bool
    note: str = ""
    ratios: list[float] = field(default_factory=list)
    #: What ``ours``/``theirs`` count: ``"s"`` (seconds, the default) or another unit, printed after the value.
    unit: str = "s"


def paired(
    ours: Callable[[], float], theirs: Callable[[], float], pairs: int, warmup: int = 1
) -> tuple[float, float, float, list[float]]:
    """Alternate ``ours`` and ``theirs`` ``pairs`` times; each returns its own measured seconds.

    Returns (median ours, median theirs, median ratio, all ratios). The order inside a pair flips
    every pair (A B, B A, ...) so a systematic first-or-second effect cancels out.
    """
    instructions = _instruction_clock()
    if instructions is not None:
        warmup = max(warmup, 1)  # counted exactly, a first run's lazy imports would be counted too
    for _ in range(warmup):
        ours()
        theirs()
    if instructions is not None:
        instructions.count(True)  # the measured pairs, not the warm-up runs
    a_times: list[float] = []
    b_times: list[float] = []
    ratios: list[float] = []
    for i in range(pairs):
        if i % 2 == 0:
            a = _collected(ours)
            b = _collected(theirs)
        else:
            b = _collected(theirs)
            a = _collected(ours)
        a_times.append(a)
        b_times.append(b)
        ratios.append(a / b)
    if instructions is not None:
        instructions.count(False)
    return statistics.median(a_times), statistics.median(b_times), statistics.median(ratios), ratios


def _collected(measure: Callable[[], float]) -> float:
    """``measure()`` after a full garbage collection, so neither side pays for the other's garbage.

    The collector stays on while measuring (what a side allocates, it pays for); only the leftovers of
    the previous measurement are cleared first, as ``timeit`` does by other means.
    """
    gc.collect()
    return measure()


def ratio_result(
    name: str,
    ours: Callable[[], float],
    theirs: Callable[[], float],
    pairs: int,
    limit: float,
    note: str = "",
    warmup: int = 1,
) -> Result:
    """Measure a pair and judge its median ratio against ``limit``."""
    a, b, ratio, ratios = paired(ours, theirs, pairs, warmup)
    if _instruction_clock() is not None:
        return Result(name, a / 1e6, b / 1e6, ratio, f"<= {limit:.2f}x", ratio <= limit, note, ratios, "M instr")
    return Result(name, a, b, ratio, f"<= {limit:.2f}x", ratio <= limit, note, ratios)


def child_env() -> dict[str, str]:
    """Environment for child Python processes: this checkout first on the path, one thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def process_time(args: list[str], cwd: str | os.PathLike[str] | None = None, timeout: float = 300) -> float:
    """Time of a ``python <args>`` process (with :data:`sys.executable`) from start to exit, seconds.

    CPU time (user + system, of the child and its own children) by default, wall time after
    :func:`use_wall_clock`.
    """
    before = _children_cpu()
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=timeout
    )
    elapsed = time.perf_counter() - start if WALL else _children_cpu() - before
    if proc.returncode != 0:
        raise RuntimeError(f"python {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def format_table(results: list[Result]) -> str:
    """The results as a fixed-width text table (also valid Markdown)."""
    header = ("benchmark", "geartrain", "hand-written", "ratio", "target", "result")
    rows = [
        (
            r.name,
            _seconds(r.ours) if r.unit == "s" else f"{r.ours:.3f} {r.unit}",
            _seconds(r.theirs) if r.unit == "s" else f"{r.theirs:.3f} {r.unit}",
            f"{r.ratio:.3f}x",
            r.target,
            "pass" if r.passed else "falls short",
        )
        for r in results
    ]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    out = [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(row) for row in rows]
    notes = [f"- {r.name}: {r.note}" for r in results if r.note]
    return "\n".join(out + (["", *notes] if notes else []))


def _seconds(value: float) -> str:
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.3f} s"
