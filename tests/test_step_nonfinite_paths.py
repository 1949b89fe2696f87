"""The non-finite loss policy holds on every path of the training step.

Automatic optimisation is covered with the resume tests; here the two paths that used to skip the
check: micro-batching (``micro_batch_size``), where the loss of every piece is checked, and manual
optimisation, where ``manual_backward`` checks it and the next ``opt.step()`` is dropped.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule


def quiet(**kwargs: Any) -> Trainer:
    return Trainer(enable_progress_bar=False, logger=False, enable_checkpointing=False, **kwargs)


def data(nan_rows: tuple[int, ...] = ()) -> DataLoader[Any]:
    """24 samples in batches of 4; the samples at ``nan_rows`` are NaN."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(24, 3, generator=g)
    x[list(nan_rows)] = float("nan")
    return DataLoader(TensorDataset(x), batch_size=4)


class Spiky(TrainModule):
    """``layer(x)**2`` averaged; the loss is NaN on the batches in ``bad``."""

    def __init__(self, bad: set[int]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(3, 4)
        self.bad = bad

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        loss = self.layer(x).pow(2).mean()
        return loss * float("nan") if batch_idx in self.bad else loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class ManualSpiky(Spiky):
    automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(super().training_step(batch, batch_idx))
        opt.step()


def reference_weights(skip: set[int]) -> list[torch.Tensor]:
    """A hand-written loop over the same data that leaves out the batches in ``skip``."""
    module = Spiky(set())
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    for i, (x,) in enumerate(data()):
        if i in skip:
            continue
        opt.zero_grad()
        module.layer(x).pow(2).mean().backward()
        opt.step()
    return [p.detach().clone() for p in module.parameters()]


def test_micro_batches_raise_on_a_nonfinite_piece_naming_the_batch() -> None:
    # Only the second piece (samples 10 and 11) of batch 2 is NaN: the check must look at every piece.
    with pytest.raises(FloatingPointError, match=r"global step 2, batch 2"):
        quiet(max_epochs=1, micro_batch_size=2, on_nonfinite="raise").fit(Spiky(set()), data(nan_rows=(10, 11)))


def test_micro_batches_skip_drops_the_whole_step() -> None:
    module = Spiky(set())
    trainer = quiet(max_epochs=1, micro_batch_size=2, on_nonfinite="skip")
    trainer.fit(module, data(nan_rows=(10, 11, 16)))  # batch 2's second piece, batch 4's first
    assert trainer.global_step == 4 and trainer.progress.nonfinite_skipped == 2
    # Micro-batches add the two halves' gradients in another order than the whole batch: rounding only.
    for ours, theirs in zip(module.parameters(), reference_weights({2, 4})):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_manual_optimisation_raises_on_a_nonfinite_loss() -> None:
    with pytest.raises(FloatingPointError, match=r"batch 3"):
        quiet(max_epochs=1, on_nonfinite="raise").fit(ManualSpiky({3}), data())


def test_manual_optimisation_skip_drops_that_step_bitwise() -> None:
    module = ManualSpiky({1, 4})
    trainer = quiet(max_epochs=1, on_nonfinite="skip")
    trainer.fit(module, data())
    assert trainer.global_step == 4 and trainer.progress.nonfinite_skipped == 2
    for ours, theirs in zip(module.parameters(), reference_weights({1, 4})):
        assert torch.equal(ours, theirs)


def test_manual_optimisation_without_a_policy_lets_nan_through() -> None:
    module = ManualSpiky({1})
    quiet(max_epochs=1).fit(module, data())
    assert torch.isnan(module.layer.weight).all()  # no check unless asked for (it costs a sync a step)
