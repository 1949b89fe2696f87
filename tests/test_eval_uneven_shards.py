"""Evaluation with uneven or empty shards under DDP equals one process (issue #17, item 3).

Evaluation shards are not padded, so with one validation sample on two ranks rank 1 gets no batch:
it never logs ``val/loss`` and never updates the torchmetrics object. It used to skip the all-reduce
rank 0 made for ``sync_dist=True`` (gloo aborted with "Received data size doesn't match", or the
run hung until the collective timeout). Now the ranks agree on the logged names at the epoch's end
and every rank takes part in every reduction; the values equal one process's.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies import DDPStrategy
from tests.helpers.distributed import spawn
from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule, seed_everything
from trainer.metrics.store import MetricStore
from trainer.metrics.sync import agree_on_entries


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 1)
        self.abs_error = torchmetrics.MeanMetric()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        out = self.net(x)
        self.log("val/loss", nn.functional.mse_loss(out, y), sync_dist=True)
        self.log("val/max", (out - y).abs().max(), sync_dist=True, reduce_fx="max")
        self.abs_error.update((out - y).abs())
        self.log("val/abs_error", self.abs_error)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def data(n: int) -> TensorDataset:
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(n))
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


def job(root: str, n_val: int, ddp: bool) -> dict[str, Any]:
    """Validate a fresh module on ``n_val`` samples, then fit one epoch (with a sanity check): the values."""
    seed_everything(0)
    strategy: Any = DDPStrategy(devices=2, device="cpu", timeout=timedelta(seconds=30)) if ddp else None
    kwargs = {"strategy": strategy} if ddp else {}
    trainer = quiet_trainer(root, max_epochs=1, num_sanity_val_steps=2, **kwargs)
    module = Net()
    (validated,) = trainer.validate(module, DataLoader(data(n_val), batch_size=1), verbose=False)
    # The same global batch of 4: two ranks of 2, or one process of 4.
    train = DataLoader(data(8), batch_size=2 if ddp else 4)
    trainer.fit(module, train, DataLoader(data(n_val), batch_size=1))
    after_fit = {k: v.item() for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    return {"validate": validated, "fit": after_fit}


N_VALS = (1, 3)  # one sample: rank 1 has no batch at all; three: rank 0 has two batches, rank 1 one


def ddp_jobs(root: str) -> dict[int, dict[str, Any]]:
    """:func:`job` under DDP for each of ``N_VALS``, one after the other in the same two ranks."""
    return {n_val: job(f"{root}/{n_val}", n_val, ddp=True) for n_val in N_VALS}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[int, dict[str, Any]]]:
    """One pair of gloo processes runs every validation-set size; its results, per rank."""
    return spawn(ddp_jobs, str(tmp_path_factory.mktemp("ddp")), world_size=2)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("n_val", N_VALS)
def test_an_empty_or_uneven_validation_shard_completes_with_one_process_values(
    tmp_path: Path, n_val: int, two_ranks: list[dict[int, dict[str, Any]]]
) -> None:
    one = job(str(tmp_path / "one"), n_val, ddp=False)
    ranks = [rank[n_val] for rank in two_ranks]
    keys = {"val/loss", "val/max", "val/abs_error"}
    for rank in ranks:
        assert rank["validate"].keys() == one["validate"].keys() == keys
        for key, value in one["validate"].items():
            if n_val == 1:  # the other rank adds neutral elements: bitwise the one-process value
                assert rank["validate"][key] == value, key
            else:  # the same sums in another order
                assert rank["validate"][key] == pytest.approx(value, rel=1e-6), key
        # Fit (sanity check, training, validation) completes on both ranks with the one-process
        # values, to the float tolerance of DDP training.
        assert rank["fit"].keys() == one["fit"].keys() == keys
        for key, value in one["fit"].items():
            assert rank["fit"][key] == pytest.approx(value, rel=1e-5), key


def test_a_rank_without_batches_reduces_neutral_elements_in_rank_0s_order() -> None:
    # Rank 1's side of the agreement, with rank 0's description handed in by a fake gather: it gets
    # neutral entries for what it never logged, in rank 0's order, and keeps its step-only values.
    reductions: list[tuple[str, float]] = []

    def reduce(t: torch.Tensor, op: str) -> torch.Tensor:
        reductions.append((op, float(t)))
        return t

    module = Net()
    rank0 = MetricStore(reduce)
    rank0.log("val/max", torch.tensor(2.0), False, True, False, True, "max", lambda: 1)
    rank0.log("val/loss", torch.tensor(3.0), False, True, False, True, "mean", lambda: 1)
    rank0.log("val/abs_error", module.abs_error, False, True, False, False, "mean", lambda: 1)
    rank0.log("val/local", torch.tensor(3.0), False, True, False, False, "mean", lambda: 1)
    described: list[Any] = []

    def gather_alone(mine: Any) -> list[Any]:
        described.append(mine)
        return [mine]

    agree_on_entries(rank0, gather_alone, module, torch.device("cpu"))
    rank1 = MetricStore(reduce)
    rank1.log("val/step_only", torch.tensor(1.0), True, False, False, False, "mean", lambda: 1)
    agree_on_entries(rank1, lambda mine: [described[0], mine], module, torch.device("cpu"))
    # Not synced on rank 0 (val/local): no collective, so rank 1 needs no entry for it.
    assert list(rank1.entries) == ["val/max", "val/loss", "val/abs_error", "val/step_only"]
    assert rank1.entries["val/abs_error"].metric is module.abs_error
    values = rank1.epoch_values()  # the fake reduce returns this rank's own contribution
    assert reductions == [("max", -float("inf")), ("sum", 0.0), ("sum", 0.0)]
    assert "val/loss" not in values  # no samples on any rank: absent, as on one process
