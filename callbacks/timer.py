"""``Timer``: stop training cleanly once a time budget is spent."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from callbacks.base import Callback
from trainer.common.errors import UserError

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["Timer"]

log = logging.getLogger("trainer")


def parse_duration(value: str | float | timedelta | dict[str, float]) -> timedelta:
    """``"DD:HH:MM:SS"``, seconds, a ``timedelta`` or ``timedelta`` keywords to a ``timedelta``.

    >>> parse_duration("00:01:30:00")
    datetime.timedelta(seconds=5400)
    >>> parse_duration({"minutes": 2})
    datetime.timedelta(seconds=120)
    """
    if isinstance(value, timedelta):
        return value
    if isinstance(value, dict):
        return timedelta(**value)
    if isinstance(value, str):
        parts = value.strip().split(":")
        try:
            days, hours, minutes, seconds = (float(p) for p in parts)
        except ValueError:
            raise UserError(
                f"`Timer(duration={value!r})` is not a valid duration. Expected a string in the format "
                "DD:HH:MM:SS (days, hours, minutes, seconds: '00:12:00:00' is 12 hours)"
            ) from None
        return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    return timedelta(seconds=float(value))


class Timer(Callback):
    """End training when ``max_time`` of training has passed, after the step (or epoch) in progress.

    The check sets ``trainer.should_stop``, so the loop ends the way it does after ``max_steps``:
    ``on_train_end``/``on_fit_end`` run and the final ``last.ckpt`` is written. Time already spent
    is stored in checkpoints, so a resumed run gets only what is left. Rank 0's clock decides for
    every rank (a broadcast per check; ``interval="epoch"`` makes that once per epoch).

    Args:
        duration: ``"DD:HH:MM:SS"``, seconds, a ``timedelta`` or a dict of its keywords;
            ``None`` only measures (see :meth:`time_elapsed`).
        interval: check after every ``"step"`` (batch) or only at each ``"epoch"`` end.
        verbose: print when the budget ends training (rank 0).
        clock: seconds as a float; a fake one makes tests exact.
        max_time: another name for ``duration`` (the ``Trainer`` option's name).
    """

    def __init__(
        self,
        duration: str | float | timedelta | dict[str, float] | None = None,
        interval: str = "step",
        verbose: bool = True,
        clock: Callable[[], float] | None = None,
        max_time: str | float | timedelta | dict[str, float] | None = None,
    ) -> None:
        interval = getattr(interval, "value", interval)  # Lightning's Interval enum
        if interval not in ("step", "epoch"):
            raise UserError(
                f"Unsupported parameter value `Timer(interval={interval})`. Possible choices are: step, epoch"
            )
        if duration is not None and max_time is not None:
            raise ValueError("Timer: give duration or max_time (two names for one budget), not both")
        budget = duration if duration is not None else max_time
        self.max_time = parse_duration(budget) if budget is not None else None
        self.interval = interval
        self.verbose = verbose
        self._clock = clock
        self._offset = 0.0  # seconds spent before a resume
        self._start: float | None = None
        self._end: float | None = None
        self._spans: dict[str, list[float | None]] = {}  # stage -> [start, end] of its latest run

    def time_elapsed(self, stage: str = "train") -> float:
        """Seconds spent in ``stage`` (``"train"``, ``"validate"``, ``"test"``, ``"predict"``).

        Training time includes what was spent before a resume; the other stages count their latest run.
        """
        if stage == "train":
            if self._start is None:
                return self._offset
            return self._offset + (self._end if self._end is not None else self.clock()) - self._start
        start, end = self._spans.get(stage, [None, None])
        if start is None:
            return 0.0
        return (end if end is not None else self.clock()) - start

    def time_remaining(self, stage: str = "train") -> float | None:
        """Seconds of the budget left (``None`` without a budget)."""
        if self.max_time is None:
            return None
        return self.max_time.total_seconds() - self.time_elapsed(stage)

    def start_time(self, stage: str = "train") -> float | None:
        """When ``stage`` last started, on :attr:`clock`'s scale."""
        return self._spans.get(stage, [None, None])[0]

    def end_time(self, stage: str = "train") -> float | None:
        """When ``stage`` last ended, on :attr:`clock`'s scale (``None`` while it runs)."""
        return self._spans.get(stage, [None, None])[1]

    def clock(self) -> float:
        """Now, in seconds: the ``clock`` given, else ``time.monotonic()`` (looked up at each call)."""
        return self._clock() if self._clock is not None else time.monotonic()

    def _begin(self, stage: str) -> None:
        self._spans[stage] = [self.clock(), None]

    def _finish(self, stage: str) -> None:
        self._spans.setdefault(stage, [None, None])[1] = self.clock()

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        # After a resume the budget may already be spent: stop before the first step, as Lightning.
        self._check(trainer)

    @override
    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._start is not None and self._end is not None:  # a second fit: its time adds to the first's
            self._offset += self._end - self._start
        self._start, self._end = self.clock(), None
        self._begin("train")

    @override
    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._end = self.clock()
        self._finish("train")

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._begin("validate")

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._finish("validate")

    @override
    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._begin("test")

    @override
    def on_test_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._finish("test")

    @override
    def on_predict_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._begin("predict")

    @override
    def on_predict_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._finish("predict")

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.interval == "step":
            self._check(trainer)

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._check(trainer)

    def _check(self, trainer: Trainer) -> None:
        if self.max_time is None or trainer.should_stop:
            return
        over = self.time_elapsed() >= self.max_time.total_seconds()
        if trainer.strategy.broadcast(over, 0):
            trainer.should_stop = True
            if self.verbose and trainer.is_global_zero:
                elapsed = timedelta(seconds=int(self.time_elapsed()))
                log.info(
                    f"Time limit reached. Elapsed time is {elapsed}. Signaling Trainer to stop. "
                    f"(max_time {self.max_time}, after step {trainer.global_step})"
                )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": self.time_elapsed()}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        elapsed = state.get("time_elapsed", 0.0)
        if isinstance(elapsed, dict):  # Lightning's file: seconds per stage
            elapsed = elapsed.get("train", 0.0)
        self._offset = float(elapsed)
        self._start = self._end = None
