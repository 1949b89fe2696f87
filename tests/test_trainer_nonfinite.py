"""Non-finite losses: ``on_nonfinite="raise"`` names where, ``"skip"`` drops exactly those steps and
gives up after too many in a row."""

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


def nan_data() -> torch.utils.data.DataLoader[Any]:
    g = torch.Generator().manual_seed(3)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(24, 3, generator=g)), batch_size=4)


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
