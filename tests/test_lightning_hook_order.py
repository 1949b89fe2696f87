"""Hooks run in Lightning 2.6's order (issue #13).

The ``LIGHTNING_*`` lists were recorded from pytorch-lightning 2.6.6 by
``tests/data/lightning/record_hook_order.py`` with the same module and options as :func:`record`
below. geartrain differs in three documented places (docs/lightning.md, "TrainModule and
DataModule"), applied by :func:`as_geartrain`; any other difference fails the test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback, ModelCheckpoint
from callbacks.base import HOOKS
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule

LIGHTNING_FIT = [
    "configure_callbacks",
    "prepare_data",
    "setup",
    "configure_model",
    "configure_optimizers",
    "on_fit_start",
    "train_dataloader",
    "val_dataloader",
    "on_train_start",
    "on_train_epoch_start",
    "on_before_batch_transfer",
    "transfer_batch_to_device",
    "on_after_batch_transfer",
    "on_train_batch_start",
    "optimizer_step",
    "training_step",
    "on_before_zero_grad",
    "optimizer_zero_grad",
    "on_before_backward",
    "backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "configure_gradient_clipping",
    "on_train_batch_end",
    "on_before_batch_transfer",
    "transfer_batch_to_device",
    "on_after_batch_transfer",
    "on_train_batch_start",
    "optimizer_step",
    "training_step",
    "on_before_zero_grad",
    "optimizer_zero_grad",
    "on_before_backward",
    "backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "configure_gradient_clipping",
    "lr_scheduler_step",
    "on_train_batch_end",
    "on_validation_model_zero_grad",
    "on_validation_model_eval",
    "on_validation_start",
    "on_validation_epoch_start",
    "on_before_batch_transfer",
    "transfer_batch_to_device",
    "on_after_batch_transfer",
    "on_validation_batch_start",
    "validation_step",
    "on_validation_batch_end",
    "on_validation_epoch_end",
    "on_validation_end",
    "on_validation_model_train",
    "on_train_epoch_end",
    "on_train_end",
    "on_fit_end",
    "teardown",
]

LIGHTNING_FIT_ACC = [
    "configure_callbacks",
    "prepare_data",
    "setup",
    "configure_model",
    "configure_optimizers",
    "on_fit_start",
    "train_dataloader",
    "val_dataloader",
    "on_train_start",
    "on_train_epoch_start",
    "on_before_batch_transfer",
    "transfer_batch_to_device",
    "on_after_batch_transfer",
    "on_train_batch_start",
    "training_step",
    "on_before_zero_grad",
    "optimizer_zero_grad",
    "on_before_backward",
    "backward",
    "on_after_backward",
    "on_train_batch_end",
    "on_before_batch_transfer",
    "transfer_batch_to_device",
    "on_after_batch_transfer",
    "on_train_batch_start",
    "optimizer_step",
    "training_step",
    "on_before_backward",
    "backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "configure_gradient_clipping",
    "lr_scheduler_step",
    "on_train_batch_end",
    "on_validation_model_zero_grad",
    "on_validation_model_eval",
    "on_validation_start",
    "on_validation_epoch_start",
    "on_before_batch_transfer",
    "transfer_batch_to_device",
    "on_after_batch_transfer",
    "on_validation_batch_start",
    "validation_step",
    "on_validation_batch_end",
    "on_validation_epoch_end",
    "on_validation_end",
    "on_validation_model_train",
    "on_train_epoch_end",
    "on_train_end",
    "on_fit_end",
    "teardown",
]

LIGHTNING_VALIDATE = [
    "configure_callbacks",
    "prepare_data",
    "setup",
    "configure_model",
    "val_dataloader",
    "on_validation_model_eval",
    "on_validation_start",
    "on_validation_epoch_start",
    "on_before_batch_transfer",
    "transfer_batch_to_device",
    "on_after_batch_transfer",
    "on_validation_batch_start",
    "validation_step",
    "on_validation_batch_end",
    "on_validation_epoch_end",
    "on_validation_end",
    "on_validation_model_train",
    "teardown",
]

LIGHTNING_TEST = [
    "configure_callbacks",
    "prepare_data",
    "setup",
    "configure_model",
    "test_dataloader",
    "on_test_model_eval",
    "on_test_start",
    "on_test_epoch_start",
    "on_before_batch_transfer",
    "transfer_batch_to_device",
    "on_after_batch_transfer",
    "on_test_batch_start",
    "test_step",
    "on_test_batch_end",
    "on_test_epoch_end",
    "on_test_end",
    "on_test_model_train",
    "teardown",
]

LIGHTNING_PREDICT = [
    "configure_callbacks",
    "prepare_data",
    "setup",
    "configure_model",
    "predict_dataloader",
    "on_predict_model_eval",
    "on_predict_start",
    "on_predict_epoch_start",
    "on_before_batch_transfer",
    "transfer_batch_to_device",
    "on_after_batch_transfer",
    "on_predict_batch_start",
    "predict_step",
    "on_predict_batch_end",
    "on_predict_epoch_end",
    "on_predict_end",
    "teardown",
]


RECORDED = [
    "configure_callbacks",
    "prepare_data",
    "setup",
    "teardown",
    "configure_model",
    "configure_optimizers",
    "optimizer_step",
    "optimizer_zero_grad",
    "configure_gradient_clipping",
    "lr_scheduler_step",
    "transfer_batch_to_device",
    "training_step",
    "validation_step",
    "test_step",
    "predict_step",
    "train_dataloader",
    "val_dataloader",
    "test_dataloader",
    "predict_dataloader",
    "backward",
] + [name for name in dir(TrainModule) if name.startswith("on_") and name not in ("on_exception", "on_gpu")]


def as_geartrain(lightning: list[str]) -> list[str]:
    """Lightning's order with geartrain's documented differences applied.

    1. ``on_before_zero_grad``/``optimizer_zero_grad`` run after the optimizer step (right after
       ``configure_gradient_clipping`` and the step), not before the next backward: the gradients
       are freed before validation and checkpoints; the arithmetic is the same.
    2. Epoch-interval schedulers step after ``on_train_epoch_end`` (after validation, so a
       ReduceLROnPlateau sees this epoch's value), not at the epoch's last batch.
    """
    out = [h for h in lightning if h not in ("on_before_zero_grad", "optimizer_zero_grad")]
    out = [h for h in out if h != "lr_scheduler_step"]
    result: list[str] = []
    for hook in out:
        result.append(hook)
        if hook == "configure_gradient_clipping":
            result += ["on_before_zero_grad", "optimizer_zero_grad"]
        if hook == "on_train_epoch_end" and "lr_scheduler_step" in lightning:
            result.append("lr_scheduler_step")
    return result


def record(stage: str) -> list[str]:
    """Run ``stage`` with a module that records every hook (each calls the base class's)."""
    calls: list[str] = []

    class Recorder(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.l = nn.Linear(2, 1)

        def training_step(self, b: Any, i: int) -> torch.Tensor:
            return self.l(b[0]).sum()

        def validation_step(self, b: Any, i: int) -> None:
            self.log("v", self.l(b[0]).sum())

        def test_step(self, b: Any, i: int) -> None:
            pass

        def predict_step(self, b: Any, i: int) -> torch.Tensor:
            return self.l(b[0])

        def configure_optimizers(self) -> Any:
            o = torch.optim.SGD(self.parameters(), lr=0.1)
            return {"optimizer": o, "lr_scheduler": torch.optim.lr_scheduler.StepLR(o, 1)}

        def train_dataloader(self) -> Any:
            return DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2)

        def val_dataloader(self) -> Any:
            return DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)

        def test_dataloader(self) -> Any:
            return DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)

        def predict_dataloader(self) -> Any:
            return DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)

    def wrap(name: str) -> Any:
        base = getattr(Recorder, name)

        def hook(self: Recorder, *args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return base(self, *args, **kwargs)

        return hook

    for name in RECORDED:
        setattr(Recorder, name, wrap(name))
    module = Recorder()
    if stage == "fit":
        quiet_trainer(max_epochs=1, gradient_clip_val=1.0).fit(module)
    elif stage == "fit_acc":
        quiet_trainer(max_epochs=1, accumulate_grad_batches=2).fit(module)
    else:
        getattr(quiet_trainer(), stage)(module)
    return calls


@pytest.mark.parametrize(
    ("stage", "lightning"),
    [
        ("fit", LIGHTNING_FIT),
        ("fit_acc", LIGHTNING_FIT_ACC),
        ("validate", LIGHTNING_VALIDATE),
        ("test", LIGHTNING_TEST),
        ("predict", LIGHTNING_PREDICT),
    ],
)
def test_hook_order_matches_lightning(stage: str, lightning: list[str]) -> None:
    assert record(stage) == as_geartrain(lightning)


# Module (bare), a callback (``cb.``) and a ModelCheckpoint subclass (``ckpt.``), recorded from Lightning 2.6.6
# by ``tests/data/lightning/record_hook_order.py dispatch STAGE`` (fit: one epoch of 2 batches, a sanity check of 1;
# resume: one more epoch from last.ckpt).
LIGHTNING_DISPATCH_FIT = [
    "cb.setup",
    "setup",
    "cb.on_fit_start",
    "on_fit_start",
    "cb.on_sanity_check_start",
    "on_validation_model_eval",
    "cb.on_validation_start",
    "on_validation_start",
    "cb.on_validation_epoch_start",
    "on_validation_epoch_start",
    "cb.on_validation_batch_start",
    "on_validation_batch_start",
    "cb.on_validation_batch_end",
    "on_validation_batch_end",
    "cb.on_validation_epoch_end",
    "on_validation_epoch_end",
    "cb.on_validation_end",
    "ckpt.on_validation_end",
    "on_validation_end",
    "on_validation_model_train",
    "cb.on_sanity_check_end",
    "cb.on_train_start",
    "on_train_start",
    "cb.on_train_epoch_start",
    "on_train_epoch_start",
    "cb.on_train_batch_start",
    "on_train_batch_start",
    "cb.on_before_zero_grad",
    "on_before_zero_grad",
    "cb.on_before_backward",
    "on_before_backward",
    "cb.on_after_backward",
    "on_after_backward",
    "cb.on_before_optimizer_step",
    "on_before_optimizer_step",
    "cb.on_train_batch_end",
    "on_train_batch_end",
    "cb.on_train_batch_start",
    "on_train_batch_start",
    "cb.on_before_zero_grad",
    "on_before_zero_grad",
    "cb.on_before_backward",
    "on_before_backward",
    "cb.on_after_backward",
    "on_after_backward",
    "cb.on_before_optimizer_step",
    "on_before_optimizer_step",
    "cb.on_train_batch_end",
    "on_train_batch_end",
    "on_validation_model_zero_grad",
    "on_validation_model_eval",
    "cb.on_validation_start",
    "on_validation_start",
    "cb.on_validation_epoch_start",
    "on_validation_epoch_start",
    "cb.on_validation_batch_start",
    "on_validation_batch_start",
    "cb.on_validation_batch_end",
    "on_validation_batch_end",
    "cb.on_validation_epoch_end",
    "on_validation_epoch_end",
    "cb.on_validation_end",
    "ckpt.on_validation_end",
    "on_validation_end",
    "on_validation_model_train",
    "cb.on_train_epoch_end",
    "on_train_epoch_end",
    "ckpt.on_train_epoch_end",
    "cb.on_save_checkpoint",
    "ckpt.on_save_checkpoint",
    "on_save_checkpoint",
    "cb.on_train_end",
    "on_train_end",
    "cb.on_fit_end",
    "on_fit_end",
    "cb.teardown",
    "teardown",
]

LIGHTNING_DISPATCH_VALIDATE = [
    "cb.setup",
    "setup",
    "on_validation_model_eval",
    "cb.on_validation_start",
    "on_validation_start",
    "cb.on_validation_epoch_start",
    "on_validation_epoch_start",
    "cb.on_validation_batch_start",
    "on_validation_batch_start",
    "cb.on_validation_batch_end",
    "on_validation_batch_end",
    "cb.on_validation_epoch_end",
    "on_validation_epoch_end",
    "cb.on_validation_end",
    "on_validation_end",
    "on_validation_model_train",
    "cb.teardown",
    "teardown",
]

LIGHTNING_DISPATCH_TEST = [
    "cb.setup",
    "setup",
    "on_test_model_eval",
    "cb.on_test_start",
    "on_test_start",
    "cb.on_test_epoch_start",
    "on_test_epoch_start",
    "cb.on_test_batch_start",
    "on_test_batch_start",
    "cb.on_test_batch_end",
    "on_test_batch_end",
    "cb.on_test_epoch_end",
    "on_test_epoch_end",
    "cb.on_test_end",
    "on_test_end",
    "on_test_model_train",
    "cb.teardown",
    "teardown",
]

LIGHTNING_DISPATCH_PREDICT = [
    "cb.setup",
    "setup",
    "on_predict_model_eval",
    "cb.on_predict_start",
    "on_predict_start",
    "cb.on_predict_epoch_start",
    "on_predict_epoch_start",
    "cb.on_predict_batch_start",
    "on_predict_batch_start",
    "cb.on_predict_batch_end",
    "on_predict_batch_end",
    "cb.on_predict_epoch_end",
    "on_predict_epoch_end",
    "cb.on_predict_end",
    "on_predict_end",
    "cb.teardown",
    "teardown",
]

LIGHTNING_DISPATCH_RESUME = [
    "cb.setup",
    "setup",
    "on_load_checkpoint",
    "cb.on_load_checkpoint",
    "ckpt.on_load_checkpoint",
    "cb.on_fit_start",
    "on_fit_start",
    "cb.on_train_start",
    "on_train_start",
    "cb.on_train_epoch_start",
    "on_train_epoch_start",
    "cb.on_train_batch_start",
    "on_train_batch_start",
    "cb.on_before_zero_grad",
    "on_before_zero_grad",
    "cb.on_before_backward",
    "on_before_backward",
    "cb.on_after_backward",
    "on_after_backward",
    "cb.on_before_optimizer_step",
    "on_before_optimizer_step",
    "cb.on_train_batch_end",
    "on_train_batch_end",
    "cb.on_train_epoch_end",
    "on_train_epoch_end",
    "ckpt.on_train_epoch_end",
    "cb.on_save_checkpoint",
    "ckpt.on_save_checkpoint",
    "on_save_checkpoint",
    "cb.on_train_end",
    "on_train_end",
    "cb.on_fit_end",
    "on_fit_end",
    "cb.teardown",
    "teardown",
]


def _zero_grad_after_the_step(lightning: list[str]) -> list[str]:
    """geartrain's one documented difference here: ``on_before_zero_grad`` after the optimizer step."""
    out = [call for call in lightning if not call.endswith("on_before_zero_grad")]
    result: list[str] = []
    for call in out:
        result.append(call)
        if call == "on_before_optimizer_step":
            result += ["cb.on_before_zero_grad", "on_before_zero_grad"]
    return result


def record_dispatch(stage: str, root: Path) -> list[str]:
    """Run ``stage`` with a module, a callback and a ModelCheckpoint that record every hook they have."""
    calls: list[str] = []

    class Module(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.l = nn.Linear(2, 1)

        def training_step(self, b: Any, i: int) -> torch.Tensor:
            return self.l(b[0]).sum()

        def validation_step(self, b: Any, i: int) -> None:
            self.log("v", self.l(b[0]).sum())

        def test_step(self, b: Any, i: int) -> None:
            pass

        def predict_step(self, b: Any, i: int) -> torch.Tensor:
            return self.l(b[0])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self) -> Any:
            return DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2)

        def val_dataloader(self) -> Any:
            return DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)

        def test_dataloader(self) -> Any:
            return DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)

        def predict_dataloader(self) -> Any:
            return DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)

    class Recorder(Callback):
        pass

    class Checkpoints(ModelCheckpoint):
        pass

    def wrap(cls: type, name: str, prefix: str) -> None:
        base = getattr(cls, name)

        def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append(prefix + name)
            return base(self, *args, **kwargs)

        setattr(cls, name, hook)

    for name in [n for n in dir(TrainModule) if n.startswith("on_")] + ["setup", "teardown"]:
        if name not in ("on_exception", "on_before_batch_transfer", "on_after_batch_transfer"):
            wrap(Module, name, "")
    for name in HOOKS:
        if name not in ("on_exception", "on_log_metrics"):
            wrap(Recorder, name, "cb.")
    for name in ("on_train_epoch_end", "on_validation_end", "on_save_checkpoint", "on_load_checkpoint"):
        wrap(Checkpoints, name, "ckpt.")
    options: dict[str, Any] = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False}
    if stage == "fit":
        trainer = Trainer(
            max_epochs=1, num_sanity_val_steps=1, callbacks=[Recorder(), Checkpoints(dirpath=root)], **options
        )
        trainer.fit(Module())
    elif stage == "resume":
        Trainer(max_epochs=1, callbacks=[Checkpoints(dirpath=root, save_last=True)], **options).fit(Module())
        calls.clear()
        again = Trainer(
            max_epochs=2,
            num_sanity_val_steps=0,
            limit_train_batches=1,
            limit_val_batches=0,
            callbacks=[Recorder(), Checkpoints(dirpath=root / "2")],
            **options,
        )
        again.fit(Module(), ckpt_path=root / "last.ckpt")
    else:
        getattr(Trainer(callbacks=[Recorder()], **options), stage)(Module())
    return calls


