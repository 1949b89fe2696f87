"""A ``strategy="ddp"`` script whose ranks misbehave before or after ``fit``, one way per ``--mode``.

    python tests/helpers/launch_probe.py --root OUT --mode MODE[+MODE...]

Before ``fit`` only a rank the caller started has ``RANK`` set (the caller is rank 0 from ``fit`` on).

* ``env``: the caller writes ``OUT/env.json``: the variables ``fit`` left changed in its environment.
* ``raise0``: after ``fit`` rank 0's own code raises, while rank 1 goes on to a collective.
* ``raise1``: after ``fit`` rank 1's own code raises ("planned failure on rank 1 after fit").
* ``sleep1``: before ``fit`` rank 1 writes ``OUT/rank1-pid`` and sleeps (for signals and kill -9).
* ``fail1``: before ``fit`` rank 1 raises.

``raise0`` and ``fail1`` write ``OUT/failed_at`` (``time.time()``) just before they raise.
* ``input``: before ``fit`` every rank asks ``rank R? `` with ``input()`` and writes ``OUT/answer-R``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers.relaunch_script import LambdaNet
from trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--mode", required=True)
    args = parser.parse_args()
    modes = set(args.mode.split("+"))
    root = Path(args.root)
    started = os.environ.get("RANK")  # "1" in the rank the caller started; unset in the caller before fit
    if "sleep1" in modes and started == "1":
        (root / "rank1-pid").write_text(str(os.getpid()))
        time.sleep(120)
    if "fail1" in modes and started == "1":
        (root / "failed_at").write_text(repr(time.time()))
        raise RuntimeError("planned failure on rank 1 before fit")
    if "input" in modes:
        rank = started or "0"
        (root / f"answer-{rank}").write_text(input(f"rank {rank}? "))
    before = dict(os.environ)
    x = torch.randn(16, 6, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(x, x[:, :1]), batch_size=4)
    trainer = Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    trainer.fit(LambdaNet(), loader)
    if "env" in modes and trainer.is_global_zero:
        after = dict(os.environ)
        changed = {k: after.get(k) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        (root / "env.json").write_text(json.dumps(changed))
    if "raise0" in modes and trainer.is_global_zero:
        (root / "failed_at").write_text(repr(time.time()))
        raise RuntimeError("planned failure on rank 0 after fit")
    if "raise1" in modes and trainer.global_rank == 1:
        raise RuntimeError("planned failure on rank 1 after fit")
    if "raise0" in modes:
        trainer.strategy.barrier()  # rank 1: a collective rank 0 never joins (the group's timeout: 30 min)


if __name__ == "__main__":
    main()
