"""What an optimisation mode cannot do is refused before it trains, in Lightning's words (never ignored).

Manual optimisation steps its optimizers inside ``training_step``: the trainer's clipping and accumulation
would do nothing there, and a return value other than a tensor, a dict or None would go unread.
Automatic optimisation steps one optimizer and passes no ``optimizer_idx``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.regression import Regressor, make_loader
from tests.helpers.trainers import quiet_trainer
from trainer.common.errors import MisconfigurationException


class Manual(Regressor):
    def __init__(self, returns: Any = "loss") -> None:
        super().__init__()
        self.automatic_optimization = False
        self.returns = returns

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        opt = self.optimizers()
        loss = super().training_step(batch, batch_idx)
        self.manual_backward(loss)
        opt.step()
        opt.zero_grad()
        return (
            {"loss": loss, "mode": "manual"}
            if self.returns == "dict"
            else loss
            if self.returns == "loss"
            else self.returns
        )


@pytest.mark.parametrize("returns", [5, [1.0], "text"])
def test_a_manual_step_returning_something_else_is_refused(tmp_path: Path, returns: Any) -> None:
    with pytest.raises(MisconfigurationException, match="In manual optimization, `training_step` must either return"):
        quiet_trainer(tmp_path, max_steps=1).fit(Manual(returns), make_loader())


@pytest.mark.parametrize("returns", ["loss", "dict", None])
def test_a_manual_step_may_return_a_tensor_a_dict_or_nothing(tmp_path: Path, returns: Any) -> None:
    trainer = quiet_trainer(tmp_path, max_steps=2)
    trainer.fit(Manual(returns), make_loader())
    assert trainer.global_step == 2


@pytest.mark.parametrize(
    ("option", "words"),
    [
        ({"gradient_clip_val": 1.0}, r"Automatic gradient clipping is not supported.*gradient_clip_val=1\.0"),
        (
            {"accumulate_grad_batches": 2},
            r"Automatic gradient accumulation is not supported.*accumulate_grad_batches=2",
        ),
    ],
)
def test_the_trainers_clipping_and_accumulation_are_refused_under_manual_optimisation(
    tmp_path: Path, option: dict[str, Any], words: str
) -> None:
    model = Manual()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(MisconfigurationException, match=words):
        quiet_trainer(tmp_path, max_steps=2, **option).fit(model, make_loader())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # refused before any step
    quiet_trainer(tmp_path, max_steps=1, gradient_clip_val=0.0).fit(Manual(), make_loader())  # 0: clips nothing


def test_a_training_step_taking_optimizer_idx_is_refused(tmp_path: Path) -> None:
    class OldStyle(Regressor):
        def training_step(self, batch: Any, batch_idx: int, optimizer_idx: int) -> Any:  # type: ignore[override]
            return super().training_step(batch, batch_idx)

    with pytest.raises(RuntimeError, match=r"Remove the `optimizer_idx` argument from `training_step`"):
        quiet_trainer(tmp_path, max_steps=1).fit(OldStyle(), make_loader())
