"""``SimpleProfiler``: wall time per action, as a table at the end of each stage.

Actions nest (a hook inside ``run_training_batch``, ``training_step`` inside it), so each row gives the
action's *total* time (its calls from start to stop) and its *self* time (the total less the actions
nested in it). Self times do not overlap: with the time spent in no action they add up to the
stage's wall time, and the share column is of that wall time. Lightning's table has no self column,
so its percentages add up to more than 100.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from trainer.profilers.base import Profiler

__all__ = ["SimpleProfiler"]


@dataclass
class ActionStats:
    """What the profiler knows of one action: calls, and total and self seconds."""

    count: int = 0
    total: float = 0.0
    self_time: float = 0.0


class SimpleProfiler(Profiler):
    """Times every action with ``time.perf_counter``; :meth:`summary` is the table.

    Args:
        dirpath: where the report is written (``None``: the trainer's ``log_dir``).
        filename: the report's file name without ``.txt`` (the trainer writes ``<stage>-<filename>.txt``).
        extended: Lightning's switch between its two table layouts; geartrain has one table, which
            always has the count, mean, total, self and share columns.

    Example:
        >>> profiler = SimpleProfiler()
        >>> with profiler.profile("load"):
        ...     pass
        >>> profiler.stats["load"].count
        1
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None, extended: bool = True) -> None:
        super().__init__(dirpath, filename)
        self.extended = extended
        #: Per action: calls, total seconds, self seconds (total less nested actions).
        self.stats: dict[str, ActionStats] = {}
        #: Per action, every call's seconds in order since the profiler was made, all stages together
        #: (Lightning's ``recorded_durations``; :attr:`stats` and the table are the current stage's).
        self.recorded_durations: defaultdict[str, list[float]] = defaultdict(list)
        # Actions in progress, innermost last: [name, start time, seconds spent in nested actions].
        self._open: list[list[object]] = []
        self._began = time.perf_counter()
        self._ended: float | None = None
        self._title = "run"

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | Path | None = None) -> None:
        """Start a new report for ``stage``: its wall time counts from here."""
        super().setup(stage, local_rank, log_dir)
        self.stats, self._open, self._title = {}, [], stage
        self._began, self._ended = time.perf_counter(), None

    def describe(self) -> None:
        """The stage's wall time ends here (the trainer calls this as the stage ends); print and write the table."""
        self._ended = time.perf_counter()
        super().describe()

    def teardown(self, stage: str | None) -> None:
        """The stage's wall time ends here, unless :meth:`describe` ended it."""
        if self._ended is None:
            self._ended = time.perf_counter()
        super().teardown(stage)

    def start(self, action_name: str) -> None:
        """Start timing ``action_name`` (inside the action started last, if any)."""
        if any(entry[0] == action_name for entry in self._open):
            raise ValueError(
                f"Attempted to start {action_name} which has already started (SimpleProfiler: not stopped yet)"
            )
        self._open.append([action_name, time.perf_counter(), 0.0])

    def stop(self, action_name: str) -> None:
        """Stop timing ``action_name``; its time counts as nested time of the action it ran in."""
        now = time.perf_counter()
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i][0] == action_name:
                break
        else:
            raise ValueError(
                f"Attempting to stop recording an action ({action_name}) which was never started (SimpleProfiler)"
            )
        _, began, nested = self._open.pop(i)
        duration = now - began  # type: ignore[operator]
        stats = self.stats.setdefault(action_name, ActionStats())
        stats.count += 1
        stats.total += duration
        self.recorded_durations[action_name].append(duration)
        stats.self_time += duration - nested  # type: ignore[operator]
        if i > 0:
            self._open[i - 1][2] += duration  # type: ignore[operator]

    def wall_time(self) -> float:
        """Seconds from :meth:`setup` to the stage's end (or to now, while the stage runs)."""
        return (self._ended if self._ended is not None else time.perf_counter()) - self._began

    def summary(self) -> str:
        """The table: one row per action, most self time first, with the run's wall time on top."""
        if not self.stats:
            return ""
        wall = self.wall_time()
        in_actions = sum(s.self_time for s in self.stats.values())
        header = ("Action", "Mean duration (s)", "Num calls", "Total time (s)", "Self time (s)", "Percentage %")
        rows = [("Total (wall time)", "-", str(sum(s.count for s in self.stats.values())), f"{wall:.5g}", "-", "100 %")]
        rows.append(("(in no action)", "-", "-", "-", f"{wall - in_actions:.5g}", _share(wall - in_actions, wall)))
        for name, s in sorted(self.stats.items(), key=lambda item: -item[1].self_time):
            # The stage's calls are the last ``count`` durations; summed exactly (``math.fsum``, as
            # Lightning's), so a total of many short calls carries no accumulated rounding.
            total = math.fsum(self.recorded_durations[name][-s.count :])
            row = (name, f"{total / s.count:.5g}", str(s.count), f"{total:.5g}", f"{s.self_time:.5g}")
            rows.append((*row, _share(s.self_time, wall)))
        widths = [max(len(row[c]) for row in (header, *rows)) for c in range(len(header))]
        line = "-" * (sum(widths) + 3 * len(widths) + 1)

        def fmt(row: tuple[str, ...]) -> str:
            return "| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |"

        title = f"{self._title.upper()} Profiler Report"
        return "\n".join(
            [title, "", line, fmt(header), line, *(fmt(r) for r in rows[:2]), line, *map(fmt, rows[2:]), line]
        )


def _share(seconds: float, wall: float) -> str:
    return f"{100.0 * seconds / wall:.4g}" if wall > 0 else "-"
