"""Jobs of the IterableDataset-under-DDP tests (issue #17): streams the user shards by rank and worker.

Importable by spawned ranks. :class:`RankStream` is the documented recipe (docs/data.md): rank ``r``
of ``W`` takes samples ``r, r + W, ...`` of a common stream, and within a rank each DataLoader worker
takes every ``num_workers``-th of those. Rank 0 may be given extra samples, so the shards differ.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from tests.helpers import jobs
from tests.helpers.global_jobs import SaveAt
from tests.helpers.trainers import quiet_trainer

COMMON = 32  # samples every rank's shard is cut from
EXTRA = 16  # further samples only rank 0 streams (an unequal shard)
EPOCHS = 2


class RankStream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """This rank's (and worker's) share of ``jobs.dataset(COMMON)``, plus ``extra`` samples on rank 0."""

    def __init__(self, extra: int = 0) -> None:
        self.data = jobs.dataset(COMMON + EXTRA)  # one dataset whatever ``extra``: the same samples
        self.extra = extra

    def _mine(self) -> list[int]:
        rank = dist.get_rank() if dist.is_initialized() else 0
        world = dist.get_world_size() if dist.is_initialized() else 1
        mine = list(range(rank, COMMON, world))
        if rank == 0:
            mine += list(range(COMMON, COMMON + self.extra))
        info = get_worker_info()
        return mine if info is None else mine[info.id :: info.num_workers]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in self._mine():
            yield self.data[i]


class SizedRankStream(RankStream):
    """:class:`RankStream` with ``__len__``: the number of samples this rank streams."""

    def __len__(self) -> int:
        rank = dist.get_rank() if dist.is_initialized() else 0
        world = dist.get_world_size() if dist.is_initialized() else 1
        return len(range(rank, COMMON, world)) + (self.extra if rank == 0 else 0)


def fit(
    root: str | Path,
    strategy: Any,
    batch_size: int,
    sized: bool,
    extra: int = 0,
    save_to: str | None = None,
    ckpt_path: str | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Train :class:`~tests.helpers.jobs.BlockNet` on a rank stream for :data:`EPOCHS` epochs.

    ``save_to``: also write a checkpoint after step 3 (mid-epoch); ``ckpt_path``: resume from one.
    """
    module = jobs.BlockNet()
    callbacks = [SaveAt(3, save_to)] if save_to is not None else []
    trainer = quiet_trainer(root, callbacks, strategy=strategy, max_epochs=EPOCHS, **kwargs)
    dataset = SizedRankStream(extra) if sized else RankStream(extra)
    trainer.fit(module, DataLoader(dataset, batch_size=batch_size), ckpt_path=ckpt_path)
    return {"weights": jobs.weights(module), "steps": trainer.global_step, "batches": trainer.num_training_batches}


def ddp_streams(root: str) -> dict[str, Any]:
    """On each rank: unequal shards with and without a length (progress bar on), and a mid-epoch resume."""
    world = int(os.environ["WORLD_SIZE"])
    out: dict[str, Any] = {}
    ckpt = f"{root}/stream.ckpt"
    for sized in (False, True):
        save_to = ckpt if not sized else None
        out[sized] = fit(f"{root}/{sized}", "ddp", 8 // world, sized, EXTRA, save_to, enable_progress_bar=True)
    out["resumed"] = fit(f"{root}/resumed", "ddp", 8 // world, False, EXTRA, ckpt_path=ckpt)
    return out


def common_samples() -> torch.utils.data.Subset[Any]:
    """The samples every rank's shard is cut from, as one map-style dataset (the one-process reference)."""
    return torch.utils.data.Subset(jobs.dataset(COMMON + EXTRA), range(COMMON))
