"""``TensorBoardLogger``: a callback that writes every logged value as a TensorBoard scalar."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["TensorBoardLogger"]


class TensorBoardLogger(Callback):
    """Write scalars, hyperparameters and the run's config to TensorBoard event files (rank 0 only).

    Args:
        save_dir: root folder; events go to ``save_dir/name/version`` (``version=None`` writes
            straight into ``save_dir/name``, which is what Hydra run directories want).
        name: sub-folder for this kind of run.
        version: sub-folder for this run, e.g. a sweep's job number.
    """

    is_logger = True
    runs_in_fast_dev_run = False

    def __init__(
        self,
        save_dir: str | os.PathLike[str] = ".",
        name: str = "tensorboard",
        version: str | int | None = None,
    ) -> None:
        self.save_dir = Path(save_dir)
        self.name = name
        self.version = version
        self._writer: SummaryWriter | None = None

    @property
    def log_dir(self) -> Path:
        """The folder holding this run's event files."""
        path = self.save_dir / self.name
        return path / str(self.version) if self.version is not None else path

    def _open(self, trainer: Trainer) -> SummaryWriter | None:
        if self._writer is None and trainer.is_global_zero:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.log_dir))
        return self._writer

    def on_log_metrics(
        self, trainer: Trainer, module: TrainModule, metrics: dict[str, torch.Tensor], step: int
    ) -> None:
        writer = self._open(trainer)
        if writer is None:
            return
        for key, value in metrics.items():
            writer.add_scalar(key, float(value), global_step=step)

    def on_fit_end(self, trainer: Trainer, module: TrainModule) -> None:
        writer = self._open(trainer)
        if writer is None:
            return
        hparams = _flatten({**module.hparams, **_config_dict(trainer.config)})
        final = {f"hparam/{k}": float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
        if hparams:
            writer.add_hparams(hparams, final or {"hparam/none": 0.0}, run_name=".")
        writer.flush()

    def teardown(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _config_dict(config: Any) -> dict[str, Any]:
    from trainer.checkpoint import to_plain

    plain = to_plain(config)
    return plain if isinstance(plain, dict) else {}


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict to ``{"a/b": value}`` with values TensorBoard's hparams accept."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}/"))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        elif value is None:
            out[name] = "None"
        else:
            out[name] = str(value)
    return out
