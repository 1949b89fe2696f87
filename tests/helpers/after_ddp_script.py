"""A plain script: DDP ``fit`` on 2 processes it starts itself, then the caller's trainer is used on.

    python tests/helpers/after_ddp_script.py --root OUT

After ``fit`` returns in the calling process, ``save_checkpoint``, ``test`` (as ``validate``) and ``predict``
run there as after a one-process fit; ``OUT/report.json`` says what they gave.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from tests.helpers.jobs import BlockNet, dataset
from trainer import Trainer


class Net(BlockNet):
    """BlockNet with a test step (the loss) and a predict step (the logits)."""

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test/loss", torch.nn.functional.cross_entropy(self(x), y), sync_dist=True)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    root = Path(parser.parse_args().root)
    module = Net()
    trainer = Trainer(
        strategy="ddp",
        devices=2,
        max_epochs=1,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_checkpointing=False,
        logger=False,
        default_root_dir=root,
    )
    trainer.fit(module, DataLoader(dataset(32), batch_size=4))
    trainer.save_checkpoint(root / "after.ckpt")
    val = DataLoader(dataset(37, seed=2), batch_size=5)
    report = {
        "global_step": trainer.global_step,
        "test_with_ckpt": trainer.test(module, val, ckpt_path=root / "after.ckpt", verbose=False),
        "predict_batches": len(trainer.predict(module, DataLoader(dataset(8), batch_size=4)) or []),
    }
    (root / "report.json").write_text(json.dumps(report))
    torch.save(module.state_dict(), root / "weights.pt")


if __name__ == "__main__":
    main()
