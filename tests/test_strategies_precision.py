"""Mixed precision on CPU: fp16 with a GradScaler (unscale before clipping, skipped overflow steps,
scaler state in checkpoints), bf16 autocast that trains, and the shared do-nothing contexts."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from strategies import AMPStrategy, SingleDeviceStrategy
from strategies.precision import MixedPrecision
from tests.helpers import jobs
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule


class OneWeight(TrainModule):
    """loss = w * x summed, so d loss / d w = sum(x): a gradient known in advance."""

    def __init__(self, overflow_at: int = -1) -> None:
        super().__init__()
        self.w = nn.Linear(1, 1, bias=False)
        nn.init.ones_(self.w.weight)
        self.overflow_at = overflow_at

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        out = self.w(x)
        assert out.dtype == torch.float16  # autocast is on
        loss = out.float().sum()
        return loss * float("inf") if batch_idx == self.overflow_at else loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class WeightHistory(Callback):
    def __init__(self) -> None:
        self.history: list[float] = []

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.history.append(module.w.weight.detach().item())


def _fp16_trainer(tmp_path: Path, **kwargs: Any) -> Trainer:
    # A small initial scale: the default 65536 overflows float16 (max 65504) on the very first step.
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    return quiet_trainer(
        tmp_path,
        strategy=AMPStrategy(precision=MixedPrecision(torch.float16, "cpu", scaler), device="cpu"),
        enable_checkpointing=True,
        **kwargs,
    )


def test_fp16_clipping_sees_unscaled_gradients(tmp_path: Path) -> None:
    history = WeightHistory()
    trainer = _fp16_trainer(tmp_path, max_steps=1, gradient_clip_val=1.0, callbacks=[history])
    precision = trainer.strategy.precision
    assert isinstance(precision, MixedPrecision) and precision.scaler is not None
    # d loss / d w = 3: clipped to norm 1 and stepped with lr 1, w goes from 1 to 0. Clipping the
    # scaled gradient (3 * 1024) and unscaling afterwards would move w by only 1/1024.
    trainer.fit(OneWeight(), DataLoader(TensorDataset(torch.tensor([[3.0]])), batch_size=1))
    assert history.history == [pytest.approx(0.0, abs=1e-6)]
    assert precision.scaler.get_scale() == 1024.0 and trainer.progress.skipped_steps == 0


def test_fp16_overflow_skips_the_step_and_the_scheduler(tmp_path: Path) -> None:
    history = WeightHistory()
    trainer = _fp16_trainer(tmp_path, max_steps=3, callbacks=[history])
    data = DataLoader(TensorDataset(torch.full((3, 1), 0.25)), batch_size=1)
    module = OneWeight(overflow_at=1)
    trainer.fit(module, data)
    w0, w1, w2 = history.history
    assert w0 == pytest.approx(0.75)  # step 1: lr 1.0, gradient 0.25
    assert w1 == w0  # step 2 overflowed: weights untouched
    assert w2 == pytest.approx(0.75 - 0.5 * 0.25)  # step 3 used lr 0.5: the scheduler moved once
    assert trainer.global_step == 3 and trainer.progress.skipped_steps == 1
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.last_epoch == 2
    # The scaler halved its scale on the overflow; that state is part of every checkpoint.
    assert trainer.checkpointing.state()["precision"]["scaler"]["scale"] == 512.0
    saved = torch.load(trainer.checkpoint_callback.last_model_path, weights_only=True)  # type: ignore[union-attr]
    assert saved["precision"]["scaler"]["scale"] == 512.0
    # ... and a resumed run gets it back.
    resumed = _fp16_trainer(tmp_path / "resume", max_steps=4)
    resumed.fit(OneWeight(), data, ckpt_path=trainer.checkpoint_callback.last_model_path)  # type: ignore[union-attr]
    scaler = resumed.strategy.precision.scaler  # type: ignore[attr-defined]
    assert scaler.get_scale() == 512.0


class Bf16Probe(jobs.BlockNet):
    dtypes: set[torch.dtype]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.dtypes = getattr(self, "dtypes", set()) | {self(batch[0]).dtype}
        return super().training_step(batch, batch_idx)


def test_bf16_mixed_trains_and_is_the_amp_default_on_cpu(tmp_path: Path) -> None:
    data = jobs.dataset(160)
    module = Bf16Probe()

    def full_loss() -> float:
        with torch.no_grad():
            return float(nn.functional.cross_entropy(module(data.tensors[0]), data.tensors[1]))

    before = full_loss()
    trainer = quiet_trainer(tmp_path, strategy=AMPStrategy(device="cpu"), num_sanity_val_steps=2, max_epochs=5)
    assert trainer.strategy.precision.name == "bf16-mixed"
    trainer.fit(module, DataLoader(data, batch_size=16, shuffle=True))
    assert module.dtypes == {torch.bfloat16}
    assert module.head.weight.dtype == torch.float32  # mixed: the weights stay float32
    assert full_loss() < 0.7 * before


def test_contexts_are_shared_do_nothing_objects_and_autocast_still_applies() -> None:
    strategy = SingleDeviceStrategy(device="cpu")
    assert strategy.forward_context() is strategy.forward_context()
    assert isinstance(strategy.no_backward_sync(True), contextlib.nullcontext)
    mixed = MixedPrecision(torch.bfloat16, "cpu")
    with mixed.forward_context():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
