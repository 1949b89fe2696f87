"""When ``ModelCheckpoint`` saves: every n steps, after a time, at epochs' ends, after validation passes.

A save never happens inside an accumulation window (its gradients are not applied yet, so a resume
from that checkpoint would lose them): a save that comes due there is made at the window's end. The
schedule's bookkeeping (the step of the last save, the time since the last timed save) is part of
the callback's checkpoint state, so a resumed run neither saves again at once nor skips a save.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from callbacks.base import Checkpoint

if TYPE_CHECKING:
    from callbacks._monitor import Monitor
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["SaveSchedule"]


class SaveSchedule(Checkpoint):
    """The hooks that decide when :class:`~callbacks.ModelCheckpoint` saves (its base class)."""

    every_n_train_steps: int
    every_n_epochs: int
    train_time_interval: timedelta | None
    save_on_train_epoch_end: bool | None
    monitor: str | None
    _monitor: Monitor | None
    _last_saved_step: int = -1
    _last_time: float | None = None
    _clock: Callable[[], float] = time.monotonic  # tests swap in a fake clock
    #: A save came due inside an accumulation window: made at the window's end.
    _deferred: bool = False
    #: A step or time save came due before the monitored value was fresh: made at validation's end.
    _until_validation: bool = False
    #: A validation pass or an epoch's end changed the run's state after the last save.
    _stale: bool = False
    #: Seconds on the ``train_time_interval`` clock restored from a checkpoint (None: none).
    _restored_elapsed: float | None = None
    _save: Callable[[Trainer], object]

    @override
    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        # A resumed run goes on with the interval where the checkpoint left it.
        self._last_time = self._clock() - (self._restored_elapsed or 0.0)
        self._restored_elapsed = None

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if trainer.sanity_checking or trainer.stage != "fit":
            return
        if self._monitor is not None:
            self._monitor.validated = True
        self._stale = True
        # A step or time save that waited for this pass's metrics (Lightning 2.6), or an epoch save after
        # every validation pass (also one in the middle of an epoch).
        waited, self._until_validation = self._until_validation, False
        if waited or (self._saves_after_validation(trainer) and self._epoch_due(trainer)):
            self._save(trainer)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not (self._deferred or self.every_n_train_steps or self.train_time_interval is not None):
            return  # nothing falls due by step or time (the default): the per-step cost is this test
        # Saves come due at a window's end only: inside it, the gradients are not applied yet.
        if trainer.checkpointing.in_accumulation_window:
            return
        if self._deferred:
            self._save(trainer)
            return
        if trainer.global_step == self._last_saved_step:
            return
        n = self.every_n_train_steps
        due = bool(n) and trainer.global_step % n == 0
        if not due and self.train_time_interval is not None and self._last_time is not None:
            # Rank 0's clock decides for every rank (one small broadcast per batch, only with this option).
            due = trainer.strategy.broadcast(
                self._clock() - self._last_time >= self.train_time_interval.total_seconds(), 0
            )
            if due:
                self._last_time = self._clock()
        if due and self._awaits_validation(trainer):
            self._until_validation = True  # saved at the next validation's end, with its metrics
        elif due:
            self._save(trainer)

    def _awaits_validation(self, trainer: Trainer) -> bool:
        """Lightning 2.6's rule: a due save waits for validation when the monitored value is not logged
        yet, or when validation (not the epoch's end) saves and runs right after this, the epoch's last batch."""
        if self._monitor is None or self.monitor is None:
            return False
        if self.monitor not in trainer.callback_metrics:
            return True
        if not trainer.is_last_batch or not self._saves_after_validation(trainer) or not trainer.enable_validation:
            return False
        every = trainer.check_val_every_n_epoch
        return sum(trainer.num_val_batches) > 0 and (every is None or (trainer.current_epoch + 1) % every == 0)

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._stale = True
        if not self._saves_after_validation(trainer) and self._epoch_due(trainer):
            self._save(trainer)

    def _saves_after_validation(self, trainer: Trainer) -> bool:
        """Whether epoch saves follow each validation pass rather than each training epoch's end.

        ``save_on_train_epoch_end=None``: Lightning's rule (the argument's doc), so each save holds that
        pass's metrics. Without validation data, at each training epoch's end (Lightning then saves
        nothing when ``check_val_every_n_epoch`` is above 1).
        """
        if self.save_on_train_epoch_end is not None:
            return not self.save_on_train_epoch_end
        batches = trainer.num_val_batches  # [] until the first validation requests its loaders
        if not trainer.enable_validation or (batches and not sum(batches)):
            return False
        return trainer.check_val_every_n_epoch != 1 or trainer.val_check_interval not in (None, 1.0)

    def _epoch_due(self, trainer: Trainer) -> bool:
        n = self.every_n_epochs
        return bool(n) and (trainer.current_epoch + 1) % n == 0 and trainer.global_step != self._last_saved_step

    def schedule_state(self) -> dict[str, Any]:
        """The schedule's bookkeeping, for the callback's checkpoint state."""
        return {
            "last_saved_step": self._last_saved_step,
            "until_validation": self._until_validation,
            "train_time_elapsed": (
                None if self._last_time is None or self.train_time_interval is None else self._clock() - self._last_time
            ),
        }

    def load_schedule_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`schedule_state` (older checkpoints without it leave the defaults)."""
        self._last_saved_step = int(state.get("last_saved_step", self._last_saved_step))
        self._until_validation = bool(state.get("until_validation", False))
        self._restored_elapsed = state.get("train_time_elapsed")
