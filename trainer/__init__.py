"""geartrain's trainer: the loop and the user-facing API.

>>> from trainer import Trainer, TrainModule, DataModule, Tuner, seed_everything

The names are imported on first use, so importing a submodule (``trainer.common.tree``, which the
strategies and callbacks use) does not import the Trainer, and through it the strategies and callbacks.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trainer.common import lightning_shared

if TYPE_CHECKING:
    from trainer.module import DataModule, TrainModule
    from trainer.trainer import Trainer
    from trainer.tuner import Tuner
    from trainer.utils import seed_everything

__all__ = ["DataModule", "TrainModule", "Trainer", "Tuner", "seed_everything"]

_LAZY = {
    "DataModule": "trainer.module",
    "TrainModule": "trainer.module",
    "Trainer": "trainer.trainer",
    "Tuner": "trainer.tuner",
    "seed_everything": "trainer.utils",
}


_CHECKED: list[bool] = []

# lightning_utilities' rank_zero_only.rank and fabric's warning classes, one with Lightning's (trainer/common/lightning_shared.py).
lightning_shared.install()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        if not _CHECKED:
            from trainer.shadowing import check_sibling_packages

            check_sibling_packages()  # a user's callbacks.py would otherwise fail deep inside the import
            _CHECKED.append(True)
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later look-ups find it without calling this again
        return value
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
