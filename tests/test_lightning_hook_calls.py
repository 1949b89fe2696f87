"""Which hooks a run calls, and how, as Lightning calls them (issue #33: Lightning's whole-run hook lists).

A hook left at TrainModule's own default may be skipped (the plain path does the same), but anything
else on the instance is called: a wrapper put there over the default sees every call, with Lightning's
arguments, and the weights stay those of the unwrapped run. ``setup``/``teardown`` get ``stage=`` by name;
``configure_model`` runs only where overridden; a stage limited to no batch requests no data; each stage
frees the module's gradients first; the stage's end asks no callback for its state.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks.base import Callback
from tests.helpers.regression import Regressor, assert_same_weights, make_loader
from tests.helpers.trainers import quiet_trainer
from trainer import DataModule, TrainModule
from trainer.common.errors import MisconfigurationException, MissingStepError
from trainer.hooks import is_overridden

#: TrainModule defaults a run may bind to its plain path; each is wrapped on the instance below.
WRAPPED = (
    "on_before_batch_transfer",
    "transfer_batch_to_device",
    "on_after_batch_transfer",
    "backward",
    "optimizer_step",
    "optimizer_zero_grad",
    "configure_gradient_clipping",
    "clip_gradients",
    "on_validation_model_zero_grad",
)


def _wrap_on_instance(model: TrainModule, calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> None:
    """Put a recording wrapper over each default of :data:`WRAPPED` on ``model`` itself, as Lightning's tests do."""

    def call(name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((name, args, kwargs))
        return fn(*args, **kwargs)

    for name in WRAPPED:
        bound = getattr(model, name)
        wrapper = functools.partial(call, name, bound)
        functools.update_wrapper(wrapper, bound)
        setattr(model, name, wrapper)


def test_wrappers_on_the_instance_are_called_with_lightnings_arguments_and_train_alike(tmp_path: Path) -> None:
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    wrapped, plain = Regressor(), Regressor()
    _wrap_on_instance(wrapped, calls)
    for model in (wrapped, plain):
        trainer = quiet_trainer(tmp_path, max_epochs=1, limit_val_batches=1)
        trainer.fit(model, make_loader(8, 4), make_loader(4, 4))
    assert_same_weights(wrapped, plain)  # the wrappers call the defaults: the same arithmetic
    names = [name for name, _, _ in calls]
    per_batch = ["on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer"]
    assert names[:3] == per_batch and names.count("transfer_batch_to_device") == 2 + 1  # 2 training, 1 validation
    assert names.count("optimizer_step") == names.count("backward") == names.count("optimizer_zero_grad") == 2
    clip = [(args[1:], kwargs) for name, args, kwargs in calls if name == "configure_gradient_clipping"]
    assert clip == [((), {"gradient_clip_val": None, "gradient_clip_algorithm": None})] * 2  # by name, as Lightning
    assert names.count("clip_gradients") == 2
    assert names.count("on_validation_model_zero_grad") == 1  # before the validation of fit, not the sanity check
    transfer = next(args for name, args, _ in calls if name == "transfer_batch_to_device")
    assert transfer[1:] == (torch.device("cpu"), 0)


def test_setup_and_teardown_get_stage_by_name_on_every_side(tmp_path: Path) -> None:
    seen: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    class Data(DataModule):
        def setup(self, *args: Any, **kwargs: Any) -> None:
            seen.append(("dm.setup", args, kwargs))

        def teardown(self, *args: Any, **kwargs: Any) -> None:
            seen.append(("dm.teardown", args, kwargs))

        def test_dataloader(self) -> Any:
            return make_loader(4, 4)

    class Model(Regressor):
        def setup(self, *args: Any, **kwargs: Any) -> None:
            seen.append(("setup", args, kwargs))

        def teardown(self, *args: Any, **kwargs: Any) -> None:
            seen.append(("teardown", args, kwargs))

    callback = mock.MagicMock(spec=Callback)
    callback.state_key = "mock"
    trainer = quiet_trainer(tmp_path, callbacks=[callback])
    model = Model()
    trainer.test(model, datamodule=Data(), verbose=False)
    stage = {"stage": "test"}
    assert seen == [("dm.setup", (), stage), ("setup", (), stage), ("dm.teardown", (), stage), ("teardown", (), stage)]
    callback.setup.assert_called_once_with(trainer, model, stage="test")
    callback.teardown.assert_called_once_with(trainer, model, stage="test")


def test_loader_and_step_defaults_are_lightnings(tmp_path: Path) -> None:
    """TrainModule and DataModule have Lightning's ``*_dataloader`` defaults (raising its error) and
    TrainModule its do-nothing ``validation_step``/``test_step``, which count as not overridden."""
    for owner in (TrainModule(), DataModule()):
        for method in ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader"):
            with pytest.raises(MisconfigurationException, match=f"`{method}` must be implemented"):
                getattr(owner, method)()
    assert TrainModule().validation_step(None, 0) is None and TrainModule().test_step(None, 0) is None

    class NoEval(Regressor):
        validation_step = TrainModule.validation_step
        test_step = TrainModule.test_step

    model = NoEval()
    assert not is_overridden("validation_step", model) and not is_overridden("test_step", model)
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    with pytest.warns(UserWarning, match="no `validation_step`"):
        trainer.fit(model, make_loader(8, 4), make_loader(4, 4))
    assert trainer.num_val_batches == []  # never validated
    with pytest.raises(MissingStepError, match=r"No `test_step\(\)` method defined to run `Trainer.test`"):
        trainer.test(model, make_loader(4, 4))


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_a_stage_limited_to_no_batch_requests_no_data_and_runs_no_loop(stage: str, tmp_path: Path) -> None:
    calls: list[str] = []

    class Model(Regressor):
        def val_dataloader(self) -> Any:
            calls.append("val_dataloader")
            return make_loader(4, 4)

        test_dataloader = predict_dataloader = val_dataloader

        def on_validation_start(self) -> None:
            calls.append("on_validation_start")

        on_test_start = on_predict_start = on_validation_start

    limit = {"validate": "limit_val_batches", "test": "limit_test_batches", "predict": "limit_predict_batches"}
    trainer = quiet_trainer(tmp_path, **{limit[stage]: 0})
    kwargs = {"verbose": False} if stage != "predict" else {}
    out = getattr(trainer, stage)(Model(), **kwargs)
    assert calls == []
    assert out == (None if stage == "predict" else [])  # as Lightning returns


def test_configure_model_runs_only_where_overridden(tmp_path: Path) -> None:
    calls: list[str] = []

    class Model(Regressor):
        def configure_model(self) -> None:
            calls.append("configure_model")

    model = Model()
    model.configure_sharded_model = mock.Mock(wraps=model.configure_sharded_model)  # type: ignore[method-assign]
    trainer = quiet_trainer(tmp_path)
    trainer.predict(model, make_loader(4, 4))
    assert calls == ["configure_model"]
    model.configure_sharded_model.assert_not_called()  # a Mock wrapping the default is not an override

    class Off(Regressor):
        configure_model = None  # type: ignore[assignment]

    assert not is_overridden("configure_model", Off())
    trainer.predict(Off(), make_loader(4, 4))  # no TypeError from calling None


@pytest.mark.parametrize("stage", ["fit", "validate"])
def test_each_stage_frees_the_gradients_left_before_it(stage: str, tmp_path: Path) -> None:
    """As Lightning's stage start: ``module.zero_grad()``, so a fit does not add to gradients left from earlier."""
    model, plain = Regressor(), Regressor()
    model(torch.ones(2, 4)).sum().backward()  # gradients left by code before the run
    seen: list[bool] = []

    class Look(Callback):
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            seen.append(all(p.grad is not None for p in pl_module.parameters()))

        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            seen.append(all(p.grad is None for p in pl_module.parameters()))

    trainer = quiet_trainer(tmp_path, callbacks=[Look()], max_epochs=1)
    if stage == "fit":
        trainer.fit(model, make_loader(8, 4))
        quiet_trainer(tmp_path, max_epochs=1).fit(plain, make_loader(8, 4))
        assert_same_weights(model, plain)  # the leftover gradients did not join the first step
    else:
        trainer.validate(model, make_loader(4, 4), verbose=False)
        assert seen == [True]
        assert all(p.grad is None for p in model.parameters())


def test_the_stages_end_asks_no_callback_for_its_state(tmp_path: Path) -> None:
    class Counts(Callback):
        asked = 0

        def state_dict(self) -> dict[str, Any]:
            Counts.asked += 1
            return {}

    trainer = quiet_trainer(tmp_path, callbacks=[Counts()])
    trainer.predict(Regressor(), make_loader(4, 4))
    trainer.validate(Regressor(), make_loader(4, 4), verbose=False)
    assert Counts.asked == 0  # Lightning asks only when it writes a checkpoint


def test_transfer_hooks_are_the_data_modules_only_where_it_overrides_them(tmp_path: Path) -> None:
    """Lightning's choice by ``is_overridden``: a wrapper over the data module's default is not an override, so the
    module's hook (here a wrapper of its own) is the one called."""
    called: list[str] = []

    class Data(DataModule):
        def test_dataloader(self) -> Any:
            return make_loader(4, 4)

    dm, model = Data(), Regressor()
    dm.transfer_batch_to_device = mock.Mock(wraps=dm.transfer_batch_to_device)  # type: ignore[method-assign]
    default = model.transfer_batch_to_device
    model.transfer_batch_to_device = lambda *args: (called.append("module"), default(*args))[1]  # type: ignore[method-assign]
    quiet_trainer(tmp_path).test(model, datamodule=dm, verbose=False)
    assert called == ["module"]
    dm.transfer_batch_to_device.assert_not_called()


def test_from_datasets_passes_lightnings_loader_options_and_init_arguments() -> None:
    class Sized(DataModule):
        def __init__(self, batch_size: int = 1, other: int = 0) -> None:
            super().__init__()
            self.batch_size, self.other = batch_size, other

    ds = TensorDataset(torch.arange(8.0))
    dm = Sized.from_datasets(ds, batch_size=4, num_workers=0, other=5)
    assert (dm.batch_size, dm.other) == (4, 5)  # batch_size reaches __init__ because it takes it
    with mock.patch("trainer.lightning.core.datamodule.DataLoader") as loader:  # Lightning's module path
        dm.train_dataloader()
    loader.assert_called_once_with(ds, batch_size=4, shuffle=True, num_workers=0, pin_memory=True)
    assert isinstance(dm.train_dataloader(), DataLoader)  # the patch ended: torch's class again
    with pytest.raises(MisconfigurationException, match="`val_dataloader` must be implemented"):
        dm.val_dataloader()


def test_is_overridden_sees_through_mocks_and_wrappers_of_none() -> None:
    model = Regressor()
    assert not is_overridden("on_train_start", model)
    model.on_train_start = mock.Mock(wraps=model.on_train_start)  # type: ignore[method-assign]
    assert not is_overridden("on_train_start", model)  # it wraps the default
    model.on_train_start = mock.Mock(wraps=lambda: None)  # type: ignore[method-assign]
    assert is_overridden("on_train_start", model)
    wrapper = functools.partial(print)
    wrapper.__wrapped__ = None  # type: ignore[attr-defined]  # what update_wrapper leaves around None
    model.on_train_start = wrapper  # type: ignore[method-assign]
    assert not is_overridden("on_train_start", model)


def test_a_manual_optimizers_repr_is_lightnings(tmp_path: Path) -> None:
    seen: list[str] = []

    class Manual(Regressor):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> None:
            opt = self.optimizers()
            seen.append(str(opt))
            opt.zero_grad()
            self.manual_backward(super().training_step(batch, batch_idx))
            opt.step()

    model = Manual()
    quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=1).fit(model, make_loader(4, 4))
    assert seen == ["Lightning" + str(model.trainer.optimizers[0])]
    assert seen[0].startswith("LightningSGD (")


