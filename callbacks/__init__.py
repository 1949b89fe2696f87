"""Callbacks: checkpointing, logging (TensorBoard, CSV), progress, early stopping, ...

Classes are imported on first use, so ``import callbacks`` does not import TensorBoard or rich.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback

if TYPE_CHECKING:
    from callbacks.checkpoint import ModelCheckpoint
    from callbacks.csv_logger import CSVLogger
    from callbacks.early_stopping import EarlyStopping
    from callbacks.lr_monitor import LearningRateMonitor
    from callbacks.model_summary import ModelSummary
    from callbacks.progress import ProgressBar
    from callbacks.tensorboard import TensorBoardLogger
    from callbacks.throughput import ThroughputMonitor
    from callbacks.timer import Timer

__all__ = [
    "CSVLogger",
    "Callback",
    "DeviceStatsMonitor",
    "EarlyStopping",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelSummary",
    "ProgressBar",
    "TensorBoardLogger",
    "ThroughputMonitor",
    "Timer",
]

_LAZY = {
    "CSVLogger": "callbacks.csv_logger",
    "DeviceStatsMonitor": "callbacks.device_stats",
    "EarlyStopping": "callbacks.early_stopping",
    "LearningRateMonitor": "callbacks.lr_monitor",
    "ModelCheckpoint": "callbacks.checkpoint",
    "ModelSummary": "callbacks.model_summary",
    "ProgressBar": "callbacks.progress",
    "TensorBoardLogger": "callbacks.tensorboard",
    "ThroughputMonitor": "callbacks.throughput",
    "Timer": "callbacks.timer",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'callbacks' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
