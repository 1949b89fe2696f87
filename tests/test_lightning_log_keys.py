"""``self.log`` keys, results and checks as Lightning 2.6 makes them (issue #33, found by Lightning's suite).

Several evaluation loaders: a value logged with ``on_step`` and ``on_epoch`` is
``loss_epoch/dataloader_idx_0`` (the fork before the loader's suffix), and ``add_dataloader_idx=False``
keeps the name as given and the value in its own loader's results only. ``trainer.logged_metrics``
holds the step values also between logging steps. What Lightning refuses or warns about is refused
or warned about: a key naming a loader index itself, a torchmetrics object that is not an attribute
of the module, ``logger=True`` without a logger, ``self.log`` before the module meets a trainer.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers.callback_tools import Scripted, loaders
from tests.helpers.trainers import quiet_trainer
from trainer.common.errors import MisconfigurationException


def _val(n: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)), batch_size=4)


class TwoLoaders(Scripted):
    """Logs, per test loader: a forked value, a value named by the user, and one per loader index."""

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, _ = batch
        value = self.layer(x).mean() + dataloader_idx
        self.log("loss", value, on_step=True, on_epoch=True)
        self.log(f"mine_{dataloader_idx}", value, add_dataloader_idx=False)
        self.log("shared", 7.0)


def test_several_loaders_fork_before_the_suffix_and_add_dataloader_idx_false_keeps_the_name() -> None:
    trainer = quiet_trainer()
    results = trainer.test(TwoLoaders(), [_val(), _val()], verbose=False)
    assert [sorted(r) for r in results] == [
        ["loss_epoch/dataloader_idx_0", "mine_0", "shared/dataloader_idx_0"],
        ["loss_epoch/dataloader_idx_1", "mine_1", "shared/dataloader_idx_1"],
    ]
    metrics = trainer.callback_metrics
    assert {"loss/dataloader_idx_0", "loss_epoch/dataloader_idx_1", "mine_0", "mine_1"} <= set(metrics)
    assert float(metrics["mine_1"]) == pytest.approx(results[1]["loss_epoch/dataloader_idx_1"])


def test_a_key_naming_a_loader_index_itself_is_refused() -> None:
    class Named(Scripted):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.log("loss/dataloader_idx_0", 1.0)
            return super().training_step(batch, batch_idx)

    train, _ = loaders()
    with pytest.raises(MisconfigurationException, match=r"key `loss/dataloader_idx_0`.*add_dataloader_idx"):
        quiet_trainer(max_steps=1).fit(Named(), train)


def test_logged_metrics_hold_step_values_between_logging_steps() -> None:
    class Logs(Scripted):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.log("seen", float(batch_idx), logger=True)
            return super().training_step(batch, batch_idx)

    train, _ = loaders()  # 4 batches, logged every 50 steps: no row reaches a logger
    trainer = quiet_trainer(max_epochs=1, log_every_n_steps=50)
    with pytest.warns(UserWarning, match=r"self.log\('seen', ..., logger=True\)` but have no logger"):
        trainer.fit(Logs(), train)
    assert {k: float(v) for k, v in trainer.logged_metrics.items()} == {
        "seen": 3.0,
        "train/loss": pytest.approx(float(trainer.callback_metrics["train/loss"])),
    }


def test_self_log_without_a_trainer_warns_and_records_nothing() -> None:
    with pytest.warns(UserWarning, match="`self.trainer` reference is not registered"):
        Scripted().log("loss", 1.0)


def test_a_logged_metric_must_be_an_attribute_of_the_module() -> None:
    torchmetrics = pytest.importorskip("torchmetrics")

    class Loose(Scripted):
        def __init__(self, keep: bool) -> None:
            super().__init__()
            if keep:
                self.kept = torchmetrics.MeanMetric()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            metric = torchmetrics.MeanMetric()
            metric.update(1.0)
            self.log("m", metric)
            return super().training_step(batch, batch_idx)

    train, _ = loaders()
    with pytest.raises(MisconfigurationException, match="setting an attribute for the metric in your"):
        quiet_trainer(max_steps=1).fit(Loose(keep=False), train)
    with pytest.raises(MisconfigurationException, match=r"metric_attribute=name\)` where `name` is one of \['kept'\]"):
        quiet_trainer(max_steps=1).fit(Loose(keep=True), train)


@pytest.mark.parametrize("compute_groups", [True, False])
def test_a_metric_collection_is_read_as_lightning_reads_it(compute_groups: bool) -> None:
    torchmetrics = pytest.importorskip("torchmetrics")
    calls: list[tuple[bool, bool]] = []

    class Watched(torchmetrics.MetricCollection):  # type: ignore[misc]
        def items(self, keep_base: bool = False, copy_state: bool = True) -> Any:
            calls.append((keep_base, copy_state))
            return super().items(keep_base=keep_base, copy_state=copy_state)

    class Collected(Scripted):
        def __init__(self) -> None:
            super().__init__()
            self.metrics = Watched([torchmetrics.MeanMetric(), torchmetrics.SumMetric()], compute_groups=compute_groups)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.metrics.update(torch.tensor([1.0, 2.0]))
            calls.clear()
            self.log_dict(self.metrics, on_step=False, on_epoch=True)
            assert calls == [(False, not compute_groups)]  # compute groups share their state: no copies
            return super().training_step(batch, batch_idx)

    train, _ = loaders()
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(Collected(), train)
    assert float(trainer.callback_metrics["SumMetric"]) == 12.0  # 4 batches of 1 + 2
