"""``CSVLogger``: every logged value in one CSV file per run."""

from __future__ import annotations

import csv
import os
import warnings
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from callbacks._logger import Logger, NoOpExperiment
from callbacks._logger_calls import yaml_params

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["CSVLogger", "CSVWriter"]


class CSVWriter:
    """The CSV file of one run (``CSVLogger.experiment``; Lightning's ``ExperimentWriter``).

    Rows are kept in :attr:`metrics` until :meth:`save` appends them to ``metrics.csv`` and empties
    the list. One row per logging call with a ``step`` column and one per metric (empty where a row
    has no value). When a new metric widens the header, the file is rewritten whole through a
    temporary file and a rename, so the file on disk is always a complete CSV. Hyperparameters
    reach ``hparams.yaml`` at once.

    As Lightning's: opening the writer on a folder that already holds files warns, and deletes an
    earlier ``metrics.csv`` there (a version reused is a new run).

    Args:
        log_dir: the folder of ``metrics.csv`` and ``hparams.yaml`` (made when the writer is).
    """

    NAME_METRICS_FILE = "metrics.csv"
    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.metrics_file_path = os.path.join(log_dir, self.NAME_METRICS_FILE)
        #: The rows not written yet, oldest first.
        self.metrics: list[dict[str, Any]] = []
        #: The file's columns, in the order they first appeared.
        self.metrics_keys: list[str] = []
        self.hparams: dict[str, Any] = {}
        if os.path.isdir(log_dir) and os.listdir(log_dir):
            warnings.warn(
                f"Experiment logs directory {log_dir} exists and is not empty. "
                "Previous log files in this directory will be deleted when the new ones are saved!",
                UserWarning,
                stacklevel=2,
            )
            if os.path.isfile(self.metrics_file_path):
                os.remove(self.metrics_file_path)
        os.makedirs(log_dir, exist_ok=True)

    def log_metrics(self, metrics_dict: Mapping[str, Any], step: int | None = None) -> None:
        """Add one row (``step`` defaults to the number of rows not written yet, as Lightning's)."""
        row: dict[str, Any] = {"step": len(self.metrics) if step is None else step}
        for key, value in metrics_dict.items():
            row[key] = value.item() if isinstance(value, torch.Tensor) else value
        self.metrics.append(row)

    def log_hparams(self, params: dict[str, Any]) -> None:
        """Add ``params`` to the hyperparameters and write ``hparams.yaml``."""
        import yaml

        self.hparams.update(params)
        os.makedirs(self.log_dir, exist_ok=True)
        with open(os.path.join(self.log_dir, self.NAME_HPARAMS_FILE), "w") as f:
            yaml.safe_dump(self.hparams, f, sort_keys=False)

    def save(self) -> None:
        """Append the rows kept to ``metrics.csv`` (rewriting it when the header widens), then forget them."""
        if not self.metrics:
            return  # no rows yet (a predict-only run): no file, as Lightning's
        os.makedirs(self.log_dir, exist_ok=True)
        new = [key for row in self.metrics for key in row if key not in self.metrics_keys]
        path = Path(self.metrics_file_path)
        exists = path.exists()
        if new or not exists:
            earlier = []
            if exists:
                with path.open(newline="") as f:
                    earlier = list(csv.DictReader(f))
            self.metrics_keys.extend(dict.fromkeys(new))
            tmp = path.with_suffix(".csv.tmp")
            with tmp.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
                writer.writeheader()
                writer.writerows(earlier)
                writer.writerows(self.metrics)
            os.replace(tmp, path)
        else:
            with path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=self.metrics_keys).writerows(self.metrics)
        self.metrics = []


