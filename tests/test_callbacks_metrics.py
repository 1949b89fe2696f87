"""torchmetrics objects logged with self.log / self.log_dict: computed at epoch end, then reset."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassPrecision

from tests.helpers.callback_tools import Recorder
from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule

C = 4
N_TRAIN, N_VAL, BATCH = 24, 21, 8  # 21: the last validation batch is short (5 samples)


def _data(n: int) -> DataLoader:
    idx = torch.arange(n)
    return DataLoader(TensorDataset(idx, idx % C), batch_size=BATCH)


def predictions(idx: torch.Tensor, epoch: int) -> torch.Tensor:
    """Scripted predictions: all right in epoch 0; in later epochs right only where idx % 3 == 0."""
    y = idx % C
    return y if epoch == 0 else torch.where(idx % 3 == 0, y, (y + 1) % C)


class Scripted(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))
        self.train_acc = MulticlassAccuracy(num_classes=C, average="micro")
        self.val_metrics = MetricCollection(
            {"acc": MulticlassAccuracy(num_classes=C, average="micro"), "prec": MulticlassPrecision(num_classes=C)},
            prefix="val/",
        )
        self.test_metrics = MetricCollection({"acc": MulticlassAccuracy(num_classes=C, average="micro")})

    def _logits(self, idx: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(predictions(idx, self.current_epoch), C).float() + self.w

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        idx, y = batch
        logits = self._logits(idx)
        self.train_acc(logits, y)  # forward: updates the state and caches this batch's value
        self.log("train/acc", self.train_acc, on_step=True, on_epoch=True)
        return logits.sum() * 0.0  # nothing to learn: the predictions are scripted

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        idx, y = batch
        self.val_metrics.update(self._logits(idx), y)
        self.log_dict(self.val_metrics)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        idx, y = batch
        self.test_metrics.update(self._logits(idx), y)
        self.log("test", self.test_metrics)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _accuracy(n: int, epoch: int, start: int = 0) -> float:
    idx = torch.arange(start, start + n)
    return float((predictions(idx, epoch) == idx % C).float().mean())


def test_metric_and_collection_compute_at_epoch_end_and_reset() -> None:
    recorder = Recorder()
    trainer = quiet_trainer(callbacks=[recorder], max_epochs=2, log_every_n_steps=1)
    module = Scripted()
    trainer.fit(module, _data(N_TRAIN), _data(N_VAL))
    # Per step: the batch's own accuracy.
    steps = recorder.of("train/acc_step")
    expected_steps = [_accuracy(BATCH, epoch, start=b * BATCH) for epoch in (0, 1) for b in range(3)]
    assert [s for s, _ in steps] == list(range(6))
    assert [v for _, v in steps] == pytest.approx(expected_steps)
    # Per epoch: over the epoch's samples only (a metric not reset would give the 2-epoch average).
    assert [v for _, v in recorder.of("train/acc_epoch")] == pytest.approx([1.0, _accuracy(N_TRAIN, 1)])
    assert _accuracy(N_TRAIN, 1) != pytest.approx((1.0 + _accuracy(N_TRAIN, 1)) / 2)
    # Validation through log_dict(MetricCollection): keys carry the collection's prefix; the short
    # last batch counts by its 5 samples, not as a whole batch.
    assert recorder.of("val/acc") == [(2, pytest.approx(1.0)), (5, pytest.approx(_accuracy(N_VAL, 1)))]
    assert _accuracy(N_VAL, 1) == pytest.approx(7 / 21)
    # Accuracy and precision share their state (a torchmetrics compute group); both are right.
    assert recorder.of("val/prec")[0] == (2, pytest.approx(1.0))
    assert recorder.of("val/prec")[1][1] < 1.0
    assert float(trainer.callback_metrics["val/acc"]) == pytest.approx(7 / 21)
    # self.log(name, MetricCollection) logs each member under name/member.
    result = trainer.test(module, _data(N_VAL))[0]
    assert result == {"test/acc": pytest.approx(7 / 21)}
    # The objects were reset after each epoch.
    assert int(module.train_acc.tp.sum() + module.train_acc.fn.sum()) == 0