def test_manual_backward_calls_the_backward_hooks_around_it(tmp_path: Path) -> None:
    """As Lightning's ``manual_backward``: callbacks then the module get ``on_before_backward(loss)`` before the
    backward and ``on_after_backward`` after it, the gradients there."""
    calls: list[str] = []

    class Says(Callback):
        def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
            calls.append("cb.before")

        def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
            calls.append("cb.after")

    class Manual(Regressor):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> None:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(super().training_step(batch, batch_idx))
            calls.append("backward done")
            opt.step()

        def on_before_backward(self, loss: torch.Tensor) -> None:
            calls.append(f"before grad={self.net[0].weight.grad is not None}")

        def on_after_backward(self) -> None:
            calls.append(f"after grad={self.net[0].weight.grad is not None}")

    trainer = quiet_trainer(tmp_path, callbacks=[Says()], max_epochs=1, limit_train_batches=1)
    trainer.fit(Manual(), make_loader(4, 4))
    assert calls == ["cb.before", "before grad=False", "cb.after", "after grad=True", "backward done"]


def test_the_data_modules_state_is_also_under_its_class_name(tmp_path: Path) -> None:
    """Where Lightning's checkpoint keeps it (``checkpoint[type(dm).__qualname__]``), so Lightning restores it."""

    class Cursor(DataModule):
        def train_dataloader(self) -> Any:
            return make_loader(8, 4)

        def state_dict(self) -> dict[str, Any]:
            return {"cursor": 3}

    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(Regressor(), datamodule=Cursor())
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    ckpt = torch.load(tmp_path / "a.ckpt", weights_only=True)
    assert ckpt[Cursor.__qualname__] == ckpt["datamodule"] == {"cursor": 3}
