"""Lightning 2.6 behaviours a ported program relies on (issue #23): each as Lightning does it, or refused by name.

Switching validation off with ``model.validation_step = None``; ``self.log`` of values it cannot
record; manual optimisation's ``manual_backward(..., retain_graph=True)``, ``opt.step(**kwargs)`` and
schedulers the user steps; submodules kept in eval mode; validation samplers told the epoch;
``CombinedLoader``'s modes; the LR monitor with two optimizers; the names users import.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, SequentialSampler

from callbacks import CSVLogger, EarlyStopping, LearningRateMonitor, ProgressBar
from callbacks.base import Callback
from callbacks.early_stopping import EarlyStoppingReason
from tests.helpers.regression import Regressor, assert_same_weights, make_dataset, make_loader, plain_copy
from tests.helpers.trainers import quiet_trainer
from trainer.common.errors import MisconfigurationException, PossibleUserWarning
from trainer.common.rank_zero import rank_zero_only
from trainer.data.loaders import CombinedLoader
from trainer.hooks import is_overridden


# ----------------------------------------------------------------- crashes Lightning programs ran into
def test_validation_step_none_switches_validation_off(tmp_path: Path) -> None:
    model = Regressor()
    model.validation_step = None  # type: ignore[assignment,method-assign]
    trainer = quiet_trainer(tmp_path, max_epochs=2, num_sanity_val_steps=2)
    trainer.fit(model, make_loader(), make_loader())
    assert trainer.global_step == 6
    assert "val_loss" not in trainer.callback_metrics
    assert not trainer.enable_validation
    with pytest.raises(NotImplementedError, match="does not define validation_step"):
        trainer.validate(model, make_loader())


def test_test_and_predict_step_none_are_refused_by_name(tmp_path: Path) -> None:
    model = Regressor()
    model.test_step = None  # type: ignore[assignment,method-assign]
    model.predict_step = None  # type: ignore[assignment,method-assign]
    with pytest.raises(NotImplementedError, match="does not define test_step"):
        quiet_trainer(tmp_path).test(model, make_loader())
    with pytest.raises(NotImplementedError, match="predict_step is None"):
        quiet_trainer(tmp_path).predict(model, make_loader())


@pytest.mark.parametrize("interval", ["00:00:00:10", {"seconds": 10}, datetime.timedelta(seconds=10)])
def test_time_based_val_check_interval_is_refused_at_construction(interval: Any) -> None:
    with pytest.raises(ValueError, match=r"val_check_interval=.*wall-clock time is not supported.*give an int"):
        quiet_trainer(val_check_interval=interval)


@pytest.mark.parametrize(
    ("value", "type_name"), [(None, "NoneType"), ({"a": 1.0}, "dict"), ("high", "str"), ([1.0], "list")]
)
def test_log_refuses_values_it_cannot_record_naming_key_and_type(tmp_path: Path, value: Any, type_name: str) -> None:
    class Logs(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("x", value)
            return super().training_step(batch, batch_idx)

    with pytest.raises(ValueError, match=rf"`self.log\(x, .*\)` was called, but `{type_name}` values cannot be logged"):
        quiet_trainer(tmp_path, max_steps=1).fit(Logs(), make_loader())


# ----------------------------------------------------------------- manual optimisation
class TwiceBackward(Regressor):
    """Backward of one loss twice (the graph kept by ``retain_graph=True``), then a step with a keyword."""

    automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opt = self.optimizers()
        x, y = batch
        loss = F.mse_loss(self(x), y)
        opt.zero_grad()
        self.manual_backward(loss, retain_graph=True)
        self.manual_backward(loss)
        opt.step(scale=0.5)

    def configure_optimizers(self) -> Any:
        return ScaledSGD(self.parameters(), lr=0.05)


class ScaledSGD(torch.optim.SGD):
    """SGD whose ``step`` takes a keyword (as some optimizers' steps do)."""

    def step(self, closure: Any = None, scale: float = 1.0) -> Any:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(scale)
        return super().step(closure)


def test_manual_backward_retain_graph_and_step_keywords_reach_torch(tmp_path: Path) -> None:
    model = TwiceBackward()
    reference = plain_copy(model)
    opt = ScaledSGD(reference.parameters(), lr=0.05)
    for x, y in make_loader():
        loss = F.mse_loss(reference(x), y)
        opt.zero_grad()
        loss.backward(retain_graph=True)
        loss.backward()
        opt.step(scale=0.5)
    quiet_trainer(tmp_path, max_epochs=1).fit(model, make_loader())
    assert_same_weights(model.net, reference)


class PlateauByHand(Regressor):
    """Manual optimisation with a ``ReduceLROnPlateau`` (no ``monitor``) and a scheduler not of torch's."""

    automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opt = self.optimizers()
        plateau, custom = self.lr_schedulers()
        loss = super().training_step(batch, batch_idx)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        plateau.step(1.0)  # the same value every time: a plateau
        custom.step()

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
        return [opt], [plateau, CountingScheduler()]


class CountingScheduler:
    """A scheduler of the user's own: ``step``, ``state_dict``, ``load_state_dict``, no torch base class."""

    def __init__(self) -> None:
        self.steps = 0

    def step(self, *args: Any) -> None:
        self.steps += 1

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = state["steps"]


def test_manual_optimisation_takes_plateau_without_monitor_and_custom_schedulers(tmp_path: Path) -> None:
    model = PlateauByHand()
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(model, make_loader())  # 3 batches
    _, custom = model.lr_schedulers()
    assert custom.steps == 3
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**2)  # 2 plateau steps after the 1st


