"""Profilers: where a run's time goes (Lightning's ``lightning.pytorch.profilers`` -> ``trainer.profilers``).

``Trainer(profiler=...)`` takes ``None`` (nothing is timed, nothing is wrapped), ``"simple"``,
``"advanced"``, ``"pytorch"`` or a :class:`Profiler` instance. See ``docs/profiling.md``.
"""

from __future__ import annotations

from typing import Any

from trainer.common.errors import UserError
from trainer.profilers.advanced import AdvancedProfiler
from trainer.profilers.base import PassThroughProfiler, Profiler, is_active, profiled, profiled_iter
from trainer.profilers.pytorch import PyTorchProfiler
from trainer.profilers.simple import SimpleProfiler

__all__ = [
    "AdvancedProfiler",
    "PassThroughProfiler",
    "Profiler",
    "PyTorchProfiler",
    "SimpleProfiler",
    "XLAProfiler",
    "is_active",
    "profiled",
    "profiled_iter",
    "resolve_profiler",
]

_BY_NAME: dict[str, type[Profiler]] = {
    "simple": SimpleProfiler,
    "advanced": AdvancedProfiler,
    "pytorch": PyTorchProfiler,
}


class XLAProfiler:
    """Lightning's TPU profiler: refused (geartrain does not run on TPUs/XLA)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "XLAProfiler is not supported: geartrain does not run on TPUs/XLA; use PyTorchProfiler on CPU or CUDA"
        )


def resolve_profiler(profiler: Profiler | str | None) -> Profiler:
    """``Trainer(profiler=...)`` as a :class:`Profiler` (Lightning's spellings).

    A profiler named by a string writes its report as ``<log_dir>/<stage>-profiler.txt``, as Lightning's
    ``filename="perf_logs"`` would, so the table outlives the console.

    >>> type(resolve_profiler("simple")).__name__, type(resolve_profiler(None)).__name__
    ('SimpleProfiler', 'PassThroughProfiler')
    """
    if profiler is None:
        return PassThroughProfiler()
    if isinstance(profiler, Profiler):
        profiler.in_trainer = True
        return profiler
    if isinstance(profiler, str) and profiler.lower() in _BY_NAME:
        made = _BY_NAME[profiler.lower()](filename="profiler")
        made.in_trainer = True
        return made
    if isinstance(profiler, str) and profiler.lower() == "xla":
        XLAProfiler()
    expected = f"Trainer(profiler={profiler!r}): expected None, one of {sorted(_BY_NAME)} or a trainer.profilers.Profiler instance"
    if isinstance(profiler, str):  # Lightning's words first
        raise UserError(
            "When passing string value for the `profiler` parameter of `Trainer`, it can only be one of "
            f"{sorted(_BY_NAME)}. {expected}"
        )
    raise UserError(expected)
