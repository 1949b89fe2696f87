"""What Lightning's trainer hands a logger: its calls to a logger object that is not a geartrain logger
(:class:`LoggerDriver`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from callbacks._logger import Logger, run_hparams
from callbacks.base import Callback

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["LoggerDriver", "give_lightnings_calls"]


class LoggerDriver(Callback):
    """Drives a logger object that is not a geartrain :class:`Logger` through Lightning's logger API.

    geartrain's loggers are callbacks and act in their own hooks. An object given as ``logger=``
    that is not one (a ``MagicMock`` with a logger's methods, as Lightning's tests give) gets, as
    from Lightning's trainer: ``log_hyperparams`` with the run's hyperparameters, ``log_graph`` and
    ``save`` when a run starts, ``finalize`` at the end (its rows: :func:`give_lightnings_calls`).
    """

    def __init__(self, logger: Any) -> None:
        self.logger = logger

    @property
    @override
    def state_key(self) -> str:
        return f"LoggerDriver[{type(self.logger).__name__}]"

    @override
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if stage != "fit":  # a fit's come after on_fit_start, as in Lightning
            self._start(trainer, pl_module)

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._start(trainer, pl_module)

    def _start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Lightning's start of a run for each logger: its hyperparameters, its graph, a save."""
        if trainer.is_global_zero:
            hparams = run_hparams(pl_module, trainer)
            if hparams:
                self.logger.log_hyperparams(hparams)
            self.logger.log_graph(pl_module)
            self.logger.save()

    @override
    def teardown(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if trainer.is_global_zero:
            self.logger.finalize("success")

    @override
    def on_exception(self, trainer: Trainer, pl_module: TrainModule, exception: BaseException) -> None:
        if trainer.is_global_zero:
            self.logger.finalize("failed")


def give_lightnings_calls(logger: Any) -> None:
    """Let a logger that is not one of geartrain's (a test's ``Mock``) receive metrics as Lightning sends them.

    geartrain's loggers hear the ``on_log_metrics`` hook; a stand-in written against Lightning's
    ``Logger`` expects ``log_metrics(metrics=..., step=...)`` with Python numbers, then ``save()``.
    """
    if isinstance(logger, Logger) or hasattr(type(logger), "on_log_metrics"):
        return

    def on_log_metrics(trainer: Any, pl_module: Any, metrics: dict[str, torch.Tensor], step: int) -> None:
        scalars = {k: v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v for k, v in metrics.items()}
        logger.log_metrics(metrics=scalars, step=step)
        logger.save()

    logger.on_log_metrics = on_log_metrics