class UpdatedByHand:
    """A schedule the user advances with ``update()`` under manual optimisation: no ``step`` at all."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer, self.updates = optimizer, 0

    def update(self) -> None:
        self.updates += 1
        for group in self.optimizer.param_groups:
            group["lr"] *= 0.5

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = state["updates"]


def test_manual_optimisation_takes_a_scheduler_without_step_and_every_scheduler_needs_state(tmp_path: Path) -> None:
    class Updates(Regressor):
        automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> None:
            opt = self.optimizers()
            loss = super().training_step(batch, batch_idx)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
            self.lr_schedulers().update()

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return [opt], [UpdatedByHand(opt)]

    model = Updates()
    quiet_trainer(tmp_path, max_epochs=1).fit(model, make_loader())
    assert model.lr_schedulers().updates == 3

    class Stateless(Updates):
        def configure_optimizers(self) -> Any:
            return [torch.optim.SGD(self.parameters(), lr=0.1)], [object()]

    with pytest.raises(TypeError, match=r"must have state_dict\(\) and load_state_dict\(\).*got object"):
        quiet_trainer(tmp_path, max_epochs=1).fit(Stateless(), make_loader())


def test_custom_scheduler_under_automatic_optimisation_is_stepped_through_lr_scheduler_step(tmp_path: Path) -> None:
    seen: list[Any] = []

    class Custom(Regressor):
        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": CountingScheduler(), "interval": "step"}}

        def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
            seen.append(metric)
            scheduler.step()

    model = Custom()
    quiet_trainer(tmp_path, max_epochs=1).fit(model, make_loader())
    assert seen == [None, None, None]
    assert model.lr_schedulers().steps == 3


# ----------------------------------------------------------------- loops
class FrozenNorm(Regressor):
    """A regressor with a submodule the user keeps in eval mode (frozen batch-norm statistics)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(4)
        self.norm.eval()
        self.modes: list[tuple[bool, bool]] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.modes.append((self.training, self.norm.training))
        x, y = batch
        return F.mse_loss(self(self.norm(x)), y)


def test_a_submodule_in_eval_mode_stays_there_through_validation(tmp_path: Path) -> None:
    model = FrozenNorm()
    trainer = quiet_trainer(tmp_path, max_epochs=2, num_sanity_val_steps=2)
    with pytest.warns(PossibleUserWarning, match=r"1 module\(s\) are in eval mode at the start of training \(norm\)"):
        trainer.fit(model, make_loader(), make_loader())
    assert model.modes == [(True, False)] * 6  # also in the epoch after a validation
    assert (model.training, model.norm.training) == (True, False)
    trainer.validate(model, make_loader())
    trainer.predict(model, make_loader())
    assert (model.training, model.norm.training) == (True, False)


class EpochSampler(SequentialSampler):
    """A validation sampler that records the epochs it is told."""

    def __init__(self, data: Any) -> None:
        super().__init__(data)
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


def test_validation_samplers_are_told_the_training_epoch(tmp_path: Path) -> None:
    data = make_dataset(8)
    sampler = EpochSampler(data)
    quiet_trainer(tmp_path, max_epochs=3).fit(
        Regressor(), make_loader(), DataLoader(data, batch_size=4, sampler=sampler)
    )
    assert sampler.epochs == [0, 1, 2]


