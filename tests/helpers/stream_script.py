"""docs/data.md's IterableDataset recipe under two processes, with loader workers started by ``spawn``.

    python tests/helpers/stream_script.py --root OUT [--empty-rank R]        # strategy="ddp"
    torchrun --nproc-per-node=2 tests/helpers/stream_script.py --root OUT    # the same, joined

Every rank writes ``OUT/seen-R.pt``: the sample indices it trained on. With ``--empty-rank R`` rank R's
share of the stream is empty.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from trainer import Trainer, TrainModule


def rank_and_world() -> tuple[int, int]:
    """docs/data.md's helper: the process group when there is one, else the environment every rank gets."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class Shards(IterableDataset):
    """docs/data.md's recipe, yielding (index, features) so the test can see which samples each rank took."""

    def __init__(self, n: int, empty_rank: int = -1) -> None:
        self.x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
        self.empty_rank = empty_rank

    def __iter__(self) -> Iterator[Any]:
        rank, world = rank_and_world()
        mine = range(rank, len(self.x), world) if rank != self.empty_rank else range(0)
        info = get_worker_info()
        if info is not None:
            mine = mine[info.id :: info.num_workers]
        for i in mine:
            yield i, self.x[i]


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        index, x = batch
        self.seen += index.tolist()
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--empty-rank", type=int, default=-1)
    args = parser.parse_args()
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    net = Net()
    loader = DataLoader(Shards(32, args.empty_rank), batch_size=2, num_workers=2, multiprocessing_context="spawn")
    trainer = Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(net, loader)
    torch.save(sorted(net.seen), root / f"seen-{trainer.global_rank}.pt")
    if trainer.is_global_zero:
        print(f"fit ended: step {trainer.global_step}", file=sys.stderr)


if __name__ == "__main__":
    main()
