"""Fits that end inside an epoch, then resume with a larger budget, against the run that never stopped.

A fit ends before its epoch's last batch when ``max_steps`` is reached, ``max_time`` runs out, a
callback or the module sets ``trainer.should_stop``, or early stopping fires at a validation in the
middle of an epoch. Each way still ends the epoch as Lightning does (its hooks, the epoch schedulers,
the monitoring callbacks), and ``last.ckpt`` is written then; resuming from it with the stop lifted
must train the rest of the epoch and end with the uninterrupted run's weights, bitwise.

The job draws random numbers everywhere a resume must reproduce them: a shuffled sampler, dropout,
validation draws; it steps an epoch-interval scheduler and logs an epoch mean. 10 batches an epoch,
3 epochs, validation twice an epoch (``val_check_interval=0.5``).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback, EarlyStopping, ModelCheckpoint, Timer
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule, seed_everything

EPOCHS, STOP_AT = 3, 12  # 30 steps uninterrupted; a stop at step 12 is batch 2 of epoch 1


class Net(TrainModule):
    def __init__(self, stop_at: int | None = None, stop_at_batch: int | None = None, dropout: float = 0.3) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 1))
        self.stop_at = stop_at  # the module itself sets should_stop after this optimizer step,
        self.stop_at_batch = stop_at_batch  # or after this many training batches of the fit
        self.batches = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss, on_step=False, on_epoch=True)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.batches += 1
        if self.trainer.global_step == self.stop_at or self.batches == self.stop_at_batch:
            self.trainer.should_stop = True

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.net(x), y) + 0.01 * torch.rand(()))
        self.log("val/step", -float(self.trainer.global_step))  # never improves: early stopping's monitor

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)}


class StopAt(Callback):
    """Sets ``should_stop`` after optimizer step ``step``, as a user's callback would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, i: int) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


class StepClock:
    """A clock for :class:`~callbacks.Timer` that reads the optimizer steps taken: ``max_time`` in steps."""

    def __init__(self) -> None:
        self.trainer: Trainer | None = None

    def __call__(self) -> float:
        return float(self.trainer.global_step) if self.trainer is not None else 0.0


def _loaders(batch_size: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(80, 6, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(80, 1, generator=g)
    return {
        "train_dataloaders": DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True),
        "val_dataloaders": DataLoader(TensorDataset(x[:16], y[:16]), batch_size=8),
    }


def _fit(
    root: Path,
    stop: str | None,
    ckpt_path: str | None = None,
    strategy: Any = None,
    batch_size: int = 8,
    dropout: float = 0.3,
    stop_at_batch: int | None = None,
    **options: Any,
) -> dict[str, Any]:
    """One fit, stopped inside epoch 1 by ``stop`` (None: runs to the end); what it ended with.

    ``stop="module"`` stops after step :data:`STOP_AT`, or after batch ``stop_at_batch`` when given.
    """
    seed_everything(3)
    if stop == "module":
        module = Net(stop_at=None if stop_at_batch else STOP_AT, stop_at_batch=stop_at_batch, dropout=dropout)
    else:
        module = Net(dropout=dropout)
    callbacks: list[Callback] = [ModelCheckpoint(dirpath=root / "checkpoints", save_top_k=0, save_last=True)]
    clock = StepClock()
    if stop == "callback":
        callbacks.append(StopAt(STOP_AT))
    elif stop == "max_time":
        callbacks.append(Timer(duration=timedelta(seconds=STOP_AT), clock=clock, verbose=False))
    elif stop == "early_stopping":
        callbacks.append(EarlyStopping(monitor="val/step", mode="max", patience=2))  # stops at the 3rd check
    kwargs: dict[str, Any] = {"max_epochs": EPOCHS, "val_check_interval": 0.5, "enable_checkpointing": True}
    if stop == "max_steps":
        kwargs["max_steps"] = STOP_AT
    if strategy is not None:
        kwargs["strategy"] = strategy
    kwargs.update(options)
    trainer = quiet_trainer(root, callbacks, **kwargs)
    clock.trainer = trainer
    trainer.fit(module, ckpt_path=ckpt_path, **_loaders(batch_size))
    return {
        "steps": trainer.global_step,
        "epoch": trainer.current_epoch,
        "lr": trainer.optimizers[0].param_groups[0]["lr"],
        "weights": {k: v.detach().clone() for k, v in module.state_dict().items()},
    }


def stop_and_resume(root: str, stop: str, **options: Any) -> dict[str, Any]:
    """The run stopped by ``stop``, then resumed from its ``last.ckpt`` without the stop."""
    path = Path(root) / stop
    stopped = _fit(path, stop, **options)
    saved = torch.load(path / "checkpoints" / "last.ckpt", weights_only=True)
    resumed = _fit(path, None, ckpt_path=str(path / "checkpoints" / "last.ckpt"), **options)
    return {"stopped": stopped, "saved_progress": saved["progress"], "resumed": resumed}


def uninterrupted(root: str, **options: Any) -> dict[str, Any]:
    """The run that never stopped."""
    return _fit(Path(root) / "whole", None, **options)


def ddp_ranks(root: str, stops: list[str]) -> dict[str, Any]:
    """On each of 2 ranks (batch 4 each, the same global batch): the uninterrupted run and each stop resumed."""
    out: dict[str, Any] = {"whole": uninterrupted(root, strategy="ddp", batch_size=4)}
    for stop in stops:
        out[stop] = stop_and_resume(root, stop, strategy="ddp", batch_size=4)
    return out


def main() -> None:
    """``python tests/helpers/stop_jobs.py ROOT``: a ``ddp_spawn`` fit on 2 processes stops at step
    :data:`STOP_AT`; the caller's ``save_checkpoint`` then writes ``ROOT/after.ckpt`` from rank 0's end of
    the run, which the caller adopted; ``ROOT/last.ckpt`` is the ranks' own."""
    import sys

    root = Path(sys.argv[1])
    seed_everything(3)
    callbacks = [ModelCheckpoint(dirpath=root, save_top_k=0, save_last=True)]
    trainer = quiet_trainer(
        root, callbacks, strategy="ddp_spawn", devices=2, max_steps=STOP_AT, enable_checkpointing=True
    )
    trainer.fit(Net(), **_loaders(4))
    trainer.save_checkpoint(root / "after.ckpt")


if __name__ == "__main__":
    main()
