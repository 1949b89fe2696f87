"""Under DDP every rank ends ``fit``, ``validate`` and ``test`` holding rank 0's buffers (issue #33, item 6).

A replica's BatchNorm updates its running statistics from its own shard, so after training steps
the ranks' buffers differ. Lightning's ranks evaluate through DDP's forward, which first broadcasts
rank 0's buffers; ours broadcast them on entering the evaluation loop (the shards stay unpadded:
here rank 1 has one validation and test batch fewer) and when ``fit``'s loop ends.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from strategies import DDPStrategy
from tests.helpers.distributed import spawn
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule, seed_everything


class BatchNormNet(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test/loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def buffers(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: b.detach().clone() for name, b in module.named_buffers()}


class Snapshots(Callback):
    """Each rank's buffers after every training batch and during every validation batch, and rank 0's
    module as validation starts."""

    def __init__(self) -> None:
        self.trained: list[dict[str, torch.Tensor]] = []
        self.validating: list[dict[str, torch.Tensor]] = []
        self.validated_module: dict[str, torch.Tensor] = {}

    def on_train_batch_end(self, trainer: Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.trained.append(buffers(module))

    def on_validation_start(self, trainer: Trainer, module: Any) -> None:
        self.validated_module = {k: v.clone() for k, v in module.state_dict().items()}

    def on_validation_batch_end(self, trainer: Trainer, module: Any, *args: Any) -> None:
        self.validating.append(buffers(module))


def data(n: int, seed: int) -> TensorDataset:
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


def val_data() -> TensorDataset:
    return data(3, 2)  # batch size 1 on two ranks: rank 0 has two batches, rank 1 one


def perturb(module: nn.Module, rank: int) -> None:
    """Make rank 1's buffers differ from rank 0's before an entry point."""
    bn = module.net[1]  # type: ignore[index]
    bn.running_mean += rank
    bn.num_batches_tracked += rank


def rank_job(root: str) -> dict[str, Any]:
    seed_everything(0)
    ddp = DDPStrategy(devices=2, device="cpu", timeout=timedelta(seconds=60))
    snaps = Snapshots()
    # Three steps of 2 x 4 samples; validation after the second (every 2 batches), so fit ends with a
    # training step after its last validation.
    options = {"val_check_interval": 2, "check_val_every_n_epoch": None, "limit_val_batches": None}
    trainer = quiet_trainer(root, [snaps], strategy=ddp, max_epochs=1, **options)
    module = BatchNormNet()
    trainer.fit(module, DataLoader(data(24, 1), batch_size=4), DataLoader(val_data(), batch_size=1))
    out: dict[str, Any] = {"trained": snaps.trained, "validating": list(snaps.validating), "fit": buffers(module)}
    out["val_loss"] = float(trainer.callback_metrics["val/loss"])
    out["validated_module"] = snaps.validated_module
    rank = trainer.global_rank
    perturb(module, rank)
    trainer.validate(module, DataLoader(val_data(), batch_size=1), verbose=False)
    out["validate"] = buffers(module)
    perturb(module, rank)
    trainer.test(module, DataLoader(data(3, 3), batch_size=1), verbose=False)
    out["test"] = buffers(module)
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return spawn(rank_job, str(tmp_path_factory.mktemp("bn")), world_size=2)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() == {"net.1.running_mean", "net.1.running_var", "net.1.num_batches_tracked"}
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_rank_holds_rank_0s_buffers_after_fit_validate_and_test(ranks: list[dict[str, Any]]) -> None:
    rank0, rank1 = ranks
    assert len(rank0["trained"]) == len(rank1["trained"]) == 3
    # Training: each replica's statistics come from its own shard.
    for mine, theirs in zip(rank0["trained"][1:], rank1["trained"][1:]):
        assert not torch.equal(mine["net.1.running_mean"], theirs["net.1.running_mean"])
    # Every validation batch of fit (two on rank 0, one on rank 1): rank 0's after the second step.
    assert len(rank0["validating"]) == 2 and len(rank1["validating"]) == 1
    for snapshot in [*rank0["validating"], *rank1["validating"]]:
        assert_same(snapshot, rank0["trained"][1])
    # The end of fit, after a last training step: rank 0's after it.
    assert_same(rank0["fit"], rank0["trained"][2])
    assert_same(rank1["fit"], rank0["trained"][2])
    # validate and test after rank 1's buffers were changed: rank 0's again.
    for stage in ("validate", "test"):
        assert_same(rank1[stage], rank0[stage])
        assert_same(rank0[stage], rank0["trained"][2])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_fits_validation_under_ddp_equals_one_process_validating_rank_0s_module(
    ranks: list[dict[str, Any]], tmp_path: Path
) -> None:
    # Both ranks evaluate with rank 0's statistics, so the synced loss is one process's on the whole set.
    module = BatchNormNet()
    module.load_state_dict(ranks[0]["validated_module"])
    (one,) = quiet_trainer(tmp_path).validate(module, DataLoader(val_data(), batch_size=1), verbose=False)
    for rank in ranks:
        assert rank["val_loss"] == pytest.approx(one["val/loss"], rel=1e-6)
