"""``GradientAccumulationScheduler``: the accumulation factor changes at epochs exactly as a hand-written loop
does it, resuming in the middle of the schedule is exact, and what Lightning refuses is refused."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from callbacks import Callback, GradientAccumulationScheduler
from tests.helpers.regression import Regressor, make_loader
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule
from trainer.common.errors import MisconfigurationException

SCHEDULE = {1: 3, 2: 2}  # epoch 0 accumulates 1 batch (implicit), epoch 1 three, epoch 2 on two
EPOCHS = 4


def reference(net: nn.Module, loader: DataLoader[Any]) -> int:
    """Hand-written: the factor of each epoch from ``SCHEDULE``; the epoch's last batch closes a window."""
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    steps, n = 0, len(loader)
    for epoch in range(EPOCHS):
        k = {0: 1, 1: 3}.get(epoch, 2)
        for i, (x, y) in enumerate(loader):
            loss = F.mse_loss(net(x), y)
            (loss / k if k > 1 else loss).backward()
            if (i + 1) % k == 0 or i == n - 1:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                steps += 1
    return steps


class Factors(Callback):
    """Records the trainer's factor in every epoch, and saves checkpoints after chosen optimizer steps."""

    def __init__(self, root: Path | None = None, steps: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.root, self.steps, self.saved, self.seen = root, steps, -1, []

    def on_train_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            self.seen.append(trainer.accumulate_grad_batches)

    def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, *args: Any) -> None:
        if self.root is not None and trainer.global_step in self.steps and trainer.global_step != self.saved:
            trainer.save_checkpoint(self.root / f"step{trainer.global_step}.ckpt")
            self.saved = trainer.global_step


def _fit(ckpt: Path | None = None, extra: Callback | None = None) -> tuple[Regressor, Trainer]:
    module = Regressor()
    callbacks: list[Callback] = [GradientAccumulationScheduler(dict(SCHEDULE))]
    if extra is not None:
        callbacks.append(extra)
    trainer = quiet_trainer(callbacks=callbacks, max_epochs=EPOCHS)
    trainer.fit(module, make_loader(n=20, batch_size=3), ckpt_path=ckpt)  # 7 batches an epoch
    return module, trainer


def test_schedule_equals_a_hand_written_loop_bitwise() -> None:
    factors = Factors()
    module, trainer = _fit(extra=factors)
    net = copy.deepcopy(Regressor().net)
    steps = reference(net, make_loader(n=20, batch_size=3))
    assert factors.seen == [1, 3, 2, 2]
    assert trainer.global_step == steps == 7 + 3 + 4 + 4
    for (name, a), b in zip(module.net.named_parameters(), net.parameters()):
        assert torch.equal(a, b), name


def test_resume_in_the_middle_of_the_schedule_is_exact(tmp_path: Path) -> None:
    saver = Factors(tmp_path, steps={8, 10, 12})  # in epoch 1 (factor 3), at its end, in epoch 2 (factor 2)
    whole, _ = _fit(extra=saver)
    for step in (8, 10, 12):
        resumed, trainer = _fit(tmp_path / f"step{step}.ckpt")
        assert trainer.global_step == 18
        for (name, a), b in zip(resumed.net.named_parameters(), whole.net.parameters()):
            assert torch.equal(a, b), f"{name} after resuming at step {step}"


def test_schedule_reads_as_lightnings() -> None:
    schedule = GradientAccumulationScheduler({2: 4, 5: 8})
    assert schedule.scheduling == {2: 4, 5: 8, 0: 1} and schedule.epochs == [0, 2, 5]
    assert [schedule.get_accumulate_grad_batches(e) for e in range(7)] == [1, 1, 4, 4, 4, 8, 8]
    assert not GradientAccumulationScheduler({0: 1}).going_to_accumulate_grad_batches()


@pytest.mark.parametrize(
    ("scheduling", "error", "match"),
    [
        ({}, TypeError, "at least one"),
        ({-1: 2}, MisconfigurationException, r"Epoch should be an int greater than or equal to 0. Got \[-1\]"),
        ({0: 1, "2": 2}, MisconfigurationException, r"Epoch should be an int .* Got \[0, '2'\]"),
        ({1: 0}, MisconfigurationException, r"Accumulation factor should be an int greater than 0. Got \[0\]"),
        ({1: 1.5}, ValueError, "Accumulation factor should be an int"),
    ],
)
def test_bad_schedules_are_refused(scheduling: dict[Any, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        GradientAccumulationScheduler(scheduling)


def test_combinations_lightning_refuses_are_refused() -> None:
    loader = make_loader(n=8, batch_size=4)
    trainer = quiet_trainer(callbacks=[GradientAccumulationScheduler({1: 2})], max_epochs=2, accumulate_grad_batches=2)
    with pytest.raises(
        ValueError, match="You have set `accumulate_grad_batches` and are using the `GradientAccumulationScheduler`"
    ):
        trainer.fit(Regressor(), loader)

    class Manual(Regressor):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            opt = self.optimizers()
            loss = super().training_step(batch, batch_idx)
            self.manual_backward(loss)
            opt.step()
            opt.zero_grad()

    trainer = quiet_trainer(callbacks=[GradientAccumulationScheduler({1: 2})], max_epochs=2)
    with pytest.raises(
        RuntimeError, match="Automatic gradient accumulation and the `GradientAccumulationScheduler` is not supported"
    ):
        trainer.fit(Manual(), loader)


def test_overridden_optimizer_hooks_are_warned_about_in_lightnings_words() -> None:
    class OwnStep(Regressor):
        def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
            super().optimizer_step(*args, **kwargs)

    trainer = quiet_trainer(callbacks=[GradientAccumulationScheduler({1: 2})], max_epochs=1)
    with pytest.warns(UserWarning, match="the hooks will not be called on every batch"):
        trainer.fit(OwnStep(), make_loader(n=8, batch_size=4))
