"""The resume job (``tests/helpers/resume_job.py``: shuffling, dropout, augmentation, mid-epoch validation)
with ``EMAWeightAveraging`` and a ``GradientAccumulationScheduler``, run in a process of its own that tests kill.

Prints ``STEP n`` after every batch and ``VAL n`` after every validation; ``last.ckpt`` is saved after
every optimizer step; ``final.pt`` holds the final weights (the average, as fit leaves them).

    python tests/helpers/averaging_job.py OUT_DIR [--resume]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from callbacks import Callback, EMAWeightAveraging, GradientAccumulationScheduler, ModelCheckpoint
from tests.helpers.resume_job import BATCH, EPOCHS, Announce, Net, NoisyPoints
from trainer import Trainer, seed_everything


def main(argv: list[str]) -> None:
    out, resume = Path(argv[0]), "--resume" in argv
    seed_everything(1234)
    torch.set_num_threads(1)
    callbacks: list[Callback] = [
        EMAWeightAveraging(decay=0.8),
        GradientAccumulationScheduler({1: 2}),
        ModelCheckpoint(dirpath=out / "checkpoints", every_n_train_steps=1, save_top_k=0, save_last=True),
        Announce(0.1 if resume or "--delay" in argv else 0.0),
    ]
    trainer = Trainer(
        max_epochs=EPOCHS,
        val_check_interval=4,
        num_sanity_val_steps=1,
        enable_progress_bar=False,
        logger=False,
        default_root_dir=out,
        callbacks=callbacks,
    )
    module = Net()
    loader = DataLoader(NoisyPoints(), batch_size=BATCH, shuffle=True)
    trainer.fit(module, loader, DataLoader(NoisyPoints(), batch_size=16), ckpt_path="last" if resume else None)
    torch.save(module.state_dict(), out / "final.pt")
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
