"""Hooks fire in the order documented in ``trainer/loops`` (``fit_loop`` and ``eval_loop``), callbacks and
module in the order :mod:`trainer.hook_order` declares (Lightning's)."""

from __future__ import annotations

from typing import Any

import torch

from callbacks.base import DISPATCHED_HOOKS, Callback
from tests.helpers.regression import Regressor, make_loader
from tests.helpers.tiny_mlp import TinyMLP, make_batches
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule
from trainer.hook_order import dispatch
from trainer.module_hooks import ModelHooks

# The notification hooks (the base class's do-nothing ones; TrainModule takes them from ModelHooks).
MODULE_HOOKS = [name for name in vars(ModelHooks) if name.startswith("on_")] + ["setup", "teardown"]
STEPS = ["training_step", "validation_step", "test_step", "predict_step", "configure_optimizers"]


class HookModule(Regressor):
    """Records every hook and step call into ``self.calls`` (shared with :class:`HookCallback`)."""

    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls


class HookCallback(Callback):
    """Records every callback hook, prefixed with ``cb.``."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls


def _module_recorder(name: str) -> Any:
    def hook(self: HookModule, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(name)
        return getattr(Regressor, name)(self, *args, **kwargs)

    return hook


def _callback_recorder(name: str) -> Any:
    def hook(self: HookCallback, trainer: Any, module: Any, *args: Any, **kwargs: Any) -> None:
        self.calls.append(f"cb.{name}")

    return hook


for _name in MODULE_HOOKS + STEPS:
    setattr(HookModule, _name, _module_recorder(_name))
for _name in DISPATCHED_HOOKS:
    setattr(HookCallback, _name, _callback_recorder(_name))


def both(*hooks: str) -> list[str]:
    """Each hook on the module and on the (non-monitoring) callback, in :func:`~trainer.hook_order.dispatch`'s order."""
    sides = {"module": "{}", "callbacks": "cb.{}", "others": "cb.{}", "monitors": None}
    return [side.format(hook) for hook in hooks for name in dispatch(hook) if (side := sides[name]) is not None]


def eval_sequence(prefix: str, batches: int, logged: bool) -> list[str]:
    step = {"validation": "validation_step", "test": "test_step"}[prefix]
    seq = both(f"on_{prefix}_start", f"on_{prefix}_epoch_start")
    for _ in range(batches):
        seq += [*both(f"on_{prefix}_batch_start"), step, *both(f"on_{prefix}_batch_end")]
    seq += both(f"on_{prefix}_epoch_end") + (["cb.on_log_metrics"] if logged else [])
    return seq + both(f"on_{prefix}_end")


def train_batch_sequence(steps: bool) -> list[str]:
    seq = [*both("on_train_batch_start"), "training_step", *both("on_before_backward", "on_after_backward")]
    if steps:
        seq += both("on_before_optimizer_step", "on_before_zero_grad")
    return seq + both("on_train_batch_end")


def test_fit_hook_order(make_trainer: Any) -> None:
    calls: list[str] = []
    trainer = make_trainer(max_epochs=1, num_sanity_val_steps=1, callbacks=[HookCallback(calls)])
    trainer.fit(HookModule(calls), make_loader(4, 2), make_loader(2, 2))

    expected = [
        *both("setup"),
        "configure_optimizers",
        *both("on_fit_start"),
        "cb.on_sanity_check_start",
        *eval_sequence("validation", 1, logged=False),  # sanity values never reach the loggers
        "cb.on_sanity_check_end",
        *both("on_train_start", "on_train_epoch_start"),
        *train_batch_sequence(steps=True),
        *train_batch_sequence(steps=True),
        *eval_sequence("validation", 1, logged=True),  # validation runs before on_train_epoch_end
        *both("on_train_epoch_end", "on_train_end", "on_fit_end"),
        "cb.teardown",
        "teardown",
    ]
    assert calls == expected


def test_accumulation_calls_step_hooks_once_per_window(make_trainer: Any) -> None:
    calls: list[str] = []
    trainer = make_trainer(max_epochs=1, accumulate_grad_batches=2, callbacks=[HookCallback(calls)])
    trainer.fit(HookModule(calls), make_loader(6, 2))  # 3 batches: windows [0, 1] and [2]
    start = calls.index("on_train_epoch_start") + 1
    expected = train_batch_sequence(steps=False) + train_batch_sequence(steps=True) * 2
    assert calls[start : start + len(expected)] == expected
    assert trainer.global_step == 2


