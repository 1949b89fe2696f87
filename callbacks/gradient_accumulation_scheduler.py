"""``GradientAccumulationScheduler``: the number of batches accumulated per optimizer step, by epoch.

Lightning 2.6's callback: ``scheduling`` maps a (zero-based) epoch to the accumulation factor from
that epoch on. At each epoch's start it sets ``trainer.accumulate_grad_batches``, which the training
step reads once per epoch (it binds its seams then), so it costs nothing per step.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from callbacks.base import Callback, user_defines
from trainer.common.errors import UserError

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["GradientAccumulationScheduler"]


class GradientAccumulationScheduler(Callback):
    """Change ``accumulate_grad_batches`` at given epochs.

    Args:
        scheduling: ``{epoch: factor}``, epochs counted from 0; before the first epoch named the
            factor is 1.

    Raises:
        TypeError: ``scheduling`` is empty.
        ValueError: an epoch is not an int >= 0 or a factor not an int >= 1.

    Example:
        >>> schedule = GradientAccumulationScheduler({2: 4, 5: 8})
        >>> [schedule.get_accumulate_grad_batches(e) for e in range(7)]
        [1, 1, 4, 4, 4, 8, 8]
    """

    def __init__(self, scheduling: dict[int, int]) -> None:
        super().__init__()
        if not scheduling:
            raise TypeError("GradientAccumulationScheduler(scheduling={}): give at least one {epoch: factor}")
        if any(not isinstance(k, int) or isinstance(k, bool) or k < 0 for k in scheduling):
            raise UserError(
                f"Epoch should be an int greater than or equal to 0. Got {list(scheduling)}: "
                "GradientAccumulationScheduler counts epochs from 0"
            )
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in scheduling.values()):
            raise UserError(
                f"Accumulation factor should be an int greater than 0. Got {list(scheduling.values())}: "
                "give GradientAccumulationScheduler the number of batches per optimizer step (1: no accumulation)"
            )
        if min(scheduling) != 0:
            scheduling.update({0: 1})  # as Lightning: the caller's dict gains the implicit first entry
        self.scheduling = scheduling
        self.epochs = sorted(scheduling)

    def going_to_accumulate_grad_batches(self) -> bool:
        """Whether any epoch accumulates more than one batch."""
        return any(v > 1 for v in self.scheduling.values())

    def get_accumulate_grad_batches(self, epoch: int) -> int:
        """The factor for ``epoch``: that of the last scheduled epoch at or before it."""
        factor = 1
        for start in reversed(self.epochs):
            if epoch >= start:
                factor = self.scheduling[start]
                break
        return factor

    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Refuse what Lightning refuses: manual optimisation, and ``Trainer(accumulate_grad_batches != 1)``."""
        if not pl_module.automatic_optimization:
            raise RuntimeError(
                "Automatic gradient accumulation and the `GradientAccumulationScheduler` is not supported for "
                "manual optimization. Please remove the callback or switch to automatic optimization (with "
                "automatic_optimization = False, accumulate in training_step: step the optimizer every k batches)."
            )
        if trainer.accumulate_grad_batches != 1:
            raise ValueError(
                "You have set `accumulate_grad_batches` and are using the `GradientAccumulationScheduler` callback. "
                "Either remove `accumulate_grad_batches` from the Trainer or remove the callback "
                f"(Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}): both set the accumulation)."
            )
        if self.going_to_accumulate_grad_batches() and (
            user_defines(pl_module, "optimizer_step") or user_defines(pl_module, "optimizer_zero_grad")
        ):
            warnings.warn(
                "When using `Trainer(accumulate_grad_batches != 1)` and overriding "
                "`LightningModule.optimizer_{step,zero_grad}`, the hooks will not be called on every batch "
                "(rather, they are called on every optimization step).",
                UserWarning,
                stacklevel=2,
            )

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Set this epoch's factor (the step reads it when it binds its seams, right after this hook)."""
        trainer.accumulate_grad_batches = self.get_accumulate_grad_batches(trainer.current_epoch)
