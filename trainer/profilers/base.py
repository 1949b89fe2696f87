"""The profiler interface (Lightning's ``Profiler``) and how the loops wrap a seam in an action.

A profiler times *actions*: named stretches of a run (``training_step``, ``backward``, one hook of one
callback). The loops bind their seams once per epoch; :func:`profiled` returns a seam unchanged when
the trainer has no profiler (``Trainer(profiler=None)`` holds a :class:`PassThroughProfiler`), so a
run without one calls exactly the functions it called before profilers existed, and pays nothing.
"""

from __future__ import annotations

import functools
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Generator, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "PassThroughProfiler",
    "Profiler",
    "eval_fetch_action",
    "is_active",
    "profiled",
    "profiled_iter",
    "strategy_action",
]

F = TypeVar("F")

#: Where reports go, at INFO (Lightning's profilers log theirs): a user's logging configuration decides
#: how they show. With no handler configured anywhere they are printed instead, as Lightning then
#: gives its own logger a console handler.
log = logging.getLogger("trainer.profilers")
if log.level == logging.NOTSET:
    log.setLevel(logging.INFO)


class Profiler(ABC):
    """Times named actions of a run; subclass it for a profiler of your own (Lightning's ``Profiler``).

    Args:
        dirpath: where :meth:`describe` writes its report (and the PyTorch profiler its traces);
            ``None``: the trainer's ``log_dir``, set at :meth:`setup`.
        filename: the report's file name without extension; ``None``: the report is only shown
            (logged, or printed) (the trainer's profilers default it, see :func:`~trainer.profilers.resolve_profiler`).
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None) -> None:
        self.dirpath = dirpath
        self.filename = filename
        #: The process's global rank (set by the trainer at :meth:`setup`): only rank 0 prints and writes reports.
        self.global_rank = int(os.environ.get("RANK", "0"))
        self._stage: str | None = None
        #: Whether a Trainer runs this profiler (its stages set it up); False for one used on its own.
        self.in_trainer = False
        self._local_rank: int | None = None
        #: The module of the trainer's stage (set by the trainer for the stage, as Lightning's; None after it).
        self._lightning_module: Any = None

    @abstractmethod
    def start(self, action_name: str) -> None:
        """Start timing ``action_name``."""

    @abstractmethod
    def stop(self, action_name: str) -> None:
        """Stop timing ``action_name`` (the last one started: actions nest)."""

    def summary(self) -> str:
        """The report: what :meth:`describe` shows and writes."""
        return ""

    @contextmanager
    def profile(self, action_name: str) -> Generator[str, None, None]:
        """``with profiler.profile("load"):`` times the block as the action ``action_name``."""
        try:
            self.start(action_name)
            yield action_name
        finally:
            self.stop(action_name)

    def describe(self) -> None:
        """Show the report on rank 0 and write it to ``dirpath/<stage>-<filename>.txt`` (once per stage).

        Shown as an INFO record of the ``trainer.profilers`` logger, as Lightning logs it; printed where
        no logging handler is configured (Lightning's console handler in that case).
        """
        text = self.summary()
        if not text:
            return
        if self.global_rank == 0:
            if log.hasHandlers():
                log.info(text)
            else:
                print(text)
            path = self.report_path()
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text + "\n")

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | Path | None = None) -> None:
        """Called by the trainer in every process before a stage runs; ``log_dir`` fills an unset ``dirpath``."""
        self._stage, self._local_rank = stage, local_rank
        self.dirpath = self.dirpath if self.dirpath is not None else log_dir

    def teardown(self, stage: str | None) -> None:
        """Called by the trainer after a stage, also after an exception (after :meth:`describe`)."""
        self._stage = None
        self._lightning_module = None  # a profiled module holds wrappers that do not pickle

    @property
    def local_rank(self) -> int:
        """The process's local rank (0 before :meth:`setup`)."""
        return 0 if self._local_rank is None else self._local_rank

    def report_path(self) -> Path | None:
        """Where :meth:`describe` writes the report: ``dirpath/<stage>-<filename>.txt`` (None: only printed)."""
        if self.filename is None or self.dirpath is None:
            return None
        prefix = f"{self._stage}-" if self._stage else ""
        return Path(self.dirpath) / f"{prefix}{self.filename}.txt"


class PassThroughProfiler(Profiler):
    """The profiler of ``Trainer(profiler=None)``: times nothing, and the loops do not even call it."""

    def start(self, action_name: str) -> None:
        """Do nothing."""

    def stop(self, action_name: str) -> None:
        """Do nothing."""


def is_active(profiler: Profiler | None) -> bool:
    """Whether ``profiler`` times anything (a seam must be wrapped for it)."""
    return profiler is not None and not isinstance(profiler, PassThroughProfiler)


def profiled(profiler: Profiler | None, action: str, fn: F) -> F:
    """``fn`` timed as ``action`` by ``profiler``; ``fn`` itself (the same object) when nothing profiles.

    Bound once per epoch, not per call: with no profiler the loop keeps the very function it had.
    """
    if fn is None or not is_active(profiler):
        return fn
    assert profiler is not None and callable(fn)
    start, stop, call = profiler.start, profiler.stop, fn

    @functools.wraps(call)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start(action)
        try:
            return call(*args, **kwargs)
        finally:
            stop(action)

    return timed  # type: ignore[return-value]


def profiled_iter(profiler: Profiler | None, action: str, items: Iterable[Any]) -> Iterable[Any]:
    """``items`` with each ``next`` timed as ``action`` (data fetch); ``items`` itself when nothing profiles.

    The items are the loops' ``(batch_idx, batch, is_last)``: after the last batch the call that finds
    the loader exhausted is not timed, so there is one action per batch, as in Lightning's reports.
    """
    if not is_active(profiler):
        return items
    assert profiler is not None
    return _timed_iter(profiler, action, iter(items))


def _timed_iter(profiler: Profiler, action: str, it: Iterator[Any]) -> Iterator[Any]:
    while True:
        profiler.start(action)
        try:
            item = next(it)
        except StopIteration:
            return
        finally:
            profiler.stop(action)
        yield item
        if isinstance(item, tuple) and len(item) == 3 and item[2] is True:
            yield from it  # after the last batch: nothing more (a loader that miscounted goes on untimed)
            return


def eval_fetch_action(prefix: str) -> str:
    """Lightning's action name for fetching a ``"validation"``/``"test"`` batch: ``[_EvaluationLoop].val_next``."""
    return f"[_EvaluationLoop].{'val' if prefix == 'validation' else prefix}_next"


def strategy_action(strategy: object, name: str) -> str:
    """The action name of a step seam the strategy runs, as Lightning names it: ``[Strategy]DDPStrategy.training_step``."""
    return f"[Strategy]{type(strategy).__name__}.{name}"
