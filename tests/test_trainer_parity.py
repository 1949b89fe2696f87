"""``Trainer.fit`` ends with the same weights, bit for bit, as a hand-written PyTorch loop.

Each test trains a :class:`Regressor` with the trainer and a deep copy of its network with a plain
loop that does what the step's order says (loss / k, backward, clip, step, schedulers, zero_grad:
docs/architecture.md, "The step"), then compares every parameter with ``torch.equal``; the last one
does the same with a :class:`~tests.helpers.tiny_mlp.TinyMLP` on in-memory batches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from tests.helpers.regression import Regressor, assert_same_weights, make_loader, plain_copy, sgd
from tests.helpers.tiny_mlp import TinyMLP, make_batches
from tests.helpers.trainers import quiet_trainer


def reference_fit(
    net: nn.Module,
    loader: DataLoader[Any],
    optimizer: torch.optim.Optimizer,
    *,
    epochs: int,
    k: int = 1,
    clip: float | None = None,
    algorithm: str = "norm",
    max_steps: int | None = None,
    limit: int | None = None,
    after_step: Callable[[int], None] | None = None,
    after_epoch: Callable[[int], None] | None = None,
) -> int:
    """The loop the trainer must reproduce; returns the number of optimizer steps taken."""
    steps = 0
    n = len(loader) if limit is None else min(limit, len(loader))
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            if i >= n:
                break
            loss = F.mse_loss(net(x), y)
            (loss / k if k > 1 else loss).backward()
            if (i + 1) % k == 0 or i == n - 1:  # the last batch of an epoch closes the window too
                if clip is not None and algorithm == "norm":
                    nn.utils.clip_grad_norm_(net.parameters(), clip)
                elif clip is not None:
                    nn.utils.clip_grad_value_(net.parameters(), clip)
                optimizer.step()
                steps += 1
                if after_step is not None:
                    after_step(steps)
                optimizer.zero_grad(set_to_none=True)
                if max_steps is not None and steps >= max_steps:
                    return steps
        if after_epoch is not None:
            after_epoch(epoch)
    return steps


@pytest.mark.parametrize(
    ("n", "batch_size", "k", "clip", "algorithm"),
    [
        pytest.param(10, 4, 1, None, "norm", id="plain"),
        pytest.param(10, 2, 3, None, "norm", id="accumulate-3-of-5"),
        pytest.param(10, 4, 1, 0.3, "norm", id="clip-norm"),
        pytest.param(10, 4, 1, 0.05, "value", id="clip-value"),
        pytest.param(12, 2, 4, 0.2, "norm", id="accumulate-and-clip"),
    ],
)
def test_fit_matches_plain_loop(make_trainer: Any, n: int, batch_size: int, k: int, clip: Any, algorithm: str) -> None:
    epochs = 3
    module = Regressor()
    net = plain_copy(module)
    trainer = make_trainer(
        max_epochs=epochs, accumulate_grad_batches=k, gradient_clip_val=clip, gradient_clip_algorithm=algorithm
    )
    trainer.fit(module, make_loader(n, batch_size))
    steps = reference_fit(net, make_loader(n, batch_size), sgd(net), epochs=epochs, k=k, clip=clip, algorithm=algorithm)
    assert_same_weights(module.net, net)
    assert trainer.global_step == steps
    batches = -(-n // batch_size)
    assert steps == epochs * -(-batches // k)  # a partial window at the epoch's end still steps


def test_accumulation_divides_the_loss(make_trainer: Any) -> None:
    """Guard against a reference that would agree with a trainer forgetting ``/ k``."""
    module = Regressor()
    net = plain_copy(module)
    make_trainer(max_epochs=1, accumulate_grad_batches=3).fit(module, make_loader(10, 2))
    reference_fit(net, make_loader(10, 2), sgd(net), epochs=1, k=1, limit=None)
    assert not torch.equal(module.net[0].weight, net[0].weight)  # type: ignore[index]


def test_step_interval_scheduler_with_frequency(make_trainer: Any) -> None:
    def optim(m: nn.Module) -> Any:
        opt = sgd(m)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 2}}

    module = Regressor(optim)
    net = plain_copy(module)
    trainer = make_trainer(max_epochs=2)
    trainer.fit(module, make_loader(10, 2))  # 5 steps per epoch: 10 steps, 5 scheduler steps

    opt = sgd(net)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
    reference_fit(net, make_loader(10, 2), opt, epochs=2, after_step=lambda s: sched.step() if s % 2 == 0 else None)
    assert_same_weights(module.net, net)
    lr = trainer.optimizers[0].param_groups[0]["lr"]
    assert lr == opt.param_groups[0]["lr"] == pytest.approx(0.05 * 0.8**5)


def test_epoch_interval_scheduler(make_trainer: Any) -> None:
    def optim(m: nn.Module) -> Any:
        opt = sgd(m)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}

    module = Regressor(optim)
    net = plain_copy(module)
    trainer = make_trainer(max_epochs=3)
    trainer.fit(module, make_loader(10, 4))

    opt = sgd(net)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    reference_fit(net, make_loader(10, 4), opt, epochs=3, after_epoch=lambda e: sched.step())
    assert_same_weights(module.net, net)
    assert trainer.optimizers[0].param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.05 * 0.5**3


def _val_loss(net: nn.Module, loader: DataLoader[Any]) -> float:
    """Batch-size-weighted mean validation loss, computed the way an experienced user would."""
    total, count = torch.zeros((), dtype=torch.float64), 0
    with torch.no_grad():
        for x, y in loader:
            total += F.mse_loss(net(x), y).double() * len(x)
            count += len(x)
    return float(total / count)


def test_reduce_lr_on_plateau_monitors_validation_metric(make_trainer: Any) -> None:
    # mode="max" on a falling loss: every epoch counts as "no improvement", so the LR must drop,
    # and only a scheduler that really sees the validation value drops it at the right epochs.
    def make(opt: torch.optim.Optimizer) -> Any:
        return torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=1)

    def optim(m: nn.Module) -> Any:
        opt = sgd(m)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": make(opt), "monitor": "val_loss"}}

    module = Regressor(optim)
    net = plain_copy(module)
    trainer = make_trainer(max_epochs=4)
    trainer.fit(module, make_loader(10, 4), make_loader(6, 4, seed=1))

    opt = sgd(net)
    sched = make(opt)
    val = make_loader(6, 4, seed=1)
    reference_fit(net, make_loader(10, 4), opt, epochs=4, after_epoch=lambda e: sched.step(_val_loss(net, val)))
    assert_same_weights(module.net, net)
    assert trainer.optimizers[0].param_groups[0]["lr"] == opt.param_groups[0]["lr"] < 0.05


def test_max_steps_stops_mid_epoch(make_trainer: Any) -> None:
    module = Regressor()
    net = plain_copy(module)
    trainer = make_trainer(max_steps=7)  # 3 batches per epoch: stops inside the third epoch
    trainer.fit(module, make_loader(10, 4))
    steps = reference_fit(net, make_loader(10, 4), sgd(net), epochs=100, max_steps=7)
    assert trainer.global_step == steps == 7
    assert trainer.current_epoch == 3  # Lightning counts the epoch max_steps ended as finished
    assert_same_weights(module.net, net)


@pytest.mark.parametrize(("limit", "used"), [(3, 3), (0.6, 3)])
def test_limit_train_batches_with_accumulation(make_trainer: Any, limit: Any, used: int) -> None:
    module = Regressor()
    net = plain_copy(module)
    trainer = make_trainer(max_epochs=2, limit_train_batches=limit, accumulate_grad_batches=2)
    trainer.fit(module, make_loader(10, 2))  # 5 batches, 3 used: steps after batches 2 and 3
    steps = reference_fit(net, make_loader(10, 2), sgd(net), epochs=2, k=2, limit=used)
    assert trainer.global_step == steps == 4
    assert_same_weights(module.net, net)


def test_plateau_scheduler_steps_only_in_epochs_that_validated(make_trainer: Any) -> None:
    """With check_val_every_n_epoch=2 the scheduler must neither fail in epoch 0 (no value yet)
    nor step again on a stale value: each skipped epoch would count as a plateau epoch."""

    def make(opt: torch.optim.Optimizer) -> Any:
        return torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=0)

    def optim(m: nn.Module) -> Any:
        opt = sgd(m)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": make(opt), "monitor": "val_loss"}}

    module = Regressor(optim)
    net = plain_copy(module)
    trainer = make_trainer(max_epochs=6, check_val_every_n_epoch=2)
    trainer.fit(module, make_loader(10, 4), make_loader(6, 4, seed=1))

    opt = sgd(net)
    sched = make(opt)
    val = make_loader(6, 4, seed=1)

    def after_epoch(epoch: int) -> None:
        if epoch % 2 == 1:
            sched.step(_val_loss(net, val))

    reference_fit(net, make_loader(10, 4), opt, epochs=6, after_epoch=after_epoch)
    assert_same_weights(module.net, net)
    assert trainer.optimizers[0].param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.05 * 0.5**2


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
