"""``StochasticWeightAveraging``: SWALR, the epoch-wise average and the batch-norm refresh equal a hand-written
SWA loop bitwise, and resuming before and inside the SWA phase is exact."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.swa_utils import SWALR, update_bn

from callbacks import Callback, StochasticWeightAveraging
from tests.helpers.regression import make_loader
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule
from trainer.common.errors import MisconfigurationException

EPOCHS, START, ANNEAL, SWA_LR = 6, 3, 2, 0.01  # SWA from the 3rd epoch (index 2) to the last


class WithBatchNorm(TrainModule):
    """Batch norm, so the refresh of its statistics is tested; a StepLR that SWALR replaces."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self(x), y)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


def reference() -> nn.Module:
    """Hand-written SWA with Lightning's schedule: the average is updated at the start of each epoch of the
    phase, SWALR replaces StepLR from the phase's first epoch, and batch-norm statistics are recomputed last."""
    net = copy.deepcopy(WithBatchNorm().net)
    average = copy.deepcopy(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    scheduler: Any = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    n = torch.tensor(0, dtype=torch.long)
    loader = make_loader(n=12, batch_size=4)
    for epoch in range(EPOCHS):
        if epoch == START - 1:
            for group in optimizer.param_groups:
                group["initial_lr"] = SWA_LR
            scheduler = SWALR(
                optimizer, swa_lr=[SWA_LR], anneal_epochs=ANNEAL, anneal_strategy="cos", last_epoch=EPOCHS
            )
        if epoch >= START - 1:
            for p_avg, p in zip(average.parameters(), net.parameters()):
                p_avg.detach().copy_(p.detach() if n == 0 else p_avg + (p.detach() - p_avg) / (n + 1))
            n += 1
        for x, y in loader:
            F.mse_loss(net(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        scheduler.step()
    for p_avg, p in zip(average.parameters(), net.parameters()):
        p.detach().copy_(p_avg)
    update_bn(loader, net)
    return net


class SaveAt(Callback):
    def __init__(self, root: Path, steps: set[int]) -> None:
        self.root, self.steps = root, steps

    def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, *args: Any) -> None:
        if trainer.global_step in self.steps:
            trainer.save_checkpoint(self.root / f"step{trainer.global_step}.ckpt")


def _fit(ckpt: Path | None = None, extra: list[Callback] = ()) -> tuple[WithBatchNorm, Trainer]:  # type: ignore[assignment]
    module = WithBatchNorm()
    swa = StochasticWeightAveraging(swa_lrs=SWA_LR, swa_epoch_start=START, annealing_epochs=ANNEAL)
    trainer = quiet_trainer(callbacks=[swa, *extra], max_epochs=EPOCHS)
    trainer.fit(module, make_loader(n=12, batch_size=4), ckpt_path=ckpt)  # 3 steps an epoch
    return module, trainer


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_swa_equals_a_hand_written_swa_loop_bitwise() -> None:
    module, trainer = _fit()
    expected = reference()
    _assert_same(module.net.state_dict(), expected.state_dict())  # parameters and batch-norm statistics
    assert trainer.current_epoch == EPOCHS and trainer.global_step == 3 * EPOCHS  # no extra epoch counted
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(SWA_LR)


def test_resume_before_and_inside_the_swa_phase_is_exact(tmp_path: Path) -> None:
    steps = {4, 7, 9, 13}  # before the phase, its first epoch, an epoch's end inside it, later inside it
    whole, _ = _fit(extra=[SaveAt(tmp_path, steps)])
    state = torch.load(tmp_path / "step13.ckpt", weights_only=True)
    own = state["callbacks"]["StochasticWeightAveraging"]
    assert own["n_averaged"] == 3 and own["latest_update_epoch"] == 4 and own["scheduler_state"] is not None
    for step in sorted(steps):
        resumed, _ = _fit(tmp_path / f"step{step}.ckpt")
        _assert_same(resumed.net.state_dict(), whole.net.state_dict())


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="swa_epoch_start=0"):
        StochasticWeightAveraging(swa_lrs=0.1, swa_epoch_start=0)
    with pytest.raises(ValueError, match=r"swa_lrs=-1\.0"):
        StochasticWeightAveraging(swa_lrs=-1.0)
    with pytest.raises(ValueError, match="annealing_strategy='exp'"):
        StochasticWeightAveraging(swa_lrs=0.1, annealing_strategy="exp")  # type: ignore[arg-type]


def test_bad_arguments_raise_lightnings_exception_and_words() -> None:
    with pytest.raises(MisconfigurationException, match=">0 integer or a float between 0 and 1"):
        StochasticWeightAveraging(swa_lrs=0.1, swa_epoch_start=1.5)
    with pytest.raises(MisconfigurationException, match="positive float, or a list of positive floats"):
        StochasticWeightAveraging(swa_lrs=[0.2, 1])  # type: ignore[list-item]


def test_a_step_interval_scheduler_is_warned_about_and_the_swap_logged(caplog: pytest.LogCaptureFixture) -> None:
    class StepScheduled(WithBatchNorm):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=1)
    with caplog.at_level("INFO"), pytest.warns(UserWarning, match="SWA is currently only supported every epoch"):
        quiet_trainer(callbacks=[swa], max_epochs=2).fit(StepScheduled(), make_loader(n=8, batch_size=4))
    assert "Swapping scheduler `StepLR` for `SWALR`" in caplog.text


def test_swa_epoch_start_as_a_share_of_max_epochs() -> None:
    swa = StochasticWeightAveraging(swa_lrs=0.1, swa_epoch_start=0.5)
    quiet_trainer(callbacks=[swa], max_epochs=4).fit(WithBatchNorm(), make_loader(n=8, batch_size=4))
    assert swa.swa_start == 1 and int(swa.n_averaged) == 3  # type: ignore[arg-type]
