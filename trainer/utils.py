"""``seed_everything``, ``grad_norm`` (Lightning's ``lightning.pytorch.utilities.grad_norm``), Lightning's
``rank_zero_*`` helpers and ``isolate_rng``, and the batch helpers under their old names (they live in
:mod:`trainer.common.tree`)."""

from __future__ import annotations

import os
import random

import torch

from trainer.common.env import SEED, SEED_WORKERS
from trainer.common.grad_norm import grad_norm
from trainer.common.rank_zero import rank_zero_debug, rank_zero_info, rank_zero_only, rank_zero_warn
from trainer.common.rng import isolate_rng
from trainer.common.tree import apply_to_tensors, batch_size_of, move_to_device

__all__ = [
    "apply_to_tensors",
    "batch_size_of",
    "grad_norm",
    "isolate_rng",
    "move_to_device",
    "rank_zero_debug",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
    "seed_everything",
]


def seed_everything(seed: int = 0, workers: bool = False) -> int:
    """Seed Python's, NumPy's and torch's random number generators (all devices) with ``seed``.

    ``workers=True`` also gives every DataLoader worker process of the trainer's loaders its own
    seeds, derived from the loader's base seed (drawn from the generators seeded here), the worker's
    id and the process's global rank, so workers of different ranks draw different augmentations and
    runs repeat (:func:`trainer.common.rng.seed_worker`; the ``GEARTRAIN_SEED_WORKERS`` environment
    variable tells the trainer, and processes it starts inherit it; Lightning's ``PL_GLOBAL_SEED`` and
    ``PL_SEED_WORKERS`` are set too). Returns the seed.

    >>> seed_everything(7)
    7
    """
    import numpy as np

    if not (0 <= seed < 2**32):
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    os.environ[SEED] = str(seed)
    os.environ[SEED_WORKERS] = str(int(workers))
    # Lightning's names too: Fabric's and Lightning's own helpers (``_auto_add_worker_init_fn``) read them.
    os.environ["PL_GLOBAL_SEED"], os.environ["PL_SEED_WORKERS"] = str(seed), str(int(workers))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds CUDA too
    return seed
