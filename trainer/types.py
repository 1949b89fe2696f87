"""Type aliases for annotating modules and data modules (Lightning's ``lightning.pytorch.utilities.types``).

>>> from trainer.types import STEP_OUTPUT, OptimizerLRScheduler
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias, TypedDict

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from trainer.optim import SchedulerConfig

__all__ = [
    "EVAL_DATALOADERS",
    "STEP_OUTPUT",
    "TRAIN_DATALOADERS",
    "LRSchedulerConfig",
    "LRSchedulerConfigType",
    "LRSchedulerPLType",
    "LRSchedulerTypeUnion",
    "OptimizerConfig",
    "OptimizerLRScheduler",
    "OptimizerLRSchedulerConfig",
]

#: What a ``*_step`` may return: a loss, a dict holding ``"loss"`` (and more), or None.
STEP_OUTPUT: TypeAlias = torch.Tensor | Mapping[str, Any] | None
#: What ``train_dataloader`` may return: a loader, or a list/dict of them.
TRAIN_DATALOADERS: TypeAlias = Any
#: What ``val_dataloader``/``test_dataloader``/``predict_dataloader`` may return.
EVAL_DATALOADERS: TypeAlias = Any
#: A learning-rate scheduler ``configure_optimizers`` may return.
LRSchedulerTypeUnion: TypeAlias = LRScheduler | ReduceLROnPlateau
LRSchedulerPLType: TypeAlias = LRSchedulerTypeUnion
#: The trainer's parsed form of a scheduler entry (``trainer.lr_scheduler_configs``).
LRSchedulerConfig = SchedulerConfig


class LRSchedulerConfigType(TypedDict, total=False):
    """The ``"lr_scheduler"`` dict of ``configure_optimizers`` (only ``scheduler`` is required)."""

    scheduler: Any
    name: str | None
    interval: str
    frequency: int
    monitor: str | None
    strict: bool


class OptimizerConfig(TypedDict):
    """``{"optimizer": ...}`` as ``configure_optimizers`` may return it."""

    optimizer: Optimizer


class OptimizerLRSchedulerConfig(TypedDict, total=False):
    """``{"optimizer": ..., "lr_scheduler": ..., "monitor": ...}`` as ``configure_optimizers`` may return it."""

    optimizer: Optimizer
    lr_scheduler: LRSchedulerTypeUnion | LRSchedulerConfigType
    monitor: str


#: Every shape ``configure_optimizers`` may return.
OptimizerLRScheduler: TypeAlias = (
    Optimizer
    | Sequence[Optimizer]
    | tuple[Sequence[Optimizer], Sequence[LRSchedulerTypeUnion | LRSchedulerConfigType]]
    | OptimizerConfig
    | OptimizerLRSchedulerConfig
    | Sequence[OptimizerConfig]
    | Sequence[OptimizerLRSchedulerConfig]
    | None
)
