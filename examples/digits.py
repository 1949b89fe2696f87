"""The default job: a small MLP classifying the 8x8 handwritten digits (UCI, as bundled by scikit-learn).

The 1,797 images ship inside this repository (``examples/data/digits.npz``, 45 KB, written from
scikit-learn's copy by ``python -m examples.make_digits``), so the job needs no download and does not
import scikit-learn, whose import (with SciPy) would cost more start-up time than the job's training
step. A seeded split holds out 20% for validation (which picks the best checkpoint and stops early)
and another 20% for the test, which nothing during training looks at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import DataModule, TrainModule

__all__ = ["DIGITS_PATH", "DigitsClassifier", "DigitsData", "load_digits"]

#: The bundled digits: ``images`` (1797 x 64, uint8 pixel intensities 0-16) and ``labels`` (1797, uint8).
DIGITS_PATH = Path(__file__).resolve().parent / "data" / "digits.npz"


def load_digits(path: Path = DIGITS_PATH) -> tuple[np.ndarray, np.ndarray]:
    """The bundled digits as ``(images, labels)``: uint8 arrays of shape (1797, 64) and (1797,).

    The same values as ``sklearn.datasets.load_digits(return_X_y=True)`` (which returns them as
    float64 and int64), read in a few milliseconds without importing scikit-learn.
    """
    with np.load(path) as data:
        return data["images"], data["labels"]


class DigitsData(DataModule):
    """The digits as float tensors in [0, 1], split into training, validation and test sets.

    One seeded permutation of the images: the first ``val_fraction`` of it validates, the next
    ``test_fraction`` tests, the rest trains. The three never overlap, so the test accuracy is
    measured on images that neither training nor the choice of checkpoint has seen.

    Args:
        batch_size: samples per batch.
        val_fraction: share of the images held out for validation.
        test_fraction: share of the images held out for the test.
        seed: seed of the split (not of training).
        num_workers: DataLoader worker processes.
    """

    def __init__(
        self,
        batch_size: int = 64,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        seed: int = 0,
        num_workers: int = 0,
    ):
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        if not 0.0 < test_fraction < 1.0 - val_fraction:
            raise ValueError(f"test_fraction must be in (0, 1 - val_fraction), got {test_fraction}")
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.seed = seed
        self.num_workers = num_workers
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None
        self.test_set: TensorDataset | None = None

    def setup(self, stage: str) -> None:
        if self.train_set is not None:
            return
        images, labels = load_digits()
        x = torch.from_numpy(images).to(torch.float32) / 16.0
        y = torch.from_numpy(labels).to(torch.long)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(self.seed))
        n_val = int(len(x) * self.val_fraction)
        n_test = int(len(x) * self.test_fraction)
        val_idx, test_idx, train_idx = order[:n_val], order[n_val : n_val + n_test], order[n_val + n_test :]
        self.train_set = TensorDataset(x[train_idx], y[train_idx])
        self.val_set = TensorDataset(x[val_idx], y[val_idx])
        self.test_set = TensorDataset(x[test_idx], y[test_idx])

    def train_dataloader(self) -> DataLoader[Any]:
        assert self.train_set is not None, "call setup() first"
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader[Any]:
        assert self.val_set is not None, "call setup() first"
        return DataLoader(self.val_set, batch_size=256, num_workers=self.num_workers)

    def test_dataloader(self) -> DataLoader[Any]:
        assert self.test_set is not None, "call setup() first"
        return DataLoader(self.test_set, batch_size=256, num_workers=self.num_workers)

    def predict_dataloader(self) -> DataLoader[Any]:
        return self.test_dataloader()


OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


class DigitsClassifier(TrainModule):
    """MLP 64 -> hidden -> hidden -> 10 with dropout.

    Args:
        hidden: width of the hidden layers.
        dropout: dropout probability after each hidden layer.
        optimizer: builds the optimizer from the parameters (Hydra's ``optim`` group passes a
            ``_partial_``); default AdamW(lr=3e-3, weight_decay=1e-4).
        scheduler: builds a per-epoch scheduler from the optimizer; default cosine decay over
            ``max_epochs``.
    """

    def __init__(
        self,
        hidden: int = 128,
        dropout: float = 0.1,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
    ):
        super().__init__()
        self.save_hyperparameters("hidden", "dropout")
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.net = nn.Sequential(
            nn.Linear(64, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate("val", batch, prog_bar=True)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate("test", batch, prog_bar=False)

    def _evaluate(self, stage: str, batch: tuple[torch.Tensor, torch.Tensor], prog_bar: bool) -> None:
        # Accuracy as a batch-size-weighted epoch mean of each batch's accuracy is the share of correct
        # predictions over the whole set, summed over processes with sync_dist: the value a torchmetrics
        # MulticlassAccuracy(average="micro") gives, without importing torchmetrics (and SciPy with it).
        x, y = batch
        logits = self(x)
        size = y.shape[0]
        loss = nn.functional.cross_entropy(logits, y)
        accuracy = (logits.argmax(dim=-1) == y).float().mean()
        self.log(f"{stage}/loss", loss, prog_bar=prog_bar, sync_dist=True, batch_size=size)
        self.log(f"{stage}/acc", accuracy, prog_bar=prog_bar, sync_dist=True, batch_size=size)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(x).argmax(dim=-1)

    def configure_optimizers(self) -> dict[str, Any]:
        if self.optimizer_factory is not None:
            optimizer = self.optimizer_factory(self.parameters())
        else:
            optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3, weight_decay=1e-4)
        if self.scheduler_factory is not None:
            scheduler = self.scheduler_factory(optimizer)
        else:
            epochs = self.trainer.max_epochs if self.trainer.max_epochs and self.trainer.max_epochs > 0 else 100
            scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}