def test_predict_step_without_dataloader_idx(tmp_path: Path) -> None:
    class Predicts(Regressor):
        def predict_step(self, batch: Any) -> torch.Tensor:  # type: ignore[override]
            return self(batch[0])

    out = quiet_trainer(tmp_path).predict(Predicts(), make_loader())
    assert out is not None and [len(o) for o in out] == [4, 4, 2]


# ----------------------------------------------------------------- CombinedLoader
class SeveralLoaders(Regressor):
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        super().validation_step(batch, batch_idx)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("max_size_cycle", [(0, 10), (1, 11), (2, 10), (3, 11), (4, 10)]),
        ("min_size", [(0, 10), (1, 11)]),
        ("max_size", [(0, 10), (1, 11), (2, None), (3, None), (4, None)]),
    ],
)
def test_fit_combines_loaders_in_lightnings_modes(tmp_path: Path, mode: str, expected: list[Any]) -> None:
    seen: list[Any] = []

    class Sees(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            b = batch["b"]
            seen.append((int(batch["a"]), None if b is None else int(b)))
            return self.net[0].weight.sum() * 0.0

    loaders = {"a": torch.arange(5).view(5, 1).unbind(), "b": (torch.tensor([10]), torch.tensor([11]))}
    quiet_trainer(tmp_path, max_epochs=1).fit(Sees(), CombinedLoader(loaders, mode))
    assert seen == expected


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("max_size_cycle", [(0, 10), (1, 11), (2, 10), (3, 11), (4, 10)]),
        ("min_size", [(0, 10), (1, 11)]),
        ("max_size", [(0, 10), (1, 11), (2, None), (3, None), (4, None)]),
    ],
)
def test_validate_and_test_evaluate_combined_batches_in_lightnings_modes(
    tmp_path: Path, mode: str, expected: list[Any]
) -> None:
    """As Lightning: a non-sequential CombinedLoader is one loader of combined batches; counts are per iterable."""
    seen: list[Any] = []

    class Sees(Regressor):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            b = batch["b"]
            seen.append((int(batch["a"]), None if b is None else int(b)))

        def test_step(self, batch: Any, batch_idx: int) -> None:
            self.validation_step(batch, batch_idx)

    loaders = {"a": torch.arange(5).view(5, 1).unbind(), "b": (torch.tensor([10]), torch.tensor([11]))}
    trainer = quiet_trainer(tmp_path)
    trainer.validate(Sees(), CombinedLoader(loaders, mode), verbose=False)
    assert seen == expected and trainer.num_val_batches == [5, 2]
    seen.clear()
    trainer.test(Sees(), CombinedLoader(loaders, mode), verbose=False)
    assert seen == expected and trainer.num_test_batches == [5, 2]


def test_combined_loader_modes_a_stage_cannot_run_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r'`FitLoop` does not support the `CombinedLoader\(mode="sequential"\)` mode'):
        quiet_trainer(tmp_path, max_epochs=1).fit(Regressor(), CombinedLoader([make_loader()], "sequential"))
    with pytest.raises(
        ValueError, match=r'`trainer.predict\(\)` only supports the `CombinedLoader\(mode="sequential"\)`'
    ):
        quiet_trainer(tmp_path).predict(Regressor(), CombinedLoader([make_loader(), make_loader()], "min_size"))
    with pytest.raises(ValueError, match="Unsupported mode 'zip'"):
        CombinedLoader([], "zip")
    both = CombinedLoader([make_loader(), make_loader()], "sequential")
    results = quiet_trainer(tmp_path).validate(SeveralLoaders(), both)
    assert len(results) == 2


def test_combined_loader_iterates_as_lightnings() -> None:
    combined = CombinedLoader({"a": [1, 2, 3], "b": [10, 20]}, "max_size")
    with pytest.raises(RuntimeError, match=r"Please call `iter\(combined_loader\)` first"):
        len(combined)  # as Lightning's: the length is the iterator's
    iter(combined)
    assert len(combined) == 3
    assert list(combined) == [({"a": 1, "b": 10}, 0, 0), ({"a": 2, "b": 20}, 1, 0), ({"a": 3, "b": None}, 2, 0)]
    assert list(CombinedLoader([[1, 2], [3]], "sequential")) == [(1, 0, 0), (2, 1, 0), (3, 0, 1)]


