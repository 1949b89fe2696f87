"""Non-finite losses: ``on_nonfinite="raise"`` names where, ``"skip"`` drops exactly those steps and
gives up after too many in a row, on every path of the training step: automatic optimisation,
micro-batching (the loss of every piece is checked) and manual optimisation (``manual_backward``
checks it and the next ``opt.step()`` is dropped)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.helpers.regression import Small
from tests.helpers.trainers import quiet_trainer


class SpikyModule(Small):
    """Loss is NaN for the batches listed in ``bad``."""

    def __init__(self, bad: set[int]) -> None:
        super().__init__()
        self.bad = bad

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if batch_idx in self.bad else loss


def nan_data(nan_rows: tuple[int, ...] = ()) -> torch.utils.data.DataLoader[Any]:
    """24 samples in batches of 4; the samples at ``nan_rows`` are NaN."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(24, 3, generator=g)
    x[list(nan_rows)] = float("nan")
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=4)


class ManualSpiky(SpikyModule):
    automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(super().training_step(batch, batch_idx))
        opt.step()


def reference_weights(module: Small, skip: set[int]) -> list[torch.Tensor]:
    """A hand-written loop from ``module``'s initial weights over :func:`nan_data` without the batches in ``skip``."""
    reference = Small()
    reference.load_state_dict(module.state_dict())
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for i, (x,) in enumerate(nan_data()):
        if i in skip:
            continue
        opt.zero_grad()
        reference.layer(x).pow(2).mean().backward()
        opt.step()
    return [p.detach().clone() for p in reference.parameters()]


def test_nonfinite_raise_names_epoch_step_and_batch() -> None:
    with pytest.raises(FloatingPointError, match=r"epoch 0, global step 2, batch 2"):
        quiet_trainer(strategy="auto", num_sanity_val_steps=2, max_epochs=1, on_nonfinite="raise").fit(
            SpikyModule({2}), nan_data()
        )


def test_nonfinite_skip_drops_exactly_that_step() -> None:
    torch.manual_seed(0)
    module = SpikyModule({2, 4})
    reference = Small()
    reference.load_state_dict(module.state_dict())
    trainer = quiet_trainer(strategy="auto", num_sanity_val_steps=2, max_epochs=1, on_nonfinite="skip")
    trainer.fit(module, nan_data())
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for i, (x,) in enumerate(nan_data()):
        if i in (2, 4):
            continue
        opt.zero_grad()
        reference.layer(x).pow(2).mean().backward()
        opt.step()
    for a, b in zip(module.parameters(), reference.parameters()):
        assert torch.equal(a, b)
    assert trainer.global_step == 4
    assert trainer.progress.nonfinite_skipped == 2
    assert float(trainer.callback_metrics["train/nonfinite_skipped"]) == 2.0


def test_nonfinite_skip_gives_up_after_too_many_in_a_row() -> None:
    with pytest.raises(FloatingPointError, match="3 optimizer steps in a row"):
        quiet_trainer(
            strategy="auto", num_sanity_val_steps=2, max_epochs=1, on_nonfinite="skip", max_nonfinite_in_a_row=3
        ).fit(SpikyModule({1, 2, 3}), nan_data())


def test_micro_batches_raise_on_a_nonfinite_piece_naming_the_batch() -> None:
    # Only the second piece (samples 10 and 11) of batch 2 is NaN: the check must look at every piece.
    trainer = quiet_trainer(max_epochs=1, micro_batch_size=2, on_nonfinite="raise")
    with pytest.raises(FloatingPointError, match=r"global step 2, batch 2"):
        trainer.fit(SpikyModule(set()), nan_data(nan_rows=(10, 11)))


def test_micro_batches_skip_drops_the_whole_step() -> None:
    torch.manual_seed(0)
    module = SpikyModule(set())
    expected = reference_weights(module, {2, 4})
    trainer = quiet_trainer(max_epochs=1, micro_batch_size=2, on_nonfinite="skip")
    trainer.fit(module, nan_data(nan_rows=(10, 11, 16)))  # batch 2's second piece, batch 4's first
    assert trainer.global_step == 4 and trainer.progress.nonfinite_skipped == 2
    # Micro-batches add the two halves' gradients in another order than the whole batch: rounding only.
    for ours, theirs in zip(module.parameters(), expected):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_manual_optimisation_raises_on_a_nonfinite_loss() -> None:
    with pytest.raises(FloatingPointError, match=r"batch 3"):
        quiet_trainer(max_epochs=1, on_nonfinite="raise").fit(ManualSpiky({3}), nan_data())


def test_manual_optimisation_skip_drops_that_step_bitwise() -> None:
    torch.manual_seed(0)
    module = ManualSpiky({1, 4})
    expected = reference_weights(module, {1, 4})
    trainer = quiet_trainer(max_epochs=1, on_nonfinite="skip")
    trainer.fit(module, nan_data())
    assert trainer.global_step == 4 and trainer.progress.nonfinite_skipped == 2
    for ours, theirs in zip(module.parameters(), expected):
        assert torch.equal(ours, theirs)


def test_manual_optimisation_without_a_policy_lets_nan_through() -> None:
    module = ManualSpiky({1})
    quiet_trainer(max_epochs=1).fit(module, nan_data())
    assert torch.isnan(module.layer.weight).all()  # no check unless asked for (it costs a sync a step)