@pytest.mark.parametrize(
    ("stage", "lightning"),
    [
        ("fit", LIGHTNING_DISPATCH_FIT),
        ("validate", LIGHTNING_DISPATCH_VALIDATE),
        ("test", LIGHTNING_DISPATCH_TEST),
        ("predict", LIGHTNING_DISPATCH_PREDICT),
        ("resume", LIGHTNING_DISPATCH_RESUME),
    ],
)
def test_callbacks_and_module_are_called_in_lightnings_order(
    stage: str, lightning: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Callbacks before the module, with Lightning's exceptions (trainer/hook_order.py)."""
    monkeypatch.chdir(tmp_path)
    assert record_dispatch(stage, tmp_path) == _zero_grad_after_the_step(lightning)


@pytest.mark.parametrize("overriders", ["module", "one callback", "two callbacks", "both"])
def test_a_hook_bound_for_a_loop_calls_and_returns_as_the_dispatch_does(overriders: str, tmp_path: Path) -> None:
    """``hooks.bound(hook)`` (kept by the loops) skips the dispatch where it can; what it calls, in which
    order, and what it returns (the module's result; never a callback's) stay those of ``hooks(hook)``."""
    calls: list[str] = []

    class Says(Callback):
        def __init__(self, name: str) -> None:
            self.name = name

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> int:
            calls.append(self.name)
            return -1  # a callback's return value is not the hook's: Lightning ignores it

    class Module(TrainModule):
        def on_train_batch_start(self, batch: Any, batch_idx: int) -> int:
            calls.append("module")
            return 7

    module = Module() if overriders in ("module", "both") else TrainModule()
    callbacks = {"module": [], "one callback": [Says("a")], "two callbacks": [Says("a"), Says("b")]}
    trainer = quiet_trainer(tmp_path, callbacks=callbacks.get(overriders, [Says("a"), Says("b")]))
    trainer.hooks.bind(module)
    expected = trainer.hooks("on_train_batch_start", None, 0)
    dispatched, calls[:] = list(calls), []
    bound = trainer.hooks.bound("on_train_batch_start")
    assert bound is not None and bound(None, 0) == expected
    assert calls == dispatched and expected == (7 if overriders in ("module", "both") else None)
