"""A small training job for the resume tests, run in a process of its own that the tests kill.

It uses every source of randomness an exact resume must reproduce: a shuffled sampler, dropout,
an augmentation drawing from torch's RNG in ``__getitem__`` (validation data too), draws in
``validation_step``, and validation in the middle of epochs (every 4 of 10 batches, as Lightning:
none extra at an epoch's end).
Each optimizer step saves ``last.ckpt``; the job prints ``STEP n`` after each step and ``VAL n``
after each validation, so a test can kill it at a chosen point.

    python tests/helpers/resume_job.py OUT_DIR [--workers N] [--resume] [--slow-save] [--strategy NAME --devices N]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from callbacks import Callback, ModelCheckpoint
from trainer import Trainer, TrainModule, seed_everything

EPOCHS, SAMPLES, BATCH = 3, 80, 8  # 10 batches per epoch, 30 steps


class NoisyPoints(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(SAMPLES, 6, generator=g)
        self.y = (self.x.sum(dim=1) > 0).long()

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + 0.05 * torch.randn(6), self.y[i]  # augmentation from the global RNG


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 2))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", nn.functional.cross_entropy(self.net(x), y))
        self.log("val/draw", torch.rand(()))  # validation consumes random numbers, as MC dropout would

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Announce(Callback):
    def __init__(self, delay: float) -> None:
        self.delay = delay

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, i: int) -> None:
        if trainer.is_global_zero:
            print(f"STEP {trainer.global_step}", flush=True)
        time.sleep(self.delay)  # gives a killer time to act near the announced step

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            print(f"VAL {trainer.global_step}", flush=True)


class CrashOnce(Callback):
    """Rank 1 dies (SIGKILL) after step ``at`` of the first attempt, as a failing machine would."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, i: int) -> None:
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if trainer.global_rank == 1 and trainer.global_step == self.at and first_attempt:
            os.kill(os.getpid(), signal.SIGKILL)


def slow_down_saves() -> None:
    """Make every checkpoint write take ~1 s (in 64 KiB pieces), printing WRITING when one starts."""
    import trainer.checkpoint.files as ckpt

    real_save = torch.save

    class Slow:
        def __init__(self, f: Any) -> None:
            self.f = f

        def write(self, data: bytes) -> int:
            for start in range(0, len(data), 1 << 16):
                self.f.write(data[start : start + (1 << 16)])
                time.sleep(0.02)
            return len(data)

        def flush(self) -> None:
            self.f.flush()

    def slow_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        print("WRITING", flush=True)
        real_save(obj, Slow(f), *args, **kwargs)

    ckpt.torch.save = slow_save  # type: ignore[assignment]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--slow-save", action="store_true")
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--strategy", default="single")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--max-restarts", type=int, default=0)
    parser.add_argument("--crash-rank-1-at", type=int, default=0, help="rank 1 kills itself once at this step")
    args = parser.parse_args(argv)
    if args.slow_save:
        slow_down_saves()
    seed_everything(1234)
    torch.set_num_threads(1)
    loader = DataLoader(NoisyPoints(), batch_size=BATCH, shuffle=True, num_workers=args.workers)
    val_loader = DataLoader(NoisyPoints(), batch_size=16)
    strategy: Any = args.strategy
    if args.max_restarts:
        from strategies import DDPStrategy

        strategy = DDPStrategy(devices=args.devices, device="cpu", max_restarts=args.max_restarts)
    callbacks: list[Callback] = [
        ModelCheckpoint(dirpath=args.out / "checkpoints", every_n_train_steps=1, save_top_k=0, save_last=True),
        Announce(args.delay),
    ]
    if args.crash_rank_1_at:
        callbacks.append(CrashOnce(args.crash_rank_1_at))
    trainer = Trainer(
        strategy=strategy,
        devices=args.devices,
        max_epochs=EPOCHS,
        val_check_interval=4,
        num_sanity_val_steps=1,
        enable_progress_bar=False,
        logger=False,
        default_root_dir=args.out,
        callbacks=callbacks,
    )
    module = Net()
    trainer.fit(module, loader, val_loader, ckpt_path="last" if args.resume else None)
    if trainer.is_global_zero:
        torch.save(module.state_dict(), args.out / "final.pt")
        print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
