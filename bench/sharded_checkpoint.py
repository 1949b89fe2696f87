"""Sharded checkpoints: peak host memory and time of a save, sharded directory vs full gathered file.

``python -m bench sharded_checkpoint`` (or ``python -m bench.sharded_checkpoint``). N gloo processes
(started by geartrain's launcher) shard a stack of ``Linear(width, width)`` layers with
:class:`~strategies.FSDPStrategy`, take one AdamW step (so the optimizer holds two buffers per
parameter), then alternate the two ways a checkpoint is written:

- *full* (``state_dict_type="full"``, today's file): the full model and optimizer state gathered on
  rank 0 (``model_state_dict`` / ``optimizer_state_dict``), written there with ``torch.save``;
- *sharded* (the default): every rank's own shards and the optimizer's, written by
  ``trainer.checkpoint.sharded.save_sharded`` (torch.distributed.checkpoint) into a directory.

Memory is what a process holds during the save as a fraction of the full state's size (model +
optimizer, float32): its own shards (1/N) plus its peak resident set during the save above its
resident set just before (``/proc/self/clear_refs`` resets the high-water mark). The target for
sharded saves is ``1/N`` plus a small overhead; the full gather costs rank 0 the whole state on top. Time is the slowest rank's wall time of a save,
and of loading it back (``load_sharded`` vs reading the file on every rank and setting the full
state). Medians over the repeats; the first save of each kind is a warm-up, outside the figures.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench.core import Result

__all__ = ["measure", "run"]


def _memory_kib() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in KiB."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS", "VmHWM")))
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def _reset_peak() -> int:
    """Give freed heap back to the system, reset the high-water mark to the resident set; return it in KiB.

    Without the trim, memory a previous save freed stays resident (glibc keeps it), the next save
    reuses it and its peak reads as nothing.
    """
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _memory_kib()[0]


class _Stack(nn.Module):
    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return x


def _worker(width: int, layers: int, repeats: int, root: str) -> dict[str, Any]:
    """In each rank: shard, step once, then time and measure both kinds of save and load."""
    import torch.distributed as dist

    from strategies import FSDPStrategy
    from trainer.checkpoint.sharded import load_sharded, save_sharded

    torch.set_num_threads(1)
    strategy = FSDPStrategy()
    strategy.setup_environment()
    module = _Stack(width, layers)
    strategy.setup(module)  # type: ignore[arg-type]
    assert strategy.model is not None
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    strategy.step("forward", torch.randn(8, width)).sum().backward()
    optimizer.step()
    full_bytes = sum(p.numel() for p in module.parameters()) * 4 * 3  # weights + AdamW's two buffers
    # What this rank holds anyway: its shards of the weights and of the two buffers.
    own_bytes = sum(getattr(p, "to_local", lambda p=p: p)().numel() for p in module.parameters()) * 4 * 3
    rank = dist.get_rank()

    def full_save(path: Path) -> None:
        state = {"state_dict": strategy.model_state_dict(), "optimizers": [strategy.optimizer_state_dict(optimizer)]}
        if rank == 0:
            torch.save(state, path)
        del state
        dist.barrier()

    def sharded_save(path: Path) -> None:
        state = {
            "state_dict": strategy.sharded_model_state_dict(),
            "optimizers": [strategy.sharded_optimizer_state_dict(optimizer)],
        }
        save_sharded(path, state)
        del state
        dist.barrier()

    def full_load(path: Path) -> None:
        state = torch.load(path, map_location="cpu", weights_only=True)
        strategy.load_model_state_dict(state["state_dict"])
        strategy.load_optimizer_state(optimizer, state["optimizers"][0])
        dist.barrier()

    def sharded_load(path: Path) -> None:
        assert strategy.module is not None
        load_sharded(path, strategy.module, [optimizer])
        dist.barrier()

    out: dict[str, list[float]] = {key: [] for key in ("full_mem", "sharded_mem", "full_s", "sharded_s")}
    out.update({"full_load_s": [], "sharded_load_s": []})
    for i in range(repeats + 1):
        for kind, save, load in (("full", full_save, full_load), ("sharded", sharded_save, sharded_load)):
            path = Path(root) / f"{kind}-{i}.ckpt"
            dist.barrier()
            base = _reset_peak()
            started = time.perf_counter()
            save(path)
            seconds = time.perf_counter() - started
            peak = (_memory_kib()[1] - base) * 1024
            started = time.perf_counter()
            load(path)
            load_seconds = time.perf_counter() - started
            if i > 0:  # the first round pages in the code of both paths
                out[f"{kind}_mem"].append(peak / full_bytes)
                out[f"{kind}_s"].append(seconds)
                out[f"{kind}_load_s"].append(load_seconds)
    per_rank: list[Any] = [None] * dist.get_world_size()
    medians = {k: statistics.median(v) for k, v in out.items()}
    dist.all_gather_object(per_rank, {**medians, "own": own_bytes / full_bytes})
    return {"ranks": per_rank, "full_mib": full_bytes / 2**20}


def measure(world: int, width: int, layers: int, repeats: int) -> dict[str, Any]:
    """Start ``world`` gloo processes and measure; per-rank medians plus the full state's size."""
    from strategies.launch import start_processes

    # A fixed mmap threshold: glibc otherwise raises it after the first large free, and later
    # large buffers come from a heap that keeps freed memory resident (see _reset_peak).
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    try:
        with tempfile.TemporaryDirectory() as root:
            out: dict[str, Any] = start_processes(_worker, (width, layers, repeats, root), world)
    finally:
        if saved is None:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
    return out


def run(quick: bool = False, pairs: int = 7) -> list[Result]:
    """Rows for 2 (and, unless ``quick``, 4) ranks: memory fractions, then save and load times."""
    width, layers, repeats = (256, 2, 1) if quick else (1024, 12, 3)
    results: list[Result] = []
    for world in (2,) if quick else (2, 4):
        out = measure(world, width, layers, repeats)
        ranks = out["ranks"]
        # Held during the save: the rank's own shards plus the save's peak above them.
        extra = max(max(r["sharded_mem"], 0.0) for r in ranks)  # the worst rank
        sharded = max(r["own"] + max(r["sharded_mem"], 0.0) for r in ranks)
        full = ranks[0]["own"] + ranks[0]["full_mem"]  # rank 0 gathers and writes
        target = 1 / world + 0.1
        size = f"{out['full_mib']:.0f} MiB of model + AdamW state, {layers} x Linear({width}), {repeats} repeats"
        results.append(
            Result(
                f"sharded save, {world} ranks: peak host memory / full state (worst rank; full: rank 0)",
                sharded,
                full,
                sharded / full if full else float("nan"),
                f"<= 1/{world} + 0.1",
                sharded <= target,
                f"{size}; held during the save (own shards + peak above them): sharded {sharded:.3f}, "
                f"full gather {full:.3f} of the full state; peak above the shards: sharded {extra:.3f}, "
                f"full {ranks[0]['full_mem']:.3f}",
                unit="x state",
            )
        )
        for what in ("", "_load"):
            ours = max(r[f"sharded{what}_s"] for r in ranks)
            theirs = max(r[f"full{what}_s"] for r in ranks)
            results.append(
                Result(
                    f"sharded {'load' if what else 'save'} vs full, {world} ranks (slowest rank, wall)",
                    ours,
                    theirs,
                    ours / theirs,
                    "report",
                    True,
                    size,
                )
            )
    return results


if __name__ == "__main__":
    from bench.core import format_table

    print(format_table(run()))
