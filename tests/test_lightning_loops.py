"""Lightning's loop behaviour where its own tests (loops, optimization, barebones) found ours different.

Each test fails on the code before its fix: samplers told an epoch twice, ``self.log`` under
``barebones``, the closure of a manual ``optimizer.step``, the scheduler checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, RandomSampler

from tests.helpers.regression import Regressor, assert_same_weights, make_dataset, make_loader, plain_copy
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer
from trainer.errors import MisconfigurationException


class EpochRecordingSampler(RandomSampler):
    """A sampler that records each ``set_epoch`` it is told (a DistributedSampler is told the same)."""

    def __init__(self, data: Any) -> None:
        super().__init__(data, generator=torch.Generator().manual_seed(0))
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


def test_a_sampler_is_told_each_epoch_once(tmp_path: Path) -> None:
    """Lightning tells the train sampler each epoch once; the first epoch, opened before on_train_start, too."""
    train, val = EpochRecordingSampler(make_dataset()), EpochRecordingSampler(make_dataset())
    trainer = quiet_trainer(tmp_path, max_epochs=2, limit_val_batches=1, num_sanity_val_steps=1)
    trainer.fit(
        Regressor(),
        DataLoader(make_dataset(), batch_size=4, sampler=train),
        DataLoader(make_dataset(), batch_size=4, sampler=val),
    )
    assert train.epochs == [0, 1]
    assert val.epochs == [0, 0, 1]  # the sanity check, then each epoch's validation


class LogsEverywhere(Regressor):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss)
        return loss


def test_self_log_under_barebones_warns_and_records_nothing(tmp_path: Path) -> None:
    """Lightning's ``barebones=True`` turns logging off: ``self.log`` warns (it is not an error) and records nothing."""
    trainer = Trainer(barebones=True, default_root_dir=tmp_path, max_epochs=1, accelerator="cpu")
    with pytest.warns(UserWarning, match=r"`Trainer\(barebones=True\)` is configured"):
        trainer.fit(LogsEverywhere(), make_loader())
    assert trainer.global_step == 3 and "train_loss" not in trainer.callback_metrics


class ManualLBFGS(Regressor):
    """Manual optimisation with LBFGS, which evaluates the closure it is given several times a step."""

    def __init__(self) -> None:
        super().__init__(optim_fn=lambda m: torch.optim.LBFGS(m.parameters(), lr=0.5, max_iter=4))
        self.automatic_optimization = False
        self.before_step: list[int] = []
        self.evaluations: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opt = self.optimizers()
        x, y = batch

        def closure() -> torch.Tensor:
            self.evaluations.append(self.global_step)
            opt.zero_grad()
            loss = F.mse_loss(self(x), y)
            self.manual_backward(loss)
            return loss

        opt.step(closure=closure)

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self.before_step.append(self.global_step)


def test_a_manual_step_hands_its_closure_to_the_optimizer(tmp_path: Path) -> None:
    """As Lightning's ``LightningOptimizer.step``: the closure goes to the optimizer's own ``step``, so LBFGS
    trains as in a hand-written loop (bit for bit); ``on_before_optimizer_step`` runs after each evaluation
    of the closure, inside the step, as Lightning's wrapped closure calls it."""
    model = ManualLBFGS()
    reference = plain_copy(model)
    opt = torch.optim.LBFGS(reference.parameters(), lr=0.5, max_iter=4)
    for x, y in make_loader():

        def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            opt.zero_grad()
            loss = F.mse_loss(reference(x), y)
            loss.backward()
            return loss

        opt.step(closure)
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(model, make_loader())
    assert_same_weights(model.net, reference)
    assert trainer.global_step == 3 and model.before_step == model.evaluations
    assert len(model.evaluations) > 3 and set(model.evaluations) == {0, 1, 2}  # LBFGS evaluates more than once


class StepLess:
    """A scheduler of the user's own, without PyTorch's ``step``: the module steps it (Lightning's case)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer, self.ticks = optimizer, 0

    def state_dict(self) -> dict[str, Any]:
        return {"ticks": self.ticks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ticks = state["ticks"]


class OwnScheduler(Regressor):
    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [StepLess(optimizer)]


def test_a_scheduler_without_step_trains_when_the_module_steps_it(tmp_path: Path) -> None:
    class Stepping(OwnScheduler):
        def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
            scheduler.ticks += 1

    model = Stepping()
    trainer = quiet_trainer(tmp_path, max_epochs=2)
    trainer.fit(model, make_loader())
    assert trainer.lr_scheduler_configs[0].scheduler.ticks == 2  # once an epoch, by the module's hook
    with pytest.raises(MisconfigurationException, match="^The provided lr scheduler `StepLess` doesn't follow PyTorch"):
        quiet_trainer(tmp_path, max_epochs=1).fit(OwnScheduler(), make_loader())


def test_manual_optimisation_says_which_scheduler_keys_it_ignores(tmp_path: Path) -> None:
    class Manual(Regressor):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> None:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(super().training_step(batch, batch_idx))
            opt.step()

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
            return [optimizer], [{"scheduler": plateau, "monitor": "train_loss", "interval": "step"}]

    trainer = quiet_trainer(tmp_path, max_epochs=1)
    with pytest.warns(RuntimeWarning, match=r"\['monitor'\], but the keys will be ignored"):
        trainer.fit(Manual(), make_loader())
    assert trainer.lr_scheduler_configs[0].interval == "step"
