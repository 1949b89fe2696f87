"""Checkpoint stall: how long a save blocks the training loop, ``ModelCheckpoint(async_save=True)`` vs ``torch.save``.

The model holds a stack of large frozen ``nn.Linear`` layers (about 100M parameters, 400 MB in
float32) and a small trainable head, trained one batch per epoch. geartrain's side is what a user
turns on: ``ModelCheckpoint(save_top_k=1, save_last=True, async_save=True)`` saving at every epoch
end (the top-k file, ``last.ckpt`` linked to it, the previous file evicted), measured from inside
``fit`` as the time its ``on_train_epoch_end`` holds the loop: building the checkpoint state and
copying it into CPU memory. The twin is the hand-written loop's synchronous
``torch.save({"state_dict": ..., "optimizer": ...})`` of the same model, at the same epoch end.

Pairs alternate inside one run (A B, then B A, ...). Before each pair the previous background write
is waited for, outside the timing, so the two never compete for the disk. Wall time: being blocked
is what is measured.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from typing_extensions import override

from bench.core import Result
from bench.overhead import Batches
from callbacks import Callback, ModelCheckpoint
from trainer import Trainer, TrainModule

__all__ = ["BigState", "measure", "run"]


class BigState(TrainModule):
    """``layers`` frozen ``Linear(width, width)`` (``layers * width**2`` parameters) and a trainable head."""

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*(nn.Linear(width, width) for _ in range(layers))).requires_grad_(False)
        self.head = nn.Linear(width, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.head(self.body(x)), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.head.parameters(), lr=0.01, momentum=0.9)


class _Probe(Callback):
    """Placed before (``first=True``) and after ModelCheckpoint: times its save and, between pairs, the twin's."""

    def __init__(self, first: bool, record: dict[str, Any], warmup: int, folder: Path) -> None:
        self.first, self.record, self.warmup, self.folder = first, record, warmup, folder

    @override
    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        pair = trainer.current_epoch - self.warmup
        twin_first = pair % 2 == 1  # A B, B A, A B, ...: a first-or-second effect cancels out
        if self.first:
            trainer.wait_for_checkpoints()  # the previous background write lands outside the timing
            if twin_first:
                self._twin(trainer, module, pair)
            self.record["start"] = time.perf_counter()
        else:
            blocked = time.perf_counter() - self.record["start"]
            if pair >= 0:
                self.record["ours"].append(blocked)
            if not twin_first:
                trainer.wait_for_checkpoints()
                self._twin(trainer, module, pair)

    def _twin(self, trainer: Trainer, module: TrainModule, pair: int) -> None:
        state = {"state_dict": module.state_dict(), "optimizer": trainer.optimizers[0].state_dict()}
        start = time.perf_counter()
        torch.save(state, self.folder / "twin.ckpt")
        if pair >= 0:
            self.record["theirs"].append(time.perf_counter() - start)


def measure(width: int, layers: int, pairs: int, warmup: int = 1) -> dict[str, Any]:
    """Fit ``warmup + pairs`` one-batch epochs; return the per-pair blocked times and what was saved."""
    torch.manual_seed(0)
    module = BigState(width, layers)
    batches = Batches([(torch.randn(1, width), torch.zeros(1, 1))])
    record: dict[str, Any] = {"ours": [], "theirs": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkpoint = ModelCheckpoint(dirpath=root / "ck", save_top_k=1, save_last=True, async_save=True)
        probes = [_Probe(True, record, warmup, root), checkpoint, _Probe(False, record, warmup, root)]
        trainer = Trainer(
            max_epochs=warmup + pairs,
            callbacks=probes,
            enable_progress_bar=False,
            logger=False,
            num_sanity_val_steps=0,
        )
        trainer.fit(module, train_dataloaders=batches)
        record["files"] = sorted(p.name for p in (root / "ck").iterdir())
    record["params"] = sum(p.numel() for p in module.parameters())
    return record


def run(quick: bool = False, pairs: int = 5) -> list[Result]:
    """One row: median blocked time of the async ``ModelCheckpoint`` save over that of ``torch.save``."""
    width, layers = (256, 2) if quick else (5000, 4)
    out = measure(width, layers, pairs, warmup=0 if quick else 1)
    ours, theirs = out["ours"], out["theirs"]
    ratio = statistics.median(a / b for a, b in zip(ours, theirs, strict=True))
    params = out["params"]
    note = (
        f"ModelCheckpoint(save_top_k=1, save_last=True, async_save=True) in fit vs torch.save; "
        f"{params / 1e6:.1f}M parameters ({params * 4 / 1e6:.0f} MB), wall time blocked, {pairs} pairs"
    )
    return [
        Result(
            "checkpoint stall (async save)",
            statistics.median(ours),
            statistics.median(theirs),
            ratio,
            "<= 0.15x",
            ratio <= 0.15,
            note,
            [a / b for a, b in zip(ours, theirs, strict=True)],
        )
    ]
