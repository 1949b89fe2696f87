"""Lightning's module hooks change training as in Lightning (issue #13), checked against hand-written loops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F

from callbacks import EarlyStopping, ModelCheckpoint
from tests.helpers.regression import Regressor, assert_same_weights, make_loader, plain_copy
from tests.helpers.trainers import quiet_trainer
from trainer.datamodule import DataModule
from trainer.errors import MisconfigurationException

LR = 0.05


def warmup(step: int) -> float:
    return LR * min(1.0, (step + 1) / 4)


def hand_loop(model: torch.nn.Module, epochs: int, lr_at: Any = None, clip_value: float | None = None) -> None:
    """SGD(momentum 0.9) over make_loader(10, 4), optionally with an LR per step and value clipping."""
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    step = 0
    for _ in range(epochs):
        for x, y in make_loader(10, 4):
            if lr_at is not None:
                for group in opt.param_groups:
                    group["lr"] = lr_at(step)
            F.mse_loss(model(x), y).backward()
            if clip_value is not None:
                torch.nn.utils.clip_grad_value_(model.parameters(), clip_value)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1


class Warmup(Regressor):
    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        for group in optimizer.param_groups:
            group["lr"] = warmup(self.trainer.global_step)
        optimizer.step(closure=optimizer_closure)


def test_optimizer_step_override_warmup_equals_hand_loop(tmp_path: Path) -> None:
    model = Warmup()
    reference = plain_copy(model)
    quiet_trainer(tmp_path, max_epochs=2).fit(model, make_loader(10, 4))
    hand_loop(reference, 2, lr_at=warmup)
    assert_same_weights(model.net, reference)


def test_optimizer_step_runs_only_at_window_ends_under_accumulation(tmp_path: Path) -> None:
    calls: list[int] = []

    class Counting(Regressor):
        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
            calls.append(batch_idx)
            optimizer.step(closure=optimizer_closure)

    model, plain = Counting(), Regressor()
    quiet_trainer(tmp_path, max_epochs=1, accumulate_grad_batches=2).fit(model, make_loader(10, 4))
    quiet_trainer(tmp_path, max_epochs=1, accumulate_grad_batches=2).fit(plain, make_loader(10, 4))
    assert calls == [1, 2]  # 3 batches: a window of 2, then the epoch's last batch
    assert_same_weights(model.net, plain.net)


def test_optimizer_step_that_skips_the_closure_is_an_error(tmp_path: Path) -> None:
    class NoClosure(Regressor):
        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
            optimizer.step()

    with pytest.raises(
        RuntimeError, match=r"^The closure hasn't been executed.*did not run optimizer_closure"
    ) as caught:
        quiet_trainer(tmp_path, max_epochs=1).fit(NoClosure(), make_loader(10, 4))
    assert isinstance(caught.value, MisconfigurationException)  # Lightning's type


def test_optimizer_zero_grad_override_is_honoured(tmp_path: Path) -> None:
    """A module that never clears gradients: each step uses the sum of all gradients so far."""
    seen: list[tuple[int, int]] = []

    class KeepGrads(Regressor):
        def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
            seen.append((epoch, batch_idx))

    model = KeepGrads()
    reference = plain_copy(model)
    quiet_trainer(tmp_path, max_epochs=1).fit(model, make_loader(10, 4))
    opt = torch.optim.SGD(reference.parameters(), lr=LR, momentum=0.9)
    for x, y in make_loader(10, 4):
        F.mse_loss(reference(x), y).backward()
        opt.step()
    assert seen == [(0, 0), (0, 1), (0, 2)]
    assert_same_weights(model.net, reference)


def test_configure_gradient_clipping_override_equals_hand_loop(tmp_path: Path) -> None:
    class ClipValue(Regressor):
        def configure_gradient_clipping(
            self, optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None
        ) -> None:
            self.clip_gradients(optimizer, 0.01, "value")

    model = ClipValue()
    reference = plain_copy(model)
    quiet_trainer(tmp_path, max_epochs=1).fit(model, make_loader(10, 4))
    hand_loop(reference, 1, clip_value=0.01)
    assert_same_weights(model.net, reference)


def test_lr_scheduler_step_override_is_called_per_interval(tmp_path: Path) -> None:
    calls: list[Any] = []

    class Sched(Regressor):
        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=LR)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)}

        def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
            calls.append(metric)  # never steps: the LR stays

    trainer = quiet_trainer(tmp_path, max_epochs=2)
    trainer.fit(Sched(), make_loader(10, 4))
    assert calls == [None, None]
    assert trainer.optimizers[0].param_groups[0]["lr"] == LR


def test_backward_override_equals_hand_loop(tmp_path: Path) -> None:
    class Double(Regressor):
        def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            (2 * loss).backward()

    model = Double()
    reference = plain_copy(model)
    quiet_trainer(tmp_path, max_epochs=1).fit(model, make_loader(10, 4))
    opt = torch.optim.SGD(reference.parameters(), lr=LR, momentum=0.9)
    for x, y in make_loader(10, 4):
        (2 * F.mse_loss(reference(x), y)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert_same_weights(model.net, reference)


def test_configure_callbacks_replace_trainer_callbacks_of_the_same_type(tmp_path: Path) -> None:
    mine = EarlyStopping(monitor="val_loss", patience=7)

    class WithCallbacks(Regressor):
        def configure_callbacks(self) -> Any:
            return [mine]

    trainer = quiet_trainer(
        tmp_path,
        max_epochs=1,
        callbacks=[ModelCheckpoint(dirpath=tmp_path), EarlyStopping(monitor="val_loss", patience=1)],
    )
    trainer.fit(WithCallbacks(), make_loader(10, 4), make_loader(4, 4))
    stopping = [cb for cb in trainer.callbacks if isinstance(cb, EarlyStopping)]
    assert stopping == [mine]
    assert isinstance(trainer.callbacks[-1], ModelCheckpoint)  # checkpointing stays last
    assert mine.wait_count == 0 and mine.best_score is not None  # it ran


def test_configure_model_builds_layers_before_the_optimizers(tmp_path: Path) -> None:
    class Lazy(Regressor):
        def __init__(self) -> None:
            super().__init__()
            del self.net
            self.net: Any = None

        def configure_model(self) -> None:
            if self.net is None:
                torch.manual_seed(0)
                self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    model, reference = Lazy(), Regressor()
    quiet_trainer(tmp_path, max_epochs=1).fit(model, make_loader(10, 4))
    quiet_trainer(tmp_path, max_epochs=1).fit(reference, make_loader(10, 4))
    assert_same_weights(model.net, reference.net)


def test_batch_transfer_hooks_module_and_datamodule(tmp_path: Path) -> None:
    seen: list[tuple[str, float]] = []

    class Hooked(Regressor):
        def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            x, y = batch
            return [x * 2, y]

        def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
            seen.append(("transfer", float(batch[0].abs().sum())))
            return [t.to(device) for t in batch]

        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            return [batch[0] + 1, batch[1]]

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            seen.append(("step", float(batch[0].abs().sum())))
            return super().training_step(batch, batch_idx)

    x = make_loader(10, 4).dataset.tensors[0][:4]  # type: ignore[attr-defined]
    quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=1).fit(Hooked(), make_loader(10, 4))
    assert seen == [("transfer", float((x * 2).abs().sum())), ("step", float((x * 2 + 1).abs().sum()))]

    class Data(DataModule):
        def train_dataloader(self) -> Any:
            return make_loader(10, 4)

        def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            return [batch[0] * 0, batch[1]]  # the data module's hook wins over the module's

    seen.clear()
    quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=1).fit(Hooked(), datamodule=Data())
    assert seen == [("transfer", 0.0), ("step", 4.0 * 4)]


def test_model_eval_and_train_hooks(tmp_path: Path) -> None:
    calls: list[str] = []

    class Modes(Regressor):
        def on_validation_model_zero_grad(self) -> None:
            calls.append("zero_grad")

        def on_validation_model_eval(self) -> None:
            calls.append("val_eval")  # stays in training mode: the override decides

        def on_validation_model_train(self) -> None:
            calls.append("val_train")
            self.train()

        def on_test_model_eval(self) -> None:
            calls.append("test_eval")
            self.eval()

        def on_test_model_train(self) -> None:
            calls.append("test_train")

        def on_predict_model_eval(self) -> None:
            calls.append("predict_eval")
            self.eval()

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            calls.append(f"training={self.training}")

    model = Modes()
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(model, make_loader(10, 4), make_loader(4, 4))
    trainer.test(model, make_loader(4, 4))
    trainer.predict(model, make_loader(4, 4))
    assert calls == ["zero_grad", "val_eval", "training=True", "val_train", "test_eval", "test_train", "predict_eval"]


def test_hooks_set_on_the_instance_and_a_mock_callback(tmp_path: Path) -> None:
    """As Lightning: a hook set to None on the instance counts as not overridden (the default runs), the
    ``_eval`` hooks are called through the instance (a wrapper put there sees the call), and a
    ``Mock(spec=Callback)`` has its hooks called."""
    from unittest import mock

    from callbacks import Callback

    seen: list[str] = []
    model = Regressor()
    model.eval()  # the default _train hook puts back the modes from before validation
    model.net[0].train()
    model.on_validation_model_train = None  # type: ignore[assignment,method-assign]
    model.on_validation_model_eval = lambda: (seen.append("val_eval"), model.eval())  # type: ignore[method-assign]
    callback = mock.MagicMock(spec=Callback)
    callback.state_key = "mock"
    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[callback])
    trainer.validate(model, make_loader(4, 4), verbose=False)
    assert seen == ["val_eval"] and not model.training and model.net[0].training
    callback.setup.assert_called_once_with(trainer, model, stage="validate")  # by name, as Lightning passes it
    callback.teardown.assert_called_once_with(trainer, model, stage="validate")


def test_on_exception_reaches_module_and_datamodule(tmp_path: Path) -> None:
    got: list[str] = []

    class Boom(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            raise KeyError("boom")

        def on_exception(self, exception: BaseException) -> None:
            got.append(f"module {exception!r}")

    class Data(DataModule):
        def train_dataloader(self) -> Any:
            return make_loader(10, 4)

        def on_exception(self, exception: BaseException) -> None:
            got.append("datamodule")

    with pytest.raises(KeyError):
        quiet_trainer(tmp_path, max_epochs=1).fit(Boom(), datamodule=Data())
    assert got == ["module KeyError('boom')", "datamodule"]


def test_steps_without_batch_idx(tmp_path: Path) -> None:
    class NoIndex(Regressor):
        def training_step(self, batch: Any) -> Any:  # type: ignore[override]
            x, y = batch
            return F.mse_loss(self(x), y)

        def validation_step(self, batch: Any) -> None:  # type: ignore[override]
            self.log("val_loss", F.mse_loss(self(batch[0]), batch[1]))

        def predict_step(self, batch: Any) -> torch.Tensor:  # type: ignore[override]
            return self(batch[0])

    model, reference = NoIndex(), Regressor()
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(model, make_loader(10, 4), make_loader(4, 4))
    quiet_trainer(tmp_path, max_epochs=1).fit(reference, make_loader(10, 4))
    assert_same_weights(model.net, reference.net)
    assert "val_loss" in trainer.callback_metrics
    assert len(trainer.predict(model, make_loader(4, 2))) == 2


def test_optimizer_step_override_keeps_fp16_overflow_skips(tmp_path: Path) -> None:
    from tests.test_strategies_precision import OneWeight, WeightHistory, _fp16_trainer

    class Overridden(OneWeight):
        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
            optimizer.step(closure=optimizer_closure)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.full((3, 1), 0.25)), batch_size=1)
    runs = []
    for module in (OneWeight(overflow_at=1), Overridden(overflow_at=1)):
        history = WeightHistory()
        trainer = _fp16_trainer(tmp_path / type(module).__name__, max_steps=3, callbacks=[history])
        trainer.fit(module, data)
        runs.append((history.history, trainer.global_step, trainer.progress.skipped_steps))
    assert runs[0] == runs[1] and runs[1][2] == 1


def test_optimizer_step_override_keeps_the_nonfinite_policy(tmp_path: Path) -> None:
    from tests.test_trainer_nonfinite import SpikyModule, nan_data

    class Overridden(SpikyModule):
        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
            optimizer.step(closure=optimizer_closure)

    torch.manual_seed(0)
    plain = SpikyModule({2, 4})
    torch.manual_seed(0)
    overridden = Overridden({2, 4})
    t1 = quiet_trainer(tmp_path, max_epochs=1, on_nonfinite="skip")
    t1.fit(plain, nan_data())
    t2 = quiet_trainer(tmp_path, max_epochs=1, on_nonfinite="skip")
    t2.fit(overridden, nan_data())
    assert t2.progress.nonfinite_skipped == t1.progress.nonfinite_skipped == 2
    assert t2.global_step == t1.global_step
    assert torch.equal(plain.layer.weight, overridden.layer.weight)


def test_setup_and_teardown_get_the_stage_as_lightnings_trainer_fn(tmp_path: Path) -> None:
    from callbacks import Callback
    from trainer.state import TrainerFn

    seen: list[tuple[str, Any]] = []

    class Records(Callback):
        def setup(self, trainer: Any, pl_module: Any, stage: Any) -> None:
            seen.append(("callback", stage))

    class Stages(Regressor):
        def setup(self, stage: Any) -> None:
            seen.append(("module", stage))

        def teardown(self, stage: Any) -> None:
            seen.append(("teardown", stage))

    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[Records()])
    trainer.fit(Stages(), make_loader(4, 4))
    trainer.test(Stages(), make_loader(4, 4))
    assert [(who, stage.value) for who, stage in seen] == [
        ("callback", "fit"), ("module", "fit"), ("teardown", "fit"),
        ("callback", "test"), ("module", "test"), ("teardown", "test"),
    ]  # fmt: skip
    stage = seen[0][1]
    assert stage is TrainerFn.FITTING and stage == "fit" and stage == "FIT" and {"fit": 1}[stage] == 1
