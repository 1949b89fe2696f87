"""``LearningRateMonitor``: log every optimizer's learning rates to the loggers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from callbacks.base import Callback

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["LearningRateMonitor"]


class LearningRateMonitor(Callback):
    """Send the learning rate of every parameter group to the loggers as ``lr-<Optimizer>``.

    Several optimizers of one class are numbered (``lr-SGD-1``); parameter groups beyond the first
    get ``/pg<i>`` (``lr-AdamW/pg1``).

    Args:
        logging_interval: ``"step"`` logs the rate each optimizer step uses, at the steps where the
            trainer logs (every ``log_every_n_steps``); ``"epoch"`` logs the rate an epoch starts
            with, at that epoch's first step; ``None`` picks ``"step"`` if a scheduler steps per
            step, else ``"epoch"``.
    """

    def __init__(self, logging_interval: str | None = None) -> None:
        if logging_interval not in (None, "step", "epoch"):
            raise ValueError(f"logging_interval must be 'step', 'epoch' or None, got {logging_interval!r}")
        self.logging_interval = logging_interval

    def _interval(self, trainer: Trainer) -> str:
        if self.logging_interval is not None:
            return self.logging_interval
        per_step = any(cfg.interval == "step" for cfg in trainer.lr_scheduler_configs)
        return "step" if per_step else "epoch"

    def learning_rates(self, trainer: Trainer) -> dict[str, float]:
        """The current learning rate of every parameter group, keyed as they are logged."""
        out: dict[str, float] = {}
        seen: dict[str, int] = {}
        for optimizer in trainer.optimizers:
            name = f"lr-{type(optimizer).__name__}"
            count = seen.get(name, 0)
            seen[name] = count + 1
            if count:
                name = f"{name}-{count}"
            for i, group in enumerate(optimizer.param_groups):
                lr = group["lr"]
                out[name if i == 0 else f"{name}/pg{i}"] = float(lr.item() if isinstance(lr, torch.Tensor) else lr)
        return out

    @override
    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        if self._interval(trainer) == "epoch":
            trainer.log_metrics(self.learning_rates(trainer), step=trainer.global_step)

    @override
    def on_before_optimizer_step(self, trainer: Trainer, module: TrainModule, optimizer: torch.optim.Optimizer) -> None:
        # Same steps as the trainer's own step logging: the step with index i is logged when
        # (i + 1) is a multiple of log_every_n_steps.
        if self._interval(trainer) == "step" and (trainer.global_step + 1) % trainer.log_every_n_steps == 0:
            trainer.log_metrics(self.learning_rates(trainer), step=trainer.global_step)
