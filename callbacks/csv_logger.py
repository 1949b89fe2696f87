"""``CSVLogger``: every logged value in one CSV file per run."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from callbacks.base import Callback

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["CSVLogger"]


class CSVLogger(Callback):
    """Write the values handed to loggers to ``<save_dir>/<name>/metrics.csv`` (rank 0 only).

    One row per logging call with columns ``step``, ``epoch`` and one per metric (empty where a row
    has no value). Rows are appended as they come; when a new metric appears the file is rewritten
    with the wider header, so the file on disk is always a complete CSV.

    Args:
        save_dir: root folder (default: the trainer's ``default_root_dir``).
        name: sub-folder for the file.
    """

    is_logger = True
    runs_in_fast_dev_run = False

    def __init__(self, save_dir: str | os.PathLike[str] | None = None, name: str = "csv") -> None:
        self.save_dir = Path(save_dir) if save_dir is not None else None
        self.name = name
        self._rows: list[dict[str, Any]] = []
        self._columns: list[str] = ["step", "epoch"]

    @property
    def log_dir(self) -> Path:
        """The folder holding ``metrics.csv``."""
        return (self.save_dir if self.save_dir is not None else Path(".")) / self.name

    @property
    def path(self) -> Path:
        """The CSV file."""
        return self.log_dir / "metrics.csv"

    @override
    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if self.save_dir is None:
            self.save_dir = trainer.default_root_dir

    @override
    def on_log_metrics(
        self, trainer: Trainer, module: TrainModule, metrics: dict[str, torch.Tensor], step: int
    ) -> None:
        if not trainer.is_global_zero:
            return
        row: dict[str, Any] = {"step": step, "epoch": trainer.current_epoch}
        row.update({key: float(value) for key, value in metrics.items()})
        self._rows.append(row)
        new = [key for key in row if key not in self._columns]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if new or not self.path.exists():
            self._columns.extend(new)
            self._rewrite()
        else:
            with self.path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=self._columns).writerow(row)

    def _rewrite(self) -> None:
        tmp = self.path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self._columns)
            writer.writeheader()
            writer.writerows(self._rows)
        os.replace(tmp, self.path)
