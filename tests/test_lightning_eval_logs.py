"""What ``validate``, ``test`` and ``predict`` write to loggers, as Lightning 2.6 does (issue #33, item 7).

Measured with Lightning 2.6 and its CSVLogger: after ``fit`` took 8 steps, the epoch values of a
``validate`` or ``test`` call land at step 8 and epoch 2 (with ``ckpt_path`` of an earlier
checkpoint too: the trainer's counters are not restored outside ``fit``), a fresh trainer's at
step 0; a validate-, test- or predict-only run writes the module's ``hparams.yaml``.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn

from callbacks import CSVLogger, Logger, ModelCheckpoint, TensorBoardLogger
from tests.helpers.callback_tools import Scripted, loaders
from tests.helpers.trainers import quiet_trainer


class Evaluated(Scripted):
    """``Scripted`` (hyperparameter ``lr``) with a test step and a predict step."""

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test/loss", nn.functional.mse_loss(self.layer(x), y))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0])


def rows(path: Path, name: str) -> list[tuple[int, int]]:
    """``(step, epoch)`` of every row of ``path`` that has a value for ``name``."""
    with path.open() as f:
        return [(int(r["step"]), int(r["epoch"])) for r in csv.DictReader(f) if r[name]]


def test_validate_and_test_after_fit_log_at_lightnings_step(tmp_path: Path) -> None:
    logger = CSVLogger(save_dir=tmp_path, name="run", version="")
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ck", save_top_k=-1)
    trainer = quiet_trainer(callbacks=[logger, checkpoints], max_epochs=2, enable_checkpointing=True)
    module = Evaluated()
    train, val = loaders()  # 4 steps an epoch
    trainer.fit(module, train, val)
    trainer.validate(module, val, verbose=False)
    trainer.test(module, val, verbose=False)
    trainer.test(module, val, ckpt_path=str(tmp_path / "ck" / "epoch=0-step=4.ckpt"), verbose=False)
    # Inside fit: the step just taken (3, 7), as before; after it: the count of steps (8).
    assert rows(logger.path, "val/loss") == [(3, 0), (7, 1), (8, 2)]
    assert rows(logger.path, "test/loss") == [(8, 2), (8, 2)]

    fresh = CSVLogger(save_dir=tmp_path, name="fresh", version="")
    ckpt = str(tmp_path / "ck" / "epoch=1-step=8.ckpt")
    quiet_trainer(callbacks=[fresh]).test(Evaluated(), val, ckpt_path=ckpt, verbose=False)
    assert rows(fresh.path, "test/loss") == [(0, 0)]


@pytest.mark.parametrize("cls", [CSVLogger, TensorBoardLogger])
@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_a_run_without_fit_writes_hparams_yaml(cls: type[Logger], stage: str, tmp_path: Path) -> None:
    logger = cls(save_dir=tmp_path)
    _, val = loaders()
    getattr(quiet_trainer(callbacks=[logger]), stage)(Evaluated(lr=0.5), val)
    assert yaml.safe_load((Path(logger.log_dir) / "hparams.yaml").read_text()) == {"lr": 0.5}
    if stage == "predict" and cls is CSVLogger:  # nothing logged: no metrics.csv, as Lightning's
        assert sorted(p.name for p in Path(logger.log_dir).iterdir()) == ["hparams.yaml"]


def test_hyperparameters_kept_from_loggers_are_not_written(tmp_path: Path) -> None:
    class Unlogged(Evaluated):
        def __init__(self) -> None:
            super().__init__()
            self.save_hyperparameters({"lr": 0.3}, logger=False)

    logger = CSVLogger(save_dir=tmp_path)
    train, val = loaders()
    trainer = quiet_trainer(callbacks=[logger], max_epochs=1)
    trainer.fit(Unlogged(), train, val)
    trainer.validate(Unlogged(), val, verbose=False)
    assert not (Path(logger.log_dir) / "hparams.yaml").exists()
    assert logger.path.exists()


def test_an_evaluation_steps_values_reach_callbacks_only_as_epoch_values(tmp_path: Path) -> None:
    """Lightning's rule: callbacks see a validation's epoch values (``b``, ``b_epoch``), never a step's
    (``b_step``, or a value logged with ``on_epoch=False``); the loggers and the progress bar do get them."""
    seen: list[set[str]] = []

    class Steps(Evaluated):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = super().training_step(batch, batch_idx)
            self.log("a", loss, on_step=True, on_epoch=True)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            loss = nn.functional.mse_loss(self.layer(x), y)
            self.log("b", loss, on_step=True, on_epoch=True, prog_bar=True)
            self.log("only_step", loss, on_step=True, on_epoch=False)
            seen.append(set(self.trainer.callback_metrics))

    trainer = quiet_trainer(tmp_path, max_epochs=1, num_sanity_val_steps=0)
    trainer.fit(Steps(), *loaders())
    assert set(trainer.callback_metrics) == {"train/loss", "a", "a_step", "a_epoch", "b", "b_epoch"}
    assert {"b_step", "only_step"} <= set(trainer.logged_metrics) and "b_step" in trainer.progress_bar_metrics
    assert not any({"b", "b_step", "only_step"} & keys for keys in seen)
