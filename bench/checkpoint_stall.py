"""Checkpoint stall: how long a save blocks the training loop, asynchronous vs synchronous.

The state is a stack of large ``nn.Linear`` layers (about 100M parameters, 400 MB in float32).
geartrain's :class:`~trainer.checkpoint.AsyncCheckpointWriter` blocks only while it copies the state
into CPU memory; the twin is a plain synchronous ``torch.save`` of the same state. Wall time: being
blocked is what is measured. The background write finishes (outside the timing) before the next
measurement starts, so the two never compete for the disk.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from bench.core import Result, paired
from trainer.checkpoint import AsyncCheckpointWriter

__all__ = ["make_state", "run"]


def make_state(width: int, layers: int) -> dict[str, torch.Tensor]:
    """A model state of ``layers`` Linear(width, width) layers (``layers * width**2`` parameters)."""
    torch.manual_seed(0)
    with torch.no_grad():
        model = nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))
    return model.state_dict()


def run(quick: bool = False, pairs: int = 5) -> list[Result]:
    """One row: median blocked time of an async save over that of a synchronous ``torch.save``."""
    width, layers = (256, 2) if quick else (5000, 4)
    state = {"state_dict": make_state(width, layers)}
    params = sum(t.numel() for t in state["state_dict"].values())
    writer = AsyncCheckpointWriter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)

            def ours() -> float:
                start = time.perf_counter()
                writer.save(state, root / "async.ckpt")
                blocked = time.perf_counter() - start
                writer.wait()
                return blocked

            def theirs() -> float:
                start = time.perf_counter()
                torch.save(state, root / "sync.ckpt")
                return time.perf_counter() - start

            a, b, ratio, ratios = paired(ours, theirs, pairs, warmup=0 if quick else 1)
    finally:
        writer.close()
    note = f"{params / 1e6:.1f}M parameters ({params * 4 / 1e6:.0f} MB), wall time blocked, {pairs} pairs"
    return [Result("checkpoint stall (async save)", a, b, ratio, "<= 0.15x", ratio <= 0.15, note, ratios)]
