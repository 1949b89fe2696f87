"""Hooks run in Lightning 2.6's order (issue #13).

The ``LIGHTNING_*`` lists were recorded from pytorch-lightning 2.6.6 by
``tests/data/lightning/record_hook_order.py`` with the same module and options as :func:`record`
below. geartrain differs in three documented places (docs/lightning.md, "TrainModule and
DataModule"), applied by :func:`as_geartrain`; any other difference fails the test.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule

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

    1. ``on_fit_start`` comes after the dataloaders are requested (they are resolved at set-up).
    2. ``on_before_zero_grad``/``optimizer_zero_grad`` run after the optimizer step (right after
       ``configure_gradient_clipping`` and the step), not before the next backward: the gradients
       are freed before validation and checkpoints; the arithmetic is the same.
    3. Epoch-interval schedulers step after ``on_train_epoch_end`` (after validation, so a
       ReduceLROnPlateau sees this epoch's value), not at the epoch's last batch.
    """
    out = [h for h in lightning if h not in ("on_fit_start", "on_before_zero_grad", "optimizer_zero_grad")]
    out = [h for h in out if h != "lr_scheduler_step"]
    if "on_fit_start" in lightning:
        out.insert(out.index("val_dataloader") + 1, "on_fit_start")
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
