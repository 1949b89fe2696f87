"""geartrain's trainer: the loop and the user-facing API.

>>> from trainer import Trainer, TrainModule, DataModule, seed_everything
"""

from trainer.module import DataModule, TrainModule
from trainer.trainer import Trainer
from trainer.utils import seed_everything

__all__ = ["DataModule", "TrainModule", "Trainer", "seed_everything"]
