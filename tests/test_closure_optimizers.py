"""Optimizers whose ``step(closure)`` needs the closure (LBFGS) under automatic optimisation.

The trainer hands such an optimizer a closure that zeroes the gradients, runs forward and backward,
and returns the loss, as Lightning does; these tests compare the weights bitwise with the hand-written
LBFGS loop and count backward and ``zero_grad`` against the optimizer's own closure evaluations.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from callbacks import Callback
from tests.helpers.tiny_mlp import TinyMLP, make_batches
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule
from trainer.loops.optimizer_step import needs_closure


class CountingLBFGS(torch.optim.LBFGS):
    """LBFGS that counts its closure evaluations and its ``zero_grad`` calls."""

    def __init__(self, params: Any, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self.evaluations = 0
        self.zero_grads = 0

    def step(self, closure: Any) -> Any:  # type: ignore[override]
        def counted() -> Any:
            self.evaluations += 1
            return closure()

        return super().step(counted)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.zero_grads += 1
        super().zero_grad(set_to_none=set_to_none)


class LBFGSModel(TinyMLP):
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return CountingLBFGS(self.parameters(), lr=0.5, max_iter=4)


class OverridingLBFGSModel(LBFGSModel):
    """Overrides ``optimizer_step`` the usual way: the closure reaches the optimizer's step."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        optimizer.step(closure=optimizer_closure)


class Backwards(Callback):
    def __init__(self) -> None:
        self.count = 0

    def on_after_backward(self, trainer: Trainer, module: TrainModule) -> None:
        self.count += 1


def _hand_written(batches: Any, k: int = 1) -> tuple[dict[str, torch.Tensor], int]:
    """The LBFGS loop by hand (Lightning's order under accumulation ``k``): weights and closure evaluations."""
    torch.manual_seed(0)
    model = TinyMLP(log_loss=False)
    opt = CountingLBFGS(model.parameters(), lr=0.5, max_iter=4)
    items = list(batches)
    for i, (x, y) in enumerate(items):
        if i % k == 0:
            opt.zero_grad()
        if (i + 1) % k and i + 1 < len(items):
            (torch.nn.functional.cross_entropy(model(x), y) / k).backward()
            continue

        def closure(x: torch.Tensor = x, y: torch.Tensor = y, opens: bool = i % k == 0) -> torch.Tensor:
            if opens:
                opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y) / k
            loss.backward()
            return loss.detach()

        opt.step(closure)
    return model.state_dict(), opt.evaluations


@pytest.mark.parametrize("override", [False, True], ids=["default", "optimizer_step_overridden"])
@pytest.mark.parametrize("k", [1, 2])
def test_lbfgs_matches_the_hand_written_loop_bitwise(k: int, override: bool) -> None:
    batches = make_batches(5)
    expected, evaluations = _hand_written(batches, k)
    torch.manual_seed(0)
    model = (OverridingLBFGSModel if override else LBFGSModel)(log_loss=False)
    counter = Backwards()
    quiet_trainer(callbacks=[counter], max_epochs=1, accumulate_grad_batches=k).fit(model, batches)
    for name, value in model.state_dict().items():
        assert torch.equal(value, expected[name]), name
    opt = model.trainer.optimizers[0]
    assert opt.evaluations == evaluations > 5 // k  # LBFGS re-evaluated the loss within a step
    windows = -(-5 // k)
    # One backward per closure evaluation, plus the window's earlier batches; zero_grad once per evaluation
    # that opens its window and once per window opened outside the closure.
    assert counter.count == evaluations + (5 - windows)
    assert model.trainer.global_step == windows
    if k == 1:
        assert opt.zero_grads == evaluations


def test_a_step_under_no_grad_runs_its_closure_with_grad() -> None:
    seen: list[bool] = []

    class NoGradSGD(torch.optim.SGD):
        @torch.no_grad()
        def step(self, closure: Any) -> Any:  # type: ignore[override]
            closure()
            return super().step()

    class Model(TinyMLP):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            seen.append(torch.is_grad_enabled())
            return super().training_step(batch, batch_idx)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return NoGradSGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    model = Model(log_loss=False)
    quiet_trainer(max_epochs=1).fit(model, make_batches(2))
    assert seen == [True, True]


def test_only_a_required_closure_takes_the_closure_path() -> None:
    params = [torch.nn.Parameter(torch.zeros(1))]
    assert needs_closure(torch.optim.LBFGS(params))
    assert not needs_closure(torch.optim.SGD(params, lr=0.1))
    assert not needs_closure(torch.optim.AdamW(params))


def test_on_nonfinite_is_refused_with_a_closure_optimizer() -> None:
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="on_nonfinite='skip'"):
        quiet_trainer(max_epochs=1, on_nonfinite="skip").fit(LBFGSModel(log_loss=False), make_batches(1))
