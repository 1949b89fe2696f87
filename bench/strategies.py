"""Throughput of each strategy on the default job (digits MLP), the same global batch for all.

    python bench/strategies.py [--steps 300] [--batch 64]

Prints, per strategy, training samples per second measured between step 20 and the last step (so
process start-up and warm-up are left out), and the wall time of the whole ``fit`` call (which
includes starting worker processes for ddp/fsdp). Multi-process strategies get ``batch / devices``
per rank, so every row does the same optimisation.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from callbacks import Callback
from examples.digits import DigitsClassifier, DigitsData
from trainer import Trainer, seed_everything

WARMUP = 20


class Throughput(Callback):
    """Times steps ``WARMUP``..end on rank 0; its state travels back to the caller after ``fit``."""

    def __init__(self, global_batch: int) -> None:
        self.global_batch = global_batch
        self.start: float | None = None
        self.samples_per_s = 0.0

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == WARMUP:
            self.start = time.perf_counter()
        elif self.start is not None:
            steps = trainer.global_step - WARMUP
            self.samples_per_s = steps * self.global_batch / (time.perf_counter() - self.start)

    def state_dict(self) -> dict[str, Any]:
        return {"samples_per_s": self.samples_per_s}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.samples_per_s = state["samples_per_s"]


RUNS: list[tuple[str, dict[str, Any]]] = [
    ("single", {"strategy": "single"}),
    ("amp (bf16-mixed)", {"strategy": "amp"}),
    ("dp", {"strategy": "dp"}),
    ("ddp, 1 process", {"strategy": "ddp", "devices": 1}),
    ("ddp, 2 processes", {"strategy": "ddp", "devices": 2}),
    ("fsdp, 2 processes", {"strategy": "fsdp", "devices": 2}),
]


def run(options: dict[str, Any], steps: int, batch: int) -> tuple[float, float]:
    seed_everything(0)
    devices = int(options.get("devices", 1))
    meter = Throughput(batch)
    trainer = Trainer(
        **options,
        max_steps=steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_checkpointing=False,
        logger=False,
        callbacks=[meter],
    )
    start = time.perf_counter()
    trainer.fit(DigitsClassifier(dropout=0.0), datamodule=DigitsData(batch_size=batch // devices))
    return meter.samples_per_s, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in this process (workers get 1)")
    args = parser.parse_args()
    import torch

    # Workers started by the elastic launcher run with OMP_NUM_THREADS=1; give the in-process rows the
    # same budget so the table compares strategies, not thread counts.
    torch.set_num_threads(args.threads)
    print(f"{'strategy':<20} {'samples/s':>10} {'fit wall s':>11}")
    for name, options in RUNS:
        rate, wall = run(options, args.steps, args.batch)
        print(f"{name:<20} {rate:>10.0f} {wall:>11.1f}", flush=True)


if __name__ == "__main__":
    main()
