"""A script Lightning's ``ddp`` could not pickle: a lambda collate_fn, a lambda attribute, a logger used before fit.

    python tests/helpers/relaunch_script.py --root OUT --devices 2 --batch 4   # ddp: ranks run this again
    python tests/helpers/relaunch_script.py --root OUT --devices 1 --batch 8   # one process, same global batch

Rank 0 (the caller) writes ``OUT/weights.pt`` and ``OUT/report.json``; every rank writes ``OUT/rank-R``,
``OUT/unclosed-R.txt`` (a file it leaves open in a reference cycle) and, from a callback that never
closes them, ``OUT/steps-R.gz`` and ``OUT/steps-R.zip`` (left to the garbage collector: their
finalizers write the archives' ends).
``--lazy`` uses ``nn.LazyLinear`` layers (materialised before wrapping); ``--strategy`` picks the strategy.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import TensorBoardLogger
from tests.helpers.rank_marks import Archives
from trainer import Trainer, TrainModule, seed_everything


class LambdaNet(TrainModule):
    """A small regression net whose loss function is a lambda held as an attribute."""

    def __init__(self, lazy: bool = False) -> None:
        super().__init__()
        first: nn.Module = nn.LazyLinear(16) if lazy else nn.Linear(6, 16)
        self.net = nn.Sequential(first, nn.Tanh(), nn.LazyLinear(1) if lazy else nn.Linear(16, 1))
        self.loss_fn = lambda out, target: ((out - target) ** 2).mean()
        self.trained_in: set[int] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.trained_in.add(os.getpid())
        x, y = batch
        return self.loss_fn(self(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--lazy", action="store_true")
    args = parser.parse_args()
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)

    seed_everything(0)
    logger = TensorBoardLogger(str(root), name="tb")
    logger.log_hyperparams({"batch": args.batch, "devices": args.devices})  # before fit: holds a writer and locks
    module = LambdaNet(lazy=args.lazy)
    x = torch.randn(64, 6, generator=torch.Generator().manual_seed(1))
    data = TensorDataset(x, x.sum(1, keepdim=True).sin())
    loader = DataLoader(data, batch_size=args.batch, collate_fn=lambda items: torch.utils.data.default_collate(items))
    strategy = args.strategy if args.devices > 1 else "single"
    trainer = Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=args.devices,
        max_epochs=2,
        logger=logger,
        log_every_n_steps=4,  # within an epoch's batches: Lightning warns about a longer interval
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        callbacks=[Archives()],
    )
    trainer.fit(module, loader)
    (root / f"rank-{trainer.global_rank}").write_text(str(os.getpid()))
    cycle: dict[str, Any] = {"file": open(root / f"unclosed-{trainer.global_rank}.txt", "w")}  # noqa: SIM115
    cycle["self"] = cycle  # garbage once main returns, freed only by the cycle collector
    cycle["file"].write("line\n" * 50)  # under the buffer's size: on disk only once flushed
    full = trainer.strategy.model_state_dict()  # every rank: under FSDP it gathers the shards
    if trainer.is_global_zero:
        state = {k: v.detach().clone() for k, v in full.items()}
        torch.save(state, root / "weights.pt")
        last_path = Path(trainer.checkpoint_callback.last_model_path)
        if last_path.is_file():  # a full file (DDP); FSDP writes a sharded folder
            last = torch.load(last_path, weights_only=True)["state_dict"]
            matches = last.keys() == state.keys() and all(torch.equal(state[k], last[k]) for k in last)
        else:
            matches = None
        report = {
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "trained_here": module.trained_in == {os.getpid()},
            "module_matches_last_ckpt": matches,
        }
        (root / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
