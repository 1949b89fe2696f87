"""The one training step with its seams bound to plain operations behaves exactly like through the strategy.

``trainer/loops/step.py`` binds every seam the strategy and precision keep at the base class's
do-nothing version to the plain operation (the module's own ``training_step``, ``loss.backward``,
``optimizer.step``). These tests run the same job twice, once with every seam bound that way and
once on a strategy that overrides a seam (so that seam goes through the strategy), and compare
everything observable.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from callbacks import Callback
from strategies import SingleDeviceStrategy, Strategy
from tests.helpers.tiny_mlp import TinyMLP, make_batches
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule
from trainer.loops.iteration import iterate


class Seamed(SingleDeviceStrategy):
    """A single-device strategy whose ``step`` is overridden (same behaviour): the general path runs."""

    def __init__(self) -> None:
        super().__init__(device="cpu")
        self.steps = 0

    def step(self, hook: str, *args: Any) -> Any:
        self.steps += 1
        return super().step(hook, *args)


class Recorder(Callback):
    """Records every per-batch hook with its batch index (or, for the step hooks, the global step)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def _at_batch(self, name: str, *args: Any) -> None:
        self.calls.append((name, int(args[-1])))

    def _at_step(self, name: str, trainer: Trainer) -> None:
        self.calls.append((name, trainer.global_step))

    def on_train_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int) -> None:
        self._at_batch("on_train_batch_start", batch_idx)

    def on_before_backward(self, trainer: Trainer, module: TrainModule, loss: torch.Tensor) -> None:
        self._at_step("on_before_backward", trainer)

    def on_after_backward(self, trainer: Trainer, module: TrainModule) -> None:
        self._at_step("on_after_backward", trainer)

    def on_before_optimizer_step(self, trainer: Trainer, module: TrainModule, optimizer: Any) -> None:
        self._at_step("on_before_optimizer_step", trainer)

    def on_before_zero_grad(self, trainer: Trainer, module: TrainModule, optimizer: Any) -> None:
        self._at_step("on_before_zero_grad", trainer)

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, out: Any, batch: Any, batch_idx: int) -> None:
        self._at_batch("on_train_batch_end", batch_idx)

    def on_validation_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int) -> None:
        self._at_batch("on_validation_batch_start", batch_idx)

    def on_validation_batch_end(
        self, trainer: Trainer, module: TrainModule, out: Any, batch: Any, batch_idx: int
    ) -> None:
        self._at_batch("on_validation_batch_end", batch_idx)


class LoggingMLP(TinyMLP):
    """Logs per step and per epoch, skips the update on every fifth batch, steps a scheduler per step."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return None if batch_idx % 5 == 4 else loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _fit(strategy: Any, callbacks: list[Callback]) -> tuple[Trainer, TinyMLP]:
    torch.manual_seed(0)
    module = LoggingMLP()
    trainer = quiet_trainer(callbacks=callbacks, strategy=strategy, max_epochs=2, log_every_n_steps=3)
    trainer.fit(module, train_dataloaders=make_batches(12), val_dataloaders=make_batches(4, seed=1))
    return trainer, module


def test_plain_and_general_paths_agree_bitwise(monkeypatch: pytest.MonkeyPatch) -> None:
    general_steps: list[str] = []
    original = Strategy.step

    def counting(self: Strategy, hook: str, *args: Any) -> Any:
        general_steps.append(hook)
        return original(self, hook, *args)

    monkeypatch.setattr(Strategy, "step", counting)
    plain_rec, general_rec = Recorder(), Recorder()
    plain, plain_module = _fit("single", [plain_rec])
    assert general_steps == []  # every step was bound to the module's own method
    seamed = Seamed()
    general, general_module = _fit(seamed, [general_rec])
    assert len(general_steps) == 24 + 2 * 4 and seamed.steps == 24 + 2 * 4  # training and validation batches

    for a, b in zip(plain_module.state_dict().values(), general_module.state_dict().values()):
        assert torch.equal(a, b)
    # The two batches an epoch that return None count as steps (no update), as in Lightning.
    assert plain.global_step == general.global_step == 2 * 12
    assert plain_rec.calls == general_rec.calls
    assert [name for name, _ in plain_rec.calls[:6]] == [
        "on_train_batch_start",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_before_zero_grad",
        "on_train_batch_end",
    ]
    assert plain.callback_metrics.keys() == general.callback_metrics.keys()
    for key, value in plain.callback_metrics.items():
        assert torch.equal(value, general.callback_metrics[key]), key
    assert plain.optimizers[0].param_groups[0]["lr"] == general.optimizers[0].param_groups[0]["lr"]


def test_a_seam_that_does_something_takes_the_general_path() -> None:
    class Doubling(SingleDeviceStrategy):
        def backward(self, loss: torch.Tensor) -> None:
            super().backward(loss * 2)

    torch.manual_seed(0)
    doubled = TinyMLP(log_loss=False)
    torch.manual_seed(0)
    plain = TinyMLP(log_loss=False)
    for module, strategy in ((doubled, Doubling(device="cpu")), (plain, "single")):
        quiet_trainer(strategy=strategy, num_sanity_val_steps=2, max_steps=1).fit(
            module, train_dataloaders=make_batches(1)
        )
    assert not torch.equal(doubled.net[0].weight, plain.net[0].weight)  # the override ran


def test_batch_start_returning_minus_one_ends_the_epoch_on_the_plain_path() -> None:
    class StopAtThree(TinyMLP):
        def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
            return -1 if batch_idx == 3 else None

    trainer = quiet_trainer(strategy="auto", num_sanity_val_steps=2, max_epochs=2)
    trainer.fit(StopAtThree(log_loss=False), train_dataloaders=make_batches(6))
    assert trainer.global_step == 2 * 3


class _Sized:
    """A sized iterable whose ``len`` may disagree with what it yields (as some user loaders do)."""

    def __init__(self, items: list[int], length: int) -> None:
        self.items, self.length = items, length

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Any:
        return iter(self.items)


def test_iterate_indexes_marks_the_last_batch_and_never_reads_past_num() -> None:
    pulled: list[int] = []

    def counted(n: int) -> Any:
        for i in range(n):
            pulled.append(i)
            yield i * 10

    class Counted(_Sized):
        def __iter__(self) -> Any:
            return counted(self.length)

    four = _Sized([0, 10, 20, 30], 4)
    assert list(iterate(four, 4)) == [(0, 0, False), (1, 10, False), (2, 20, False), (3, 30, True)]
    assert list(iterate(four, 4, start=3)) == [(3, 30, True)]
    assert list(iterate(four, 4, start=4)) == []
    assert list(iterate(_Sized([0, 10], 4), 4)) == [(0, 0, False), (1, 10, False)]  # shorter than its len
    assert list(iterate(Counted([], 4), 2)) == [(0, 0, False), (1, 10, True)]
    assert pulled == [0, 1]  # a limit of 2 batches fetches 2, not a third
    pulled.clear()
    assert list(iterate(counted(4), float("inf"))) == [
        (0, 0, False),
        (1, 10, False),
        (2, 20, False),
        (3, 30, True),
    ]
