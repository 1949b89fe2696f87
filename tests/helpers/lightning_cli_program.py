"""A Lightning CLI program as Lightning's docs teach it, ported by its import lines only.

    python tests/helpers/lightning_cli_program.py fit --trainer.max_epochs 2 --model.hidden 6
    python tests/helpers/lightning_cli_program.py fit --trainer.strategy ddp --trainer.devices 2 ...

``tests/test_lightning_cli.py`` runs it in the test's process (``LightningCLI(..., args=[...])``) and as a
script under ``strategy="ddp"``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer.lightning as pl  # was: import lightning.pytorch as pl
from trainer.lightning.cli import LightningCLI  # was: from lightning.pytorch.cli import LightningCLI


class Net(pl.LightningModule):
    """A small regression net with its own optimizer (the CLI's ``--optimizer`` replaces it)."""

    def __init__(self, hidden: int = 8, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.layer(x), y), sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.layer(x), y))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class Composed(pl.LightningModule):
    """A module given another module (dependency injection: ``--model.encoder.class_path torch.nn.Linear``)."""

    def __init__(self, encoder: nn.Module, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder = encoder
        self.head = nn.Linear(encoder.out_features, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.head(self.encoder(x)), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class Data(pl.LightningDataModule):
    """``n`` fixed samples of ``x -> sum(x)``; every stage reads them in order."""

    def __init__(self, batch_size: int = 4, n: int = 16) -> None:
        super().__init__()
        self.batch_size, self.n = batch_size, n

    def setup(self, stage: str) -> None:
        x = torch.randn(self.n, 4, generator=torch.Generator().manual_seed(0))
        self.dataset = TensorDataset(x, x.sum(1, keepdim=True))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.dataset, batch_size=self.batch_size)

    val_dataloader = test_dataloader = predict_dataloader = train_dataloader


def main(args: list[str] | None = None) -> LightningCLI:
    return LightningCLI(Net, Data, args=args)


if __name__ == "__main__":
    main()
