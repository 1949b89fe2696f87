"""A plain training script: DDP on 2 processes, started by itself or by torchrun.

    python tests/helpers/ddp_script.py --root OUT                       # starts its own 2 processes
    torchrun --nproc-per-node=2 tests/helpers/ddp_script.py --root OUT  # joins torchrun's processes

Rank 0 (or the calling process) writes ``OUT/report.json`` describing what ``fit`` left behind.
``--fail-rank R --fail-at-step K`` makes rank R raise at step K, to test failure handling; with
``--hang`` it hangs there instead, and ``--timeout T`` sets the strategy's collective timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from callbacks import ModelCheckpoint
from strategies import DDPStrategy
from tests.helpers.jobs import BlockNet, dataset
from trainer import Trainer


class FailingNet(BlockNet):
    """BlockNet whose rank ``fail_rank`` raises at optimizer step ``fail_at`` (never, by default)."""

    def __init__(self, root: str, fail_rank: int = -1, fail_at: int = -1, hang: bool = False) -> None:
        super().__init__()
        self.root, self.fail_rank, self.fail_at, self.hang = root, fail_rank, fail_at, hang

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_rank == self.fail_rank and self.global_step == self.fail_at:
            Path(self.root, "failed_at").write_text(repr(time.time()))
            if self.hang:
                time.sleep(3600)
            raise RuntimeError(f"rank {self.fail_rank} fails at step {self.fail_at}")
        return super().training_step(batch, batch_idx)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-at-step", type=int, default=-1)
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--timeout", type=float, default=None)
    args = parser.parse_args()
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)

    module = FailingNet(str(root), args.fail_rank, args.fail_at_step, args.hang)
    checkpoint = ModelCheckpoint(dirpath=root / "checkpoints", monitor="val/acc", mode="max", save_last=True)
    trainer = Trainer(
        strategy="ddp" if args.timeout is None else DDPStrategy(timeout=args.timeout),
        devices=2,
        max_epochs=2,
        accumulate_grad_batches=2,
        callbacks=[checkpoint],
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        logger=False,
        default_root_dir=root,
    )
    train = DataLoader(dataset(160), batch_size=4)
    val = DataLoader(dataset(37, seed=2), batch_size=5)
    trainer.fit(module, train, val)

    if trainer.is_global_zero:
        last = torch.load(checkpoint.last_model_path, weights_only=True)["state_dict"]
        state = module.state_dict()
        report = {
            "launched": "TORCHELASTIC_RUN_ID" not in os.environ,
            "world_size": trainer.world_size,
            "module_matches_last_ckpt": all(torch.equal(state[k], last[k]) for k in last),
            "global_step": trainer.global_step,
            "epoch": trainer.current_epoch,
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
            "metric_types": [type(v).__name__ for v in trainer.callback_metrics.values()],
            "best_model_path": checkpoint.best_model_path,
            "best_model_score": checkpoint.best_model_score.item(),  # a 0-d tensor, as Lightning's
            "weights_sum": [float(p.detach().double().sum()) for p in module.parameters()],
        }
        (root / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
