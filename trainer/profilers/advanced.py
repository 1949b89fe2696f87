"""``AdvancedProfiler``: a ``cProfile`` of every action, the functions it spent its time in.

One ``cProfile.Profile`` per action name, enabled while the action runs. Actions nest, and only one
profile can be enabled at a time, so an action's profile is paused while an action nested in it runs:
each action's report holds the calls made in it and not in a nested action.
"""

from __future__ import annotations

import cProfile
import io
import pstats
from pathlib import Path

from trainer.profilers.base import Profiler

__all__ = ["AdvancedProfiler"]


class AdvancedProfiler(Profiler):
    """``cProfile`` per action; :meth:`summary` prints each action's functions by cumulative time.

    Args:
        dirpath: where the report (and, with ``dump_stats``, the ``.prof`` files) go; ``None``: the
            trainer's ``log_dir``.
        filename: the report's file name without ``.txt``.
        line_count_restriction: how many rows of each action's table to keep: a count, or a fraction
            of the rows (``1.0``: all), as ``pstats.Stats.print_stats`` takes it.
        dump_stats: also write each action's profile as ``<dirpath>/<action>.prof`` (for ``snakeviz``).

    Example:
        >>> profiler = AdvancedProfiler(line_count_restriction=5)
        >>> with profiler.profile("sum"):
        ...     _ = sum(range(10))
        >>> "Profile stats for: sum" in profiler.summary()
        True
    """

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        line_count_restriction: float = 1.0,
        dump_stats: bool = False,
    ) -> None:
        super().__init__(dirpath, filename)
        self.line_count_restriction = line_count_restriction
        self.dump_stats = dump_stats
        #: One ``cProfile.Profile`` per action, accumulated over its calls.
        self.profiled_actions: dict[str, cProfile.Profile] = {}
        self._open: list[cProfile.Profile] = []

    def __getstate__(self) -> dict[str, object]:
        """Picklable (the trainer travels to the processes it starts): profiles recorded here stay here."""
        state = self.__dict__.copy()
        state.update(profiled_actions={}, _open=[])
        return state

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | Path | None = None) -> None:
        """Start a new report for ``stage``."""
        super().setup(stage, local_rank, log_dir)
        self.profiled_actions, self._open = {}, []

    def start(self, action_name: str) -> None:
        """Enable ``action_name``'s profile, pausing the action it runs in."""
        if self._open:
            self._open[-1].disable()
        profile = self.profiled_actions.setdefault(action_name, cProfile.Profile())
        self._open.append(profile)
        profile.enable()

    def stop(self, action_name: str) -> None:
        """Disable ``action_name``'s profile and resume the action it ran in."""
        profile = self.profiled_actions.get(action_name)
        if profile is None or not self._open or self._open[-1] is not profile:
            raise ValueError(
                f"Attempting to stop recording an action ({action_name}) which was never started or is not the one "
                "running (AdvancedProfiler)"
            )
        profile.disable()
        self._open.pop()
        if self._open:
            self._open[-1].enable()

    def summary(self) -> str:
        """Each action's functions, most cumulative time first (``pstats`` rows)."""
        parts = []
        for action, profile in self.profiled_actions.items():
            out = io.StringIO()
            try:
                stats = pstats.Stats(profile, stream=out)
            except TypeError:  # nothing was recorded (an action whose calls took no Python frames)
                continue
            stats.strip_dirs().sort_stats("cumulative").print_stats(self.line_count_restriction)
            parts.append(f"Profile stats for: {action}\n{out.getvalue()}")
            if self.dump_stats and self.dirpath is not None and self.global_rank == 0:
                Path(self.dirpath).mkdir(parents=True, exist_ok=True)
                profile.dump_stats(str(Path(self.dirpath) / f"{_safe(action)}.prof"))
        return "\n".join(parts)


def _safe(action: str) -> str:
    """An action name as a file name (``[Callback]Timer.on_train_end`` has brackets)."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in action)
