"""Callbacks: checkpointing, logging (TensorBoard, CSV, MLflow, W&B, Comet, Lightning's platform), progress, early stopping, ...

Every callback and logger name of Lightning 2 is importable from here (``lightning.pytorch.callbacks.X``
and ``lightning.pytorch.loggers.X`` -> ``callbacks.X``). Those geartrain does not have yet are
classes whose construction raises ``NotImplementedError`` naming what to use instead.

Classes are imported on first use, so ``import callbacks`` does not import TensorBoard, rich or any tracker's package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback, Checkpoint

if TYPE_CHECKING:
    from callbacks._logger import Logger
    from callbacks.batch_size_finder import BatchSizeFinder
    from callbacks.checkpoint import ModelCheckpoint
    from callbacks.comet_logger import CometLogger
    from callbacks.csv_logger import CSVLogger
    from callbacks.device_stats import DeviceStatsMonitor
    from callbacks.early_stopping import EarlyStopping
    from callbacks.finetuning import BackboneFinetuning, BaseFinetuning
    from callbacks.grad_monitor import GradientMonitor
    from callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler
    from callbacks.lambda_callback import LambdaCallback
    from callbacks.litlogger import LitLogger, NeptuneLogger
    from callbacks.lr_finder import LearningRateFinder
    from callbacks.lr_monitor import LearningRateMonitor
    from callbacks.mlflow_logger import MLFlowLogger
    from callbacks.model_summary import ModelSummary, RichModelSummary
    from callbacks.on_exception_checkpoint import OnExceptionCheckpoint
    from callbacks.prediction_writer import BasePredictionWriter, join_predictions
    from callbacks.progress import ProgressBar
    from callbacks.pruning import ModelPruning
    from callbacks.rich_progress import RichProgressBar
    from callbacks.spike import SpikeDetection
    from callbacks.stochastic_weight_avg import StochasticWeightAveraging
    from callbacks.tensorboard import TensorBoardLogger
    from callbacks.throughput import ThroughputMonitor
    from callbacks.timer import Timer
    from callbacks.tqdm_progress import TQDMProgressBar
    from callbacks.wandb_logger import WandbLogger
    from callbacks.weight_averaging import EMAWeightAveraging, WeightAveraging

_LAZY = {
    "CSVLogger": "callbacks.csv_logger",
    "CometLogger": "callbacks.comet_logger",
    "LitLogger": "callbacks.litlogger",
    "NeptuneLogger": "callbacks.litlogger",
    "DeviceStatsMonitor": "callbacks.device_stats",
    "EarlyStopping": "callbacks.early_stopping",
    "GradientMonitor": "callbacks.grad_monitor",
    "LambdaCallback": "callbacks.lambda_callback",
    "LearningRateMonitor": "callbacks.lr_monitor",
    "MLFlowLogger": "callbacks.mlflow_logger",
    "Logger": "callbacks._logger",
    "ModelCheckpoint": "callbacks.checkpoint",
    "ModelSummary": "callbacks.model_summary",
    "OnExceptionCheckpoint": "callbacks.on_exception_checkpoint",
    "ProgressBar": "callbacks.progress",
    "RichModelSummary": "callbacks.model_summary",
    "RichProgressBar": "callbacks.rich_progress",
    "TQDMProgressBar": "callbacks.tqdm_progress",
    "TensorBoardLogger": "callbacks.tensorboard",
    "ThroughputMonitor": "callbacks.throughput",
    "Timer": "callbacks.timer",
    "WandbLogger": "callbacks.wandb_logger",
    "WeightAveraging": "callbacks.weight_averaging",
    "EMAWeightAveraging": "callbacks.weight_averaging",
    "StochasticWeightAveraging": "callbacks.stochastic_weight_avg",
    "BaseFinetuning": "callbacks.finetuning",
    "BackboneFinetuning": "callbacks.finetuning",
    "GradientAccumulationScheduler": "callbacks.gradient_accumulation_scheduler",
    "LearningRateFinder": "callbacks.lr_finder",
    "BatchSizeFinder": "callbacks.batch_size_finder",
    "BasePredictionWriter": "callbacks.prediction_writer",
    "join_predictions": "callbacks.prediction_writer",
    "ModelPruning": "callbacks.pruning",
    "SpikeDetection": "callbacks.spike",
}

__all__ = [
    "BackboneFinetuning",
    "BaseFinetuning",
    "BasePredictionWriter",
    "BatchSizeFinder",
    "CSVLogger",
    "Callback",
    "Checkpoint",
    "CometLogger",
    "DeviceStatsMonitor",
    "EMAWeightAveraging",
    "EarlyStopping",
    "GradientAccumulationScheduler",
    "GradientMonitor",
    "LambdaCallback",
    "LearningRateFinder",
    "LearningRateMonitor",
    "LitLogger",
    "Logger",
    "MLFlowLogger",
    "ModelCheckpoint",
    "ModelPruning",
    "ModelSummary",
    "NeptuneLogger",
    "OnExceptionCheckpoint",
    "ProgressBar",
    "RichModelSummary",
    "RichProgressBar",
    "SpikeDetection",
    "StochasticWeightAveraging",
    "TQDMProgressBar",
    "TensorBoardLogger",
    "ThroughputMonitor",
    "Timer",
    "WandbLogger",
    "WeightAveraging",
    "join_predictions",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'callbacks' has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(__all__)
