"""Jobs of the global-batch tests: the same training on one or several processes, with shuffling.

Importable by spawned ranks. :func:`fit` trains :class:`~tests.helpers.jobs.BlockNet` (no random draws
in its step, so one process and several see the same numbers up to float summation order) on a
shuffled loader whose ``batch_size`` is per process: the global batch is ``batch_size * processes``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from callbacks import Callback
from tests.helpers import jobs
from tests.helpers.trainers import quiet_trainer

EPOCHS = 2
GLOBAL = 8  # the global batch every run keeps
ACCUMULATE = {"accumulate_grad_batches": 2, "gradient_clip_val": 0.5}  # a window ends on the short batch
SIZES = {"uneven": 37, "empty_shard": 33, "even": 40}  # last global batch: 5 (3/2), 1 (1/0), none


class SaveAt(Callback):
    """Every rank calls ``trainer.save_checkpoint(path)`` after optimizer step ``step``: a mid-epoch checkpoint."""

    def __init__(self, step: int, path: str) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def fit(
    root: str | Path,
    strategy: Any,
    batch_size: int,
    n: int = SIZES["uneven"],
    drop_last: bool = False,
    ckpt_path: str | None = None,
    save_to: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Train (or resume) for :data:`EPOCHS` epochs; the weights, steps and warnings of the run.

    ``save_to``: also write a checkpoint there after step 3, in the first of the epoch's 5 batches.
    ``options``: further ``Trainer`` arguments.
    """
    module = jobs.BlockNet()
    callbacks = [SaveAt(3, save_to)] if save_to is not None else []
    trainer = quiet_trainer(root, callbacks, strategy=strategy, max_epochs=EPOCHS, **options)
    loader = DataLoader(jobs.dataset(n), batch_size=batch_size, shuffle=True, drop_last=drop_last)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, loader, ckpt_path=ckpt_path)
    return {
        "weights": jobs.weights(module),
        "steps": trainer.global_step,
        "warnings": [str(w.message) for w in caught if type(w.message).__name__ == "InexactResumeWarning"],
    }


def ddp_scenarios(root: str) -> dict[str, Any]:
    """On each rank: DDP with shuffle on even, uneven and empty-shard data, and with ``drop_last``."""
    import os

    per_rank = GLOBAL // int(os.environ["WORLD_SIZE"])
    out: dict[str, Any] = {}
    for name, n in SIZES.items():
        out[name] = fit(f"{root}/{name}", "ddp", per_rank, n=n)
    out["drop_last"] = fit(f"{root}/drop_last", "ddp", per_rank, drop_last=True)
    out["accumulate"] = fit(f"{root}/accumulate", "ddp", per_rank, **ACCUMULATE)
    return out


def resume_on_world(root: str, ckpt: str, save_to: str | None = None) -> dict[str, Any]:
    """On each rank: resume ``ckpt`` with the global batch kept (``batch_size = GLOBAL / world``)."""
    import os

    world = int(os.environ["WORLD_SIZE"])
    resumed = fit(f"{root}/resumed{world}", "ddp", GLOBAL // world, ckpt_path=ckpt)
    if save_to is None:
        return resumed
    # A run on this world size that writes a mid-epoch checkpoint for the next world size to resume.
    written = fit(f"{root}/first{world}", "ddp", GLOBAL // world, save_to=save_to)
    return {"resumed": resumed, "written": written}
