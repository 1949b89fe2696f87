"""Lightning's loop behaviour where its own tests (loops, optimization, barebones) found ours different.

Each test fails on the code before its fix: samplers told an epoch twice, ``self.log`` under
``barebones``, the closure of a manual ``optimizer.step``, the scheduler checks.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, RandomSampler, default_collate

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
    # validate/test/predict after it: the count of epochs trained, as Lightning tells it.
    for call in (trainer.validate, trainer.test, trainer.predict):
        sampler = EpochRecordingSampler(make_dataset())
        call(Regressor(), DataLoader(make_dataset(), batch_size=4, sampler=sampler))
        assert sampler.epochs == [2], call.__name__


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
    with pytest.raises(
        MisconfigurationException, match=r"^The provided lr scheduler `StepLess` doesn't follow PyTorch"
    ):
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


class SeesOutputs(Regressor):
    """Returns a dict with the loss and more; records what ``on_train_batch_end`` is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        return {"loss": loss, "idx": batch_idx, "raw": loss}

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.seen.append(outputs)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_on_train_batch_end_gets_lightnings_outputs(tmp_path: Path, accumulate: int) -> None:
    """Lightning hands ``{"loss": the loss detached and divided by the accumulation, **the other keys}``,
    and trains as before (bit for bit the same weights as a module that keeps the hook's default)."""
    model, plain = SeesOutputs(), Regressor()
    quiet_trainer(tmp_path, max_epochs=1, accumulate_grad_batches=accumulate).fit(model, make_loader())
    quiet_trainer(tmp_path, max_epochs=1, accumulate_grad_batches=accumulate).fit(plain, make_loader())
    assert_same_weights(model.net, plain.net)
    assert [list(o) for o in model.seen] == [["loss", "idx", "raw"]] * 3
    for out in model.seen:
        assert out["loss"].grad_fn is None and out["raw"].grad_fn is not None  # only the loss is detached
        assert torch.equal(out["loss"], out["raw"].detach() / accumulate)


class SkipsNoneBatches(Regressor):
    def __init__(self) -> None:
        super().__init__()
        self.stepped: list[int] = []
        self.ended: list[tuple[int, Any, Any]] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.stepped.append(batch_idx)
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.ended.append((batch_idx, outputs if outputs is None else sorted(outputs), batch))


