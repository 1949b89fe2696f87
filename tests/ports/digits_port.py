"""A Lightning project in the style of the popular lightning-hydra-template: a DataModule and a
LightningModule with torchmetrics and a ReduceLROnPlateau scheduler dict, trained on the 8x8 digits.

Written as Lightning code; only the import block below differs from a Lightning 2.x project.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset, random_split
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification.accuracy import Accuracy

# --- imports: the only lines that differ from the Lightning project ---
from callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint, TensorBoardLogger
from trainer import DataModule as LightningDataModule
from trainer import Trainer, seed_everything
from trainer import TrainModule as LightningModule

# --- end of imports ---

DIGITS = Path(__file__).resolve().parents[2] / "examples" / "data" / "digits.npz"


class DigitsDataModule(LightningDataModule):
    def __init__(
        self,
        data_dir: str = str(DIGITS),
        train_val_test_split: tuple[int, int, int] = (1197, 300, 300),
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.data_train: Dataset[Any] | None = None
        self.data_val: Dataset[Any] | None = None
        self.data_test: Dataset[Any] | None = None
        self.batch_size_per_device = batch_size

    @property
    def num_classes(self) -> int:
        return 10

    def prepare_data(self) -> None:
        assert Path(self.hparams.data_dir).is_file()

    def setup(self, stage: str | None = None) -> None:
        if self.trainer is not None:
            if self.hparams.batch_size % self.trainer.world_size != 0:
                raise RuntimeError("batch size must divide the number of devices")
            self.batch_size_per_device = self.hparams.batch_size // self.trainer.world_size
        if not self.data_train and not self.data_val and not self.data_test:
            with np.load(self.hparams.data_dir) as data:
                images = torch.from_numpy(data["images"]).float().div(16.0)
                labels = torch.from_numpy(data["labels"]).long()
            dataset = TensorDataset(images, labels)
            self.data_train, self.data_val, self.data_test = random_split(
                dataset=dataset,
                lengths=self.hparams.train_val_test_split,
                generator=torch.Generator().manual_seed(42),
            )

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(
            dataset=self.data_train,
            batch_size=self.batch_size_per_device,
            num_workers=self.hparams.num_workers,
            pin_memory=self.hparams.pin_memory,
            shuffle=True,
        )

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(dataset=self.data_val, batch_size=self.batch_size_per_device, shuffle=False)

    def test_dataloader(self) -> DataLoader[Any]:
        return DataLoader(dataset=self.data_test, batch_size=self.batch_size_per_device, shuffle=False)


class SimpleDenseNet(nn.Module):
    def __init__(self, input_size: int = 64, lin1_size: int = 64, lin2_size: int = 64, output_size: int = 10) -> None:
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(input_size, lin1_size),
            nn.BatchNorm1d(lin1_size),
            nn.ReLU(),
            nn.Linear(lin1_size, lin2_size),
            nn.BatchNorm1d(lin2_size),
            nn.ReLU(),
            nn.Linear(lin2_size, output_size),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.view(x.size(0), -1))


class DigitsLitModule(LightningModule):
    def __init__(self, net: nn.Module, lr: float = 0.01, weight_decay: float = 0.0, compile: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False, ignore=["net"])
        self.net = net
        self.criterion = torch.nn.CrossEntropyLoss()
        self.train_acc = Accuracy(task="multiclass", num_classes=10)
        self.val_acc = Accuracy(task="multiclass", num_classes=10)
        self.test_acc = Accuracy(task="multiclass", num_classes=10)
        self.train_loss = MeanMetric()
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()
        self.val_acc_best = MaxMetric()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def on_train_start(self) -> None:
        self.val_loss.reset()
        self.val_acc.reset()
        self.val_acc_best.reset()

    def model_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, y = batch
        logits = self.forward(x)
        loss = self.criterion(logits, y)
        preds = torch.argmax(logits, dim=1)
        return loss, preds, y

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, preds, targets = self.model_step(batch)
        self.train_loss(loss)
        self.train_acc(preds, targets)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, preds, targets = self.model_step(batch)
        self.val_loss(loss)
        self.val_acc(preds, targets)
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("val/acc", self.val_acc, on_step=False, on_epoch=True, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        acc = self.val_acc.compute()
        self.val_acc_best(acc)
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True, prog_bar=True)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, preds, targets = self.model_step(batch)
        self.test_loss(loss)
        self.test_acc(preds, targets)
        self.log("test/loss", self.test_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("test/acc", self.test_acc, on_step=False, on_epoch=True, prog_bar=True)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.1, patience=10)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "monitor": "val/loss", "interval": "epoch", "frequency": 1},
        }


def train(root: str, strategy: str = "auto", devices: int = 1) -> dict[str, Any]:
    """Train as the template's ``train.py`` does (fit, then test the best checkpoint); return what a test checks."""
    seed_everything(12345, workers=True)
    datamodule = DigitsDataModule(batch_size=64)
    model = DigitsLitModule(net=SimpleDenseNet(), lr=0.01)
    callbacks = [
        ModelCheckpoint(
            dirpath=f"{root}/checkpoints",
            monitor="val/acc",
            mode="max",
            save_last=True,
            filename="epoch_{epoch:03d}",
            auto_insert_metric_name=False,
        ),
        EarlyStopping(monitor="val/acc", patience=10, mode="max"),
        LearningRateMonitor(logging_interval="epoch"),
    ]
    logger = TensorBoardLogger(save_dir=f"{root}/tensorboard", name=None, version="run")
    trainer = Trainer(
        default_root_dir=root,
        min_epochs=1,
        max_epochs=3,
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        callbacks=callbacks,
        logger=logger,
        deterministic=False,
        enable_progress_bar=False,
        check_val_every_n_epoch=1,
    )
    trainer.fit(model=model, datamodule=datamodule)
    train_metrics = trainer.callback_metrics
    ckpt_path = trainer.checkpoint_callback.best_model_path
    test_results = trainer.test(model=model, datamodule=datamodule, ckpt_path=ckpt_path)
    return {
        "hparams_lr": model.hparams.lr,
        "hparams_keys": sorted(model.hparams),
        "dm_batch_size": datamodule.hparams.batch_size,
        "val_acc": float(train_metrics["val/acc"]),
        "val_acc_best": float(train_metrics["val/acc_best"]),
        "test": test_results,
        "current_epoch": trainer.current_epoch,
        "global_step": trainer.global_step,
        "best": Path(ckpt_path).name,
        "lr": trainer.optimizers[0].param_groups[0]["lr"],
    }