# ----------------------------------------------------------------- callbacks' Lightning attributes
class TwoAdams(Regressor):
    automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        for opt in self.optimizers():
            loss = super().training_step(batch, batch_idx)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()

    def configure_optimizers(self) -> Any:
        first = torch.optim.Adam(self.net[0].parameters(), lr=0.1)
        second = torch.optim.Adam(self.net[2].parameters(), lr=0.2)
        return [first, second], [torch.optim.lr_scheduler.StepLR(first, 1), torch.optim.lr_scheduler.StepLR(second, 1)]


@pytest.mark.parametrize(("interval", "logged"), [(None, 1), ("step", 2), ("epoch", 1)])
def test_lr_monitor_with_two_optimizers_logs_lightnings_keys_and_count(
    tmp_path: Path, interval: str | None, logged: int
) -> None:
    monitor = LearningRateMonitor(logging_interval=interval, log_momentum=True)
    trainer = quiet_trainer(tmp_path, callbacks=[monitor], logger=CSVLogger(tmp_path), max_steps=4, log_every_n_steps=1)
    trainer.fit(TwoAdams(), make_loader(8))
    # 4 optimizer steps = 2 batches of one epoch; Lightning 2.6.6 (the same program) logs these counts:
    # at "step", once a batch, not once an optimizer step.
    assert monitor.lrs == {"lr-Adam": [0.1] * logged, "lr-Adam-1": [0.2] * logged}
    assert monitor.last_momentum_values == {"lr-Adam-momentum": 0.9, "lr-Adam-1-momentum": 0.9}


def test_progress_bar_knows_its_trainer_and_validation_batches(tmp_path: Path) -> None:
    seen: list[Any] = []

    class Bar(ProgressBar):
        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            seen.append((self.trainer is trainer, self.total_train_batches, self.total_val_batches))

    bar = Bar(refresh_rate=0)
    with pytest.raises(TypeError, match="set when a Trainer sets this callback up"):
        _ = bar.trainer
    trainer = quiet_trainer(tmp_path, callbacks=[bar], max_epochs=4, check_val_every_n_epoch=2)
    trainer.fit(SeveralLoaders(), make_loader(), [make_loader(), make_loader(8)])
    # As Lightning: the validation loaders are first requested by epoch 1's validation, so its start knows none.
    assert seen == [(True, 3, 0), (True, 3, 0), (True, 3, 0), (True, 3, 5)]


def test_early_stopping_reason_is_lightnings_enum(tmp_path: Path) -> None:
    stopper = EarlyStopping(monitor="val_loss", patience=0, stopping_threshold=1e9)
    quiet_trainer(tmp_path, callbacks=[stopper], max_epochs=5).fit(Regressor(), make_loader(), make_loader())
    assert stopper.stopping_reason is EarlyStoppingReason.STOPPING_THRESHOLD
    assert stopper.stopping_reason_message is not None and "stopping threshold" in stopper.stopping_reason_message
    assert stopper.stopped_epoch == 0


# ----------------------------------------------------------------- names users import
def test_misconfiguration_exception_catches_geartrains_refusals(tmp_path: Path) -> None:
    with pytest.raises(MisconfigurationException, match="No data for fit"):
        quiet_trainer(tmp_path, max_epochs=1).fit(Regressor())


def test_rank_zero_only_runs_on_rank_zero_only() -> None:
    calls: list[int] = []

    @rank_zero_only
    def record() -> str:
        calls.append(1)
        return "done"

    assert record() == "done"
    rank_zero_only.rank = 1
    try:
        assert record() is None
    finally:
        rank_zero_only._rank = None
    assert calls == [1] and rank_zero_only.rank == 0


def test_is_overridden_as_lightning() -> None:
    class Net(Regressor):
        def on_train_start(self) -> None: ...

    net = Net()
    assert is_overridden("on_train_start", net)
    assert not is_overridden("on_train_end", net)
    assert is_overridden("validation_step", net)  # defined by the user's class (TrainModule has none)
    net.validation_step = None  # type: ignore[assignment,method-assign]
    assert not is_overridden("validation_step", net)
    assert not is_overridden("on_train_start", None)

    class Cb(Callback):
        def on_fit_end(self, trainer: Any, pl_module: Any) -> None: ...

    assert is_overridden("on_fit_end", Cb()) and not is_overridden("on_fit_start", Cb())
    with pytest.raises(ValueError, match="pass parent="):
        is_overridden("forward", nn.Linear(1, 1))
