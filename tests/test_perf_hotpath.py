"""The per-step fast paths keep behaviour: exact parity with a hand-written loop, hooks, metrics, imports."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Any

import pytest
import torch
from torch import nn

from callbacks import Callback
from strategies import SingleDeviceStrategy
from strategies.precision import MixedPrecision
from tests.helpers import REPO_ROOT
from tests.helpers.tiny_mlp import Batches, TinyMLP, make_batches
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule
from trainer.metrics import MetricStore


def test_fit_matches_hand_written_loop_bitwise() -> None:
    batches = make_batches(30)
    torch.manual_seed(0)
    ours = TinyMLP()
    torch.manual_seed(0)
    theirs = TinyMLP()
    quiet_trainer(strategy="auto", num_sanity_val_steps=2, max_epochs=2).fit(ours, train_dataloaders=batches)
    optimizer = torch.optim.SGD(theirs.parameters(), lr=0.05)
    for _ in range(2):
        for x, y in batches:
            nn.functional.cross_entropy(theirs.net(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()):
        assert torch.equal(a, b)


def test_validate_mean_matches_hand_computed() -> None:
    batches = Batches([(x[: 10 + i], y[: 10 + i]) for i, (x, y) in enumerate(make_batches(5).batches)])
    torch.manual_seed(0)
    model = TinyMLP()
    result = quiet_trainer(strategy="auto", num_sanity_val_steps=2).validate(model, dataloaders=batches)
    with torch.no_grad():
        losses = [nn.functional.cross_entropy(model.net(x), y).double() * len(x) for x, y in batches]
    expected = float(sum(losses) / sum(len(x) for x, _ in batches))
    assert result["val/loss"] == pytest.approx(expected, rel=1e-6)


def test_loss_equal_to_minus_one_does_not_end_the_epoch() -> None:
    """Only ``on_train_batch_start`` returning -1 ends an epoch; a loss tensor of -1 must not."""

    class MinusOne(TinyMLP):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return (self.net(batch[0]) * 0).sum() - 1.0

    trainer = quiet_trainer(strategy="auto", num_sanity_val_steps=2, max_epochs=1)
    trainer.fit(MinusOne(), train_dataloaders=make_batches(4))
    assert trainer.global_step == 4


def test_hooks_dispatch_module_then_callbacks_in_order() -> None:
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
    assert calls == ["instance", "module", "a", "b"] * 2


def test_contexts_are_shared_do_nothing_objects_and_autocast_still_applies() -> None:
    strategy = SingleDeviceStrategy(device="cpu")
    assert strategy.forward_context() is strategy.forward_context()
    assert isinstance(strategy.no_backward_sync(True), contextlib.nullcontext)
    mixed = MixedPrecision(torch.bfloat16, "cpu")
    with mixed.forward_context():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


def test_metric_sums_accumulate_in_place_and_widen_on_mixed_dtypes() -> None:
    store = MetricStore(lambda t, op: t)
    kwargs: dict[str, Any] = dict(on_step=False, on_epoch=True, prog_bar=True, sync_dist=False)
    store.log("s", torch.tensor(1.5, dtype=torch.bfloat16), reduce_fx="sum", batch_size=lambda: 1, **kwargs)
    store.log("s", torch.tensor(0.25, dtype=torch.float64), reduce_fx="sum", batch_size=lambda: 1, **kwargs)
    store.log("m", torch.tensor(2.0), reduce_fx="mean", batch_size=lambda: 3, **kwargs)
    store.log("m", torch.tensor(4.0), reduce_fx="mean", batch_size=lambda: 1, **kwargs)
    first = store.epoch_values()
    assert first["s"].dtype == torch.float64 and float(first["s"]) == 1.75
    assert float(first["m"]) == pytest.approx(2.5)
    assert store.prog_bar_keys() == {"s", "m"}
    store.log("s", torch.tensor(1.0, dtype=torch.float64), reduce_fx="sum", batch_size=lambda: 1, **kwargs)
    assert float(first["s"]) == 1.75  # an epoch value handed out is not changed by later logging


@pytest.mark.timeout(60)
def test_import_trainer_leaves_heavy_packages_out() -> None:
    code = (
        "import sys, trainer, strategies, callbacks; "
        "print(','.join(m for m in ('tensorboard', 'torchmetrics', 'hydra', 'rich', 'sklearn', 'omegaconf') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": str(REPO_ROOT)}, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
