"""What the loggers are handed and write, as Lightning 2.6 (issue #33, found by Lightning's suite).

``log_metrics`` gets the trainer's rows as they are, ``epoch`` included in every row that carries it
(an evaluation epoch's row at the step a training row already used too); ``hparams.yaml`` holds the
hyperparameters nested, as Lightning's loggers write it; ``trainer.log_dir`` is the first logger's
``log_dir`` for TensorBoard and CSV, its ``save_dir`` for any other logger.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from callbacks import CSVLogger, Logger, TensorBoardLogger
from tests.helpers.callback_tools import NotRankZero, Scripted, loaders
from tests.helpers.trainers import quiet_trainer


@pytest.mark.parametrize("cls", [TensorBoardLogger, CSVLogger])
def test_log_metrics_gets_every_row_with_its_epoch(cls: type[Logger], tmp_path: Path) -> None:
    rows: list[tuple[int | None, dict[str, Any]]] = []

    class Recording(cls):  # type: ignore[valid-type,misc]
        def log_metrics(self, metrics: Any, step: int | None = None) -> None:
            rows.append((step, dict(metrics)))
            super().log_metrics(metrics, step)

    train, val = loaders(n_train=16)  # 2 steps an epoch, validation at its end
    quiet_trainer(callbacks=[Recording(save_dir=tmp_path)], max_epochs=2, log_every_n_steps=2).fit(
        Scripted(), train, val
    )
    with_epoch = [(step, int(m["epoch"]), sorted(k for k in m if k != "epoch")) for step, m in rows if "epoch" in m]
    assert with_epoch == [
        (1, 0, ["train/loss"]),
        (1, 0, ["val/loss"]),  # the same step as the training row, with its epoch again (Lightning's row)
        (3, 1, ["train/loss"]),
        (3, 1, ["val/loss"]),
    ]


def test_hparams_yaml_keeps_nested_hyperparameters(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path)
    logger.log_hyperparams(
        {"lr": 0.3, "net": {"width": {"in": 4}}, "sizes": [1, 2, 3], "layer": torch.nn.BatchNorm1d, "on": True}
    )
    saved = yaml.safe_load((Path(logger.log_dir) / "hparams.yaml").read_text())
    assert saved == {
        "lr": 0.3,
        "net": {"width": {"in": 4}},
        "sizes": [1, 2, 3],
        "layer": str(torch.nn.BatchNorm1d),  # a class: its name (Lightning writes a tag a safe reader refuses)
        "on": True,
    }


def test_trainer_log_dir_is_a_tracker_loggers_save_dir(tmp_path: Path) -> None:
    class Tracker(Logger):
        """A logger of files elsewhere (W&B, MLflow), with a local folder of its own."""

        @property
        def save_dir(self) -> str:  # type: ignore[override]
            return str(tmp_path / "tracker")

        @property
        def log_dir(self) -> str | None:
            return None

        def log_metrics(self, metrics: Any, step: int | None = None) -> None:
            pass

        def log_hyperparams(self, params: Any, metrics: Any = None) -> None:
            pass

    assert quiet_trainer(tmp_path, callbacks=[Tracker()]).log_dir == str(tmp_path / "tracker")
    csv = CSVLogger(tmp_path, name="csv")
    assert quiet_trainer(tmp_path, callbacks=[csv, Tracker()]).log_dir == csv.log_dir
    assert quiet_trainer(tmp_path).log_dir == str(tmp_path)


def test_a_logger_of_the_users_own_is_called_on_every_rank(tmp_path: Path) -> None:
    class Mine(Logger):
        """Lightning's all-rank logger: its methods carry no rank-zero guard, so every rank's values arrive."""

        def __init__(self) -> None:
            super().__init__(save_dir=tmp_path)
            self.rows: list[dict[str, Any]] = []

        def log_metrics(self, metrics: Any, step: int | None = None) -> None:
            self.rows.append(dict(metrics))

        def log_hyperparams(self, params: Any, metrics: Any = None) -> None:
            pass

    mine, csv = Mine(), CSVLogger(tmp_path, name="csv")
    train, val = loaders()
    quiet_trainer(callbacks=[mine, csv], max_epochs=1, strategy=NotRankZero(device="cpu")).fit(Scripted(), train, val)
    assert any("val/loss" in row for row in mine.rows)  # rank 1's own values
    assert not (tmp_path / "csv").exists()  # geartrain's loggers still write on rank 0 only