def test_a_none_batch_is_skipped_with_a_warning(tmp_path: Path) -> None:
    """Lightning's rule for a training loader that yields None: warned, no step, ``on_train_batch_end``
    told with None; the other batches train as a hand-written loop over them alone."""
    batches = [b for b in make_loader(12, 4)]
    model = SkipsNoneBatches()
    reference = plain_copy(model)
    opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    for x, y in (batches[0], batches[2]):
        F.mse_loss(reference(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    calls = iter(range(3))

    def none_second(samples: list[Any]) -> Any:
        return None if next(calls) == 1 else default_collate(samples)

    trainer = quiet_trainer(tmp_path, max_epochs=1)
    with pytest.warns(UserWarning, match=r"train_dataloader yielded None"):
        trainer.fit(model, DataLoader(make_dataset(12), batch_size=4, collate_fn=none_second))
    assert model.stepped == [0, 2] and trainer.global_step == 2
    assert [(i, out) for i, out, _ in model.ended] == [(0, ["loss"]), (1, None), (2, ["loss"])]
    assert model.ended[1][2] is None
    assert_same_weights(model.net, reference)


class ReturnsNone(Regressor):
    """A step that trains nothing (Lightning's test programs do this to watch the data alone)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> None:
        self.seen.append(batch_idx)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [{"scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1), "interval": "step"}]


def test_steps_returning_none_count_towards_max_steps_and_the_schedulers(tmp_path: Path) -> None:
    """As in Lightning, a step that returned None is a global step: ``max_steps`` stops the fit after it and a
    step-interval scheduler moves; the weights stay as they were (no gradient)."""
    model = ReturnsNone()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = quiet_trainer(tmp_path, max_steps=2)
    trainer.fit(model, make_loader(40, 4))
    assert model.seen == [0, 1] and trainer.global_step == 2
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 2
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.slow  # two spawned processes
@pytest.mark.timeout(120)
def test_under_ddp_a_step_returning_none_is_refused(tmp_path: Path, clean_distributed_env: None) -> None:
    """Lightning refuses it: the other processes would wait for this one's gradients."""
    from strategies.launch import WorkerFailedError
    from tests.helpers.trainers import spawned

    trainer = quiet_trainer(tmp_path, max_epochs=1, strategy=spawned("ddp"), devices=2, accelerator="cpu")
    with pytest.raises(WorkerFailedError) as failed:
        trainer.fit(ReturnsNone(), make_loader())
    assert "Skipping the `training_step` by returning None in distributed training is not supported" in (
        failed.value.cause
    )


class DoublingLoader(DataLoader):  # type: ignore[type-arg]
    """A DataLoader subclass whose own ``__iter__`` changes the batches (its constructor takes other arguments)."""

    def __init__(self, factor: float) -> None:
        super().__init__(make_dataset(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
        self.factor = factor
        self.iterations: list[int] = []

    def __iter__(self) -> Any:
        self.iterations.append(len(self.iterations))
        for x, y in super().__iter__():
            yield x * self.factor, y * self.factor


def test_a_dataloader_subclass_stays_itself_in_training(tmp_path: Path) -> None:
    """The trainer's resumable sampler goes into a copy of the user's loader, which keeps its class (its
    ``__iter__`` scales every batch here) and shares its attributes: training sees what the loader yields,
    as in Lightning, which uses the user's loader itself."""
    loader = DoublingLoader(factor=2.0)
    model = Regressor()
    reference = plain_copy(model)
    opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    plain_loader = DoublingLoader(factor=2.0)
    for _ in range(2):
        for x, y in plain_loader:
            F.mse_loss(reference(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    quiet_trainer(tmp_path, max_epochs=2).fit(model, loader)
    assert loader.iterations == [0, 1]  # the copy appended to the user's loader's own list
    assert_same_weights(model.net, reference)


def test_persistent_workers_end_with_the_run(tmp_path: Path) -> None:
    """As Lightning: the worker processes of persistent-worker loaders are stopped when fit (or validate)
    ends, not left running as long as the loader object lives."""

    def loader() -> DataLoader[Any]:
        return DataLoader(make_dataset(), batch_size=4, num_workers=1, persistent_workers=True)

    trainer = quiet_trainer(tmp_path, max_epochs=2, limit_val_batches=1)
    trainer.fit(Regressor(), loader(), loader())
    for stage in ("fit", "validate"):
        (prepared,) = trainer.run_state.loaders[stage] if stage == "validate" else [trainer.run_state.loaders[stage]]
        assert prepared.persistent_workers and prepared._iterator is None, stage
    given = loader()
    trainer.validate(Regressor(), given)
    assert all(getattr(dl, "_iterator", None) is None for dl in trainer.run_state.loaders["validate"])


class StopsAtOnce(Regressor):
    """Asks to stop at every epoch's end, as early stopping with no patience would."""

    def on_train_epoch_end(self) -> None:
        self.trainer.should_stop = True


def test_a_stop_before_min_epochs_waits_and_says_so_once_at_info(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The root stays at WARNING: the `trainer` logger is at INFO itself, as Lightning's logger is.
    with caplog.at_level(logging.INFO, logger="elsewhere"):
        trainer = quiet_trainer(tmp_path, min_epochs=3, max_epochs=10)
        trainer.fit(StopsAtOnce(), make_loader(8, 4))
    assert trainer.current_epoch == 3 and trainer.global_step == 6  # waited for min_epochs, then stopped
    told = [r for r in caplog.records if "has not been met" in r.getMessage()]
    assert [(r.name, r.levelno) for r in told] == [("trainer", logging.INFO)]  # once, though asked each epoch
    assert told[0].getMessage() == (
        "Trainer was signaled to stop but the required `min_epochs=3` or `min_steps=None` has not been met. "
        "Training will continue..."
    )
