"""Environment variables through which geartrain's processes and rooms pass settings to each other.

The names are defined once here; the values are strings, as the environment holds them.
"""

from __future__ import annotations

import os

__all__ = ["SEED", "SEED_WORKERS", "STARTED_BY_LAUNCHER", "seed_from_env"]

#: Set to "1" in processes a strategy started itself, whose end state goes back to the caller.
STARTED_BY_LAUNCHER = "GEARTRAIN_STARTED_BY_LAUNCHER"
#: The seed ``seed_everything`` was given; samplers and per-sample seeding derive theirs from it.
SEED = "GEARTRAIN_SEED"
#: "1" when ``seed_everything(workers=True)`` asked for per-worker DataLoader seeds.
SEED_WORKERS = "GEARTRAIN_SEED_WORKERS"


def seed_from_env() -> int:
    """The seed ``seed_everything`` set in this process (inherited by the ones it starts), else 0."""
    return int(os.environ.get(SEED, "0"))
