"""``TensorBoardLogger``: a callback that writes a run's scalars, hyperparameters and config."""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from callbacks.base import Callback
from trainer.common.state_dict import to_plain

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["TensorBoardLogger"]


class TensorBoardLogger(Callback):
    """Write everything logged to one TensorBoard event file per run (rank 0 only).

    * Every value the trainer hands to loggers becomes a scalar at x = global step (the index of the
      optimizer step, from 0); epoch-level values sit at the step where their epoch ended. An
      ``epoch`` scalar is written at each of those steps, so the x-axis reads either way.
    * At fit start the resolved config goes in as text (tag ``config``) and the hyperparameters
      (the flattened config, ``model/hidden``; without a config the module's ``hparams``) as a
      session of the HPARAMS tab; at fit end
      the session is closed, linked to the final validation metrics (their scalar tags, so the
      HPARAMS table shows their last values).
    * One writer serves fit, validate and test of the run: a run is one event file.

    Args:
        save_dir: root folder (default: the trainer's ``default_root_dir``: under the ``geartrain``
            command, the Hydra run directory of the job, so ``tensorboard --logdir outputs`` or
            ``--logdir multirun`` shows every run and every job of a sweep side by side).
        name: sub-folder for this logger's files.
        version: optional further sub-folder (e.g. to keep several runs in one ``save_dir``).
        flush_secs: how often the writer flushes to disk in the background.
    """

    is_logger = True
    runs_in_fast_dev_run = False

    def __init__(
        self,
        save_dir: str | os.PathLike[str] | None = None,
        name: str = "tensorboard",
        version: str | int | None = None,
        flush_secs: int = 10,
    ) -> None:
        self.save_dir = Path(save_dir) if save_dir is not None else None
        self.name = name
        self.version = version
        self.flush_secs = flush_secs
        self._writer: SummaryWriter | None = None
        self._hparams: dict[str, Any] = {}
        self._in_validation = False
        self._val_metrics: dict[str, float] = {}
        self._epoch_written_at = -1

    @property
    def log_dir(self) -> Path:
        """The folder holding this run's event file."""
        path = (self.save_dir if self.save_dir is not None else Path(".")) / self.name
        return path / str(self.version) if self.version is not None else path

    @property
    def writer(self) -> SummaryWriter | None:
        """The underlying ``SummaryWriter`` (``None`` before the first write and on ranks other than 0)."""
        return self._writer

    def _open(self, trainer: Trainer) -> SummaryWriter | None:
        if self._writer is None and trainer.is_global_zero:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=self.flush_secs)
            # Closed when this logger goes away or the interpreter exits, not per stage: one file per run.
            weakref.finalize(self, self._writer.close)
        return self._writer

    def close(self) -> None:
        """Flush and close the event file (a later write opens a new one)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    @override
    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if self.save_dir is None:
            self.save_dir = trainer.default_root_dir

    @override
    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        writer = self._open(trainer)
        if writer is None:
            return
        config = _config_dict(trainer.config)
        if config:
            import yaml

            text = yaml.safe_dump(config, sort_keys=False)
            # Indented by four spaces: TensorBoard's markdown shows it as a code block, layout intact.
            writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), global_step=0)
        # The resolved config already holds the module's arguments; without one, the module's hparams.
        # save_hyperparameters(logger=False) keeps the module's hyperparameters out of the loggers.
        logged = module.hparams if getattr(module, "_log_hyperparams", True) else {}
        self._hparams = _flatten(config or _config_dict(logged))
        if self._hparams:
            from torch.utils.tensorboard.summary import hparams

            _, start, _ = hparams(self._hparams, {})
            writer._get_file_writer().add_summary(start)

    @override
    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._in_validation = not trainer.sanity_checking

    @override
    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._in_validation = False

    @override
    def on_log_metrics(
        self, trainer: Trainer, module: TrainModule, metrics: dict[str, torch.Tensor], step: int
    ) -> None:
        writer = self._open(trainer)
        if writer is None:
            return
        for key, value in metrics.items():
            number = float(value)  # the device sync happens here, at the logging interval only
            writer.add_scalar(key, number, global_step=step)
            if self._in_validation:
                self._val_metrics[key] = number
        if step != self._epoch_written_at:
            writer.add_scalar("epoch", trainer.current_epoch, global_step=step)
            self._epoch_written_at = step

    @override
    def on_fit_end(self, trainer: Trainer, module: TrainModule) -> None:
        writer = self._open(trainer)
        if writer is None or not self._hparams:
            return
        from torch.utils.tensorboard.summary import hparams

        # The experiment names the metric tags; TensorBoard shows each one's last value in the run.
        experiment, _, end = hparams(self._hparams, dict(self._val_metrics))
        file_writer = writer._get_file_writer()
        file_writer.add_summary(experiment)
        file_writer.add_summary(end)
        writer.flush()

    @override
    def teardown(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if self._writer is not None:
            self._writer.flush()


def _config_dict(config: Any) -> dict[str, Any]:
    plain = to_plain(config)
    return plain if isinstance(plain, dict) else {}


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict to ``{"a/b": value}`` with values TensorBoard's hparams accept (bool, number, str)."""
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
