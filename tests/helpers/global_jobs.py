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

from tests.helpers import jobs
from tests.helpers.trainers import quiet_trainer

EPOCHS = 2
GLOBAL = 8  # the global batch every run keeps
SIZES = {"uneven": 37, "empty_shard": 33, "even": 40}  # last global batch: 5 (3/2), 1 (1/0), none


def fit(
    root: str | Path,
    strategy: Any,
    batch_size: int,
    n: int = SIZES["uneven"],
    drop_last: bool = False,
    ckpt_path: str | None = None,
    max_steps: int = -1,
    save_to: str | None = None,
) -> dict[str, Any]:
    """Train (or resume) for :data:`EPOCHS` epochs; the weights, steps and warnings of the run."""
    module = jobs.BlockNet()
    trainer = quiet_trainer(root, strategy=strategy, max_epochs=EPOCHS, max_steps=max_steps)
    loader = DataLoader(jobs.dataset(n), batch_size=batch_size, shuffle=True, drop_last=drop_last)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, loader, ckpt_path=ckpt_path)
    if save_to is not None:
        trainer.save_checkpoint(save_to)
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
    return out


def resume_on_world(root: str, ckpt: str, save_to: str | None = None) -> dict[str, Any]:
    """On each rank: resume ``ckpt`` with the global batch kept (``batch_size = GLOBAL / world``)."""
    import os

    world = int(os.environ["WORLD_SIZE"])
    resumed = fit(f"{root}/resumed{world}", "ddp", GLOBAL // world, ckpt_path=ckpt)
    if save_to is None:
        return resumed
    # The interrupted run this world size writes, for the next world size to resume.
    written = fit(f"{root}/first{world}", "ddp", GLOBAL // world, max_steps=3, save_to=save_to)
    return {"resumed": resumed, "written": written}
