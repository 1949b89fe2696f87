"""Strategies: device placement, gradient sync, precision and process launch.

Classes are imported on first use, so ``import strategies`` does not pay for torch.distributed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from strategies.base import Strategy
from strategies.precision import Precision
from strategies.single import SingleDeviceStrategy

if TYPE_CHECKING:
    from strategies.amp import AMPStrategy
    from strategies.ddp import DDPStrategy
    from strategies.dp import DataParallelStrategy
    from strategies.fsdp import FSDPStrategy
    from strategies.model_parallel import ModelParallelStrategy

__all__ = [
    "AMPStrategy",
    "DDPStrategy",
    "DataParallelStrategy",
    "FSDPStrategy",
    "ModelParallelStrategy",
    "Precision",
    "SingleDeviceStrategy",
    "Strategy",
]

_LAZY = {
    "AMPStrategy": "strategies.amp",
    "DDPStrategy": "strategies.ddp",
    "DataParallelStrategy": "strategies.dp",
    "FSDPStrategy": "strategies.fsdp",
    "ModelParallelStrategy": "strategies.model_parallel",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'strategies' has no attribute {name!r}")
