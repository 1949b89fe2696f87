"""``EarlyStopping``: end training when a monitored metric stops improving (or goes bad)."""

from __future__ import annotations

import math
import sys
from enum import Enum
from typing import TYPE_CHECKING, Any, TextIO

import torch
from typing_extensions import override

from callbacks._monitor import Monitor
from callbacks.base import Callback
from trainer.common.errors import UserError

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["EarlyStopping", "EarlyStoppingReason"]


class EarlyStoppingReason(Enum):
    """Why :class:`EarlyStopping` stopped training (Lightning's enum, values included)."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class EarlyStopping(Callback):
    """Stop training when ``monitor`` has not improved for ``patience`` checks.

    The check runs at the end of every training epoch (after that epoch's validation), on epochs in
    which the monitored value was updated; with ``check_val_every_n_epoch=2`` patience therefore
    counts validation runs, not epochs.

    Under several processes every rank decides on rank 0's value (broadcast), and the decision is
    combined with a max-reduction, so all ranks stop after the same step even if their local
    metrics differ. That costs two small collectives per check.

    Args:
        monitor: the metric to watch (a key of ``trainer.callback_metrics``).
        min_delta: an improvement must beat the best value by more than this.
        patience: checks without improvement before stopping.
        verbose: print why training stopped.
        mode: ``"min"`` or ``"max"``: which direction is better.
        strict: a ``monitor`` still missing after a validation pass raises
            :class:`~trainer.errors.MetricNotLoggedError` naming the metrics that were logged
            (Lightning's default). ``False`` says so once and stands aside: training runs to its end
            as if there were no early stopping. The ``geartrain`` default callbacks use ``False``,
            so a project that logs other metrics than the default job still trains.
        check_finite: stop as soon as the value is NaN or infinite.
        stopping_threshold: stop once the value is better than this (the goal is reached).
        divergence_threshold: stop once the value is worse than this (no point going on).
        check_on_train_epoch_end: ``False`` checks after every validation pass (also mid-epoch,
            with ``val_check_interval``); ``True`` at each training epoch's end, on epochs whose
            value was updated. ``None`` (Lightning's rule): at the epoch's end when validation runs
            once every epoch (``val_check_interval=1.0``, ``check_val_every_n_epoch=1``), else after
            every validation pass.
        log_rank_zero_only: print on rank 0 only; otherwise every rank prints, prefixed ``[rank: N]``.
        stream: where to print (default: standard output); giving one turns printing on.

    Example:
        >>> es = EarlyStopping(monitor="val/loss", patience=2)
        >>> [es.update(v)[0] for v in (1.0, 0.9, 0.95, 0.92)]
        [False, False, False, True]
    """

    def __init__(
        self,
        monitor: str = "val/loss",
        min_delta: float = 0.0,
        patience: int = 3,
        verbose: bool = False,
        mode: str = "min",
        strict: bool = True,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        check_on_train_epoch_end: bool | None = None,
        log_rank_zero_only: bool = False,
        stream: TextIO | None = None,
    ) -> None:
        if mode not in ("min", "max"):
            raise UserError(f"EarlyStopping: `mode` can be min, max, got {mode}")
        if patience < 0:
            raise ValueError(f"patience must be >= 0, got {patience}")
        if min_delta < 0:
            raise ValueError(f"min_delta must be >= 0 (it is a distance), got {min_delta}")
        self.monitor = monitor
        self.mode = mode
        self.patience = patience
        self.min_delta = min_delta
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        # Giving a stream asks for the messages, so it turns them on.
        self.verbose = verbose or stream is not None
        self.stream = stream
        self.strict = strict
        self.check_on_train_epoch_end = check_on_train_epoch_end
        #: Whether to check after every validation pass rather than at epoch ends (resolved in setup).
        self._after_validation = check_on_train_epoch_end is False
        self.log_rank_zero_only = log_rank_zero_only
        self.wait_count = 0
        self.best_score = math.inf if mode == "min" else -math.inf
        #: Epoch in which training was stopped (0 while it was not, as Lightning's; ``stopping_reason`` tells them apart).
        self.stopped_epoch = 0
        #: Why this process asked to stop (``NOT_STOPPED`` while it did not, also when another rank did).
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        #: The sentence saying why training stopped; ``None`` while it did not.
        self.stopping_reason_message: str | None = None
        self._reason = EarlyStoppingReason.NOT_STOPPED  # of the last update() that asked to stop
        self._monitor = Monitor(
            self,
            monitor,
            on_missing="raise" if strict else "warn",
            consequence="with strict=False early stopping stands aside and training runs to its end",
        )

    @property
    @override
    def state_key(self) -> str:
        """Lightning's key (class name and the options that tell two apart), so its files resume here and ours there."""
        return f"{type(self).__qualname__}{ {'monitor': self.monitor, 'mode': self.mode}!r}"

    @property
    def earlier_state_keys(self) -> tuple[str, ...]:
        """The key geartrain's checkpoints used before Lightning's: their patience and best score still resume."""
        return (f"EarlyStopping[monitor={self.monitor},mode={self.mode}]",)

    def _better(self, value: float, than: float) -> bool:
        return value < than if self.mode == "min" else value > than

    def update(self, value: float) -> tuple[bool, str]:
        """Take one new value; return whether to stop and why. Updates the patience state."""
        if self.check_finite and not math.isfinite(value):
            self._reason = EarlyStoppingReason.NON_FINITE_METRIC
            return True, f"{self.monitor} = {value} is not finite"
        if self.stopping_threshold is not None and self._better(value, self.stopping_threshold):
            self._reason = EarlyStoppingReason.STOPPING_THRESHOLD
            return True, (
                f"Stopping threshold reached: {self.monitor} = {value:.6g} reached the stopping threshold "
                f"{self.stopping_threshold}"
            )
        if self.divergence_threshold is not None and self._better(self.divergence_threshold, value):
            self._reason = EarlyStoppingReason.DIVERGENCE_THRESHOLD
            return (
                True,
                f"Divergence threshold reached: {self.monitor} = {value:.6g} is worse than the divergence threshold "
                f"{self.divergence_threshold}",
            )
        delta = -self.min_delta if self.mode == "min" else self.min_delta
        if self._better(value, self.best_score + delta):
            self.best_score = value
            self.wait_count = 0
            return False, ""
        self.wait_count += 1
        if self.wait_count >= self.patience:
            self._reason = EarlyStoppingReason.PATIENCE_EXHAUSTED
            return True, (
                f"{self.monitor} did not improve by more than {self.min_delta} for {self.wait_count} "
                f"checks; best {self.best_score:.6g}"
            )
        return False, ""

    @override
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        once_an_epoch = trainer.val_check_interval == 1.0 and trainer.check_val_every_n_epoch == 1
        self._after_validation = self.check_on_train_epoch_end is False or (
            self.check_on_train_epoch_end is None and not once_an_epoch
        )

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not trainer.sanity_checking and trainer.stage == "fit":
            self._monitor.validated = True
            if self._after_validation:
                self._run_early_stopping_check(trainer)

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not self._after_validation:
            self._run_early_stopping_check(trainer)

    def _run_early_stopping_check(self, trainer: Trainer) -> None:
        """Judge the monitored value and stop every rank when one must stop (Lightning's name for this step)."""
        if trainer.fast_dev_run:  # as Lightning: kept in the callbacks, never stops the run
            return
        local = self._monitor.read(trainer)  # strict: raises for a missing metric; else says so once
        if local is None:
            return
        strategy = trainer.strategy
        # Every rank judges rank 0's value, so the patience state is the same everywhere...
        value = float(strategy.broadcast(float(local), 0))
        stop, reason = self.update(value)
        # ... and any rank wanting to stop stops them all, in the same epoch.
        vote = torch.tensor(1.0 if stop else 0.0, device=strategy.root_device)
        if float(strategy.reduce(vote, "max")) > 0:
            trainer.should_stop = True
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason = self._reason if stop else EarlyStoppingReason.NOT_STOPPED
            self.stopping_reason_message = reason or "another process decided to stop"
            if self.verbose and (trainer.is_global_zero or not self.log_rank_zero_only):
                out = self.stream if self.stream is not None else sys.stdout
                rank = (
                    f"[rank: {trainer.global_rank}] " if trainer.world_size > 1 and not self.log_rank_zero_only else ""
                )
                print(
                    f"{rank}EarlyStopping: stopping after epoch {trainer.current_epoch}: {self.stopping_reason_message}",
                    file=out,
                )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "wait_count": self.wait_count,
            # A 0-d tensor, as Lightning stores it (its resume calls best_score.to(device)); float64 keeps
            # our float exactly, so a resumed run compares as the uninterrupted one.
            "best_score": torch.tensor(self.best_score, dtype=torch.float64),
            "stopped_epoch": self.stopped_epoch,
            "patience": self.patience,
            "stopping_reason": self.stopping_reason.value,
            "stopping_reason_message": self.stopping_reason_message,
        }

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.wait_count = int(state.get("wait_count", 0))
        self.best_score = float(state.get("best_score", self.best_score))
        self.stopped_epoch = int(state.get("stopped_epoch", 0))
        self.stopping_reason = EarlyStoppingReason(state.get("stopping_reason", 0))
        self.stopping_reason_message = state.get("stopping_reason_message")