def test_validate_test_predict_hook_order(make_trainer: Any) -> None:
    calls: list[str] = []
    trainer = make_trainer(callbacks=[HookCallback(calls)])
    module = HookModule(calls)

    trainer.validate(module, make_loader(4, 2))
    assert calls == [*both("setup"), *eval_sequence("validation", 2, logged=True), "cb.teardown", "teardown"]

    calls.clear()
    trainer.test(module, make_loader(2, 2))
    assert calls == [*both("setup"), *eval_sequence("test", 1, logged=True), "cb.teardown", "teardown"]

    calls.clear()
    trainer.predict(module, make_loader(4, 2))
    per_batch = [*both("on_predict_batch_start"), "predict_step", *both("on_predict_batch_end")]
    assert calls == [
        *both("setup", "on_predict_start", "on_predict_epoch_start"),
        *per_batch,
        *per_batch,
        *both("on_predict_epoch_end", "on_predict_end"),
        "cb.teardown",
        "teardown",
    ]


def test_on_train_batch_start_returning_minus_one_ends_the_epoch(make_trainer: Any) -> None:
    class Stopper(Regressor):
        seen: list[tuple[int, int]] = []

        def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
            self.seen.append((self.current_epoch, batch_idx))
            return -1 if batch_idx == 1 else None

    module = Stopper()
    before = [p.detach().clone() for p in module.parameters()]
    trainer = make_trainer(max_epochs=2)
    trainer.fit(module, make_loader(8, 2))
    assert module.seen == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert trainer.global_step == 2  # batch 1 never ran in either epoch
    assert not all(torch.equal(a, b) for a, b in zip(before, module.parameters()))


def test_exception_reaches_callbacks_and_teardown_still_runs(make_trainer: Any) -> None:
    calls: list[str] = []

    class Boom(HookModule):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            raise RuntimeError("boom")

    trainer = make_trainer(max_epochs=1, callbacks=[HookCallback(calls)])
    try:
        trainer.fit(Boom(calls), make_loader(4, 2))
    except RuntimeError as err:
        assert str(err) == "boom"
    else:  # pragma: no cover - the test fails below
        raise AssertionError("the error was swallowed")
    assert calls[-3:] == ["cb.on_exception", "cb.teardown", "teardown"]


def test_train_and_eval_modes_and_gradients_per_stage(make_trainer: Any) -> None:
    seen: list[tuple[str, bool, bool, bool]] = []  # (step, sanity?, module.training, grad enabled)

    class Modes(Regressor):
        def _note(self, step: str) -> None:
            sanity = self._trainer is not None and self._trainer.sanity_checking
            seen.append((step, sanity, self.training, torch.is_grad_enabled()))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self._note("train")
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self._note("val")

        def predict_step(self, batch: Any, batch_idx: int) -> Any:
            self._note("predict")
            return None

    module = Modes()
    trainer = make_trainer(max_epochs=1, num_sanity_val_steps=1, val_check_interval=1)
    trainer.fit(module, make_loader(4, 2), make_loader(2, 2))
    trainer.predict(module, make_loader(2, 2))
    assert seen == [
        ("val", True, False, False),
        ("train", False, True, True),
        ("val", False, False, False),  # val_check_interval=1: after every batch
        ("train", False, True, True),  # back in training mode after validation
        ("val", False, False, False),
        ("predict", False, False, False),
    ]
    assert module.training


def test_loss_equal_to_minus_one_does_not_end_the_epoch() -> None:
    """Only ``on_train_batch_start`` returning -1 ends an epoch; a loss tensor of -1 must not."""

    class MinusOne(TinyMLP):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return (self.net(batch[0]) * 0).sum() - 1.0

    trainer = quiet_trainer(strategy="auto", num_sanity_val_steps=2, max_epochs=1)
    trainer.fit(MinusOne(), train_dataloaders=make_batches(4))
    assert trainer.global_step == 4


def test_hooks_dispatch_callbacks_in_order_then_module() -> None:
    calls: list[str] = []

    class Recorder(Callback):
        def __init__(self, name: str) -> None:
            self.name = name

        def on_before_zero_grad(self, trainer: Trainer, module: TrainModule, optimizer: Any) -> None:
            calls.append(self.name)

    class Module(TinyMLP):
        def on_before_zero_grad(self, optimizer: Any) -> None:
            calls.append("module")

        def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
            return -1 if batch_idx == 2 else None

    module = Module()
    module.on_after_backward = lambda: calls.append("instance")  # type: ignore[method-assign]
    trainer = quiet_trainer(
        callbacks=[Recorder("a"), Recorder("b")], strategy="auto", num_sanity_val_steps=2, max_epochs=1
    )
    trainer.fit(module, train_dataloaders=make_batches(5))
    assert trainer.global_step == 2  # the module's -1 ended the epoch at batch 2
    assert calls == ["instance", "a", "b", "module"] * 2  # on_after_backward, then on_before_zero_grad