class CSVLogger(Logger):
    """Write the values handed to loggers to ``<log_dir>/metrics.csv`` (rank 0 only).

    Lightning's ``CSVLogger`` (folders ``<save_dir>/<name>/version_<N>``, ``hparams.yaml`` beside the
    metrics). Values the trainer hands over get a row each with ``step``, ``epoch`` and one column per
    metric, in the order they first appear (Lightning sorts them). Rows reach the disk every
    ``flush_logs_every_n_steps`` steps and when a stage ends, also after an exception.

    Args:
        save_dir: root folder (default: the trainer's ``default_root_dir``). The ``geartrain``
            command's config passes ``name: csv`` and ``version: ""``: ``<run dir>/csv/metrics.csv``.
        name: experiment folder under ``save_dir`` (``""`` or ``None``: none).
        version: ``None`` for the next free ``version_N``; an int or a folder name (``""``: none).
        prefix: written before every metric key as ``<prefix>-<key>``.
        flush_logs_every_n_steps: write buffered rows when ``(step + 1)`` is a multiple of this.
    """

    def __init__(
        self,
        save_dir: str | os.PathLike[str] | None = None,
        name: str | None = "lightning_logs",
        version: int | str | None = None,
        prefix: str = "",
        flush_logs_every_n_steps: int = 100,
    ) -> None:
        if flush_logs_every_n_steps < 1:
            raise ValueError(f"flush_logs_every_n_steps must be >= 1, got {flush_logs_every_n_steps}")
        super().__init__(save_dir, name, version, prefix)
        self._flush_every = flush_logs_every_n_steps
        self._experiment: CSVWriter | None = None

    @property
    @override
    def log_dir(self) -> str:
        """``<save_dir>/<name>/<version folder>``: where ``metrics.csv`` and ``hparams.yaml`` go."""
        folder = super().log_dir
        assert folder is not None  # save_dir is always a folder here (the trainer's default_root_dir until given)
        return folder

    @property
    def experiment(self) -> Any:
        """The :class:`CSVWriter` of this run (a do-nothing stand-in on ranks other than 0)."""
        if not self._writes:
            return NoOpExperiment()
        if self._experiment is None:
            self._experiment = CSVWriter(str(self.log_dir))
        return self._experiment

    @property
    def path(self) -> Path:
        """The CSV file."""
        return Path(self.log_dir) / CSVWriter.NAME_METRICS_FILE

    @override
    def log_metrics(self, metrics: Mapping[str, float | torch.Tensor], step: int | None = None) -> None:
        """Keep a row at ``step`` (default: the number of rows kept); write every ``flush_logs_every_n_steps``."""
        if not self._writes:
            return
        if step is None:
            step = len(self.experiment.metrics)
        self.experiment.log_metrics(self._with_prefix(metrics), step)
        if (step + 1) % self._flush_every == 0:
            self.save()

    @override
    def log_hyperparams(
        self, params: dict[str, Any] | Namespace | None = None, metrics: dict[str, Any] | None = None
    ) -> None:
        """Write ``params`` to ``hparams.yaml`` now (``None``: an empty one, as Lightning's)."""
        tree = yaml_params(params or {})
        self.hparams.update(tree)
        if self._writes:
            self.experiment.log_hparams(tree)
            if metrics:
                self.log_metrics(metrics, 0)

    @override
    def save(self) -> None:
        if self._writes and self._experiment is not None:
            self._experiment.save()

    # ----------------------------------------------------------------- as a callback
    @override
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if self._writes:
            # As Lightning's trainer: the experiment (the folder) exists from set-up on, on rank 0.
            _ = self.experiment

    @override
    def on_log_metrics(
        self, trainer: Trainer, pl_module: TrainModule, metrics: dict[str, torch.Tensor], step: int
    ) -> None:
        if self._writes:
            values = {k: float(v) for k, v in metrics.items() if k != "epoch"}
            epoch = (
                int(metrics["epoch"]) if "epoch" in metrics else trainer.current_epoch
            )  # a whole number, as Lightning's
            self.log_metrics(metrics={"epoch": epoch, **values}, step=step)
