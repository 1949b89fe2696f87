"""Small Lightning programs whose final weights must be Lightning 2.6.6's, bit for bit (tests/test_lightning_ports.py).

Written as Lightning code: each draws random numbers where real projects do (shuffled loaders,
augmentation in ``__getitem__`` for training and validation data, dropout, noise in a step, a
callback and the module both drawing in the same hook), validates mid-epoch and at the epoch's end,
runs several epochs with a scheduler. ``tests/data/lightning/record_ports.py`` runs this very file
with the import block below swapped for Lightning's and stores the final weights.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

# --- imports: the only lines that differ from the Lightning program ---
from callbacks import Callback, EarlyStopping
from trainer import DataModule as LightningDataModule
from trainer import Trainer, seed_everything
from trainer import TrainModule as LightningModule

# --- end of imports ---


class Blobs(Dataset):
    """Points around class centres, with noise drawn from the global generator on every read."""

    def __init__(self, n: int, seed: int, noise: float = 0.1) -> None:
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, 3, (n,), generator=g)
        self.x = torch.randn(n, 8, generator=g) * 0.5 + self.y[:, None].float()
        self.noise = noise

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + self.noise * torch.randn(8), self.y[i]


class BlobsData(LightningDataModule):
    def __init__(self, batch_size: int = 8, shuffle_val: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        self.train_set, self.val_set = Blobs(72, seed=0), Blobs(24, seed=1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size, shuffle=self.hparams.shuffle_val)


class Classifier(LightningModule):
    """Dropout, a step-interval scheduler; validation reads augmented data."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y), prog_bar=True)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.8)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class NoisyRegressor(LightningModule):
    """Noise in the training step (as a VAE's sampling), MC dropout in validation, a plateau scheduler."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Dropout(0.1), nn.Linear(12, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        z = x + 0.05 * torch.randn_like(x)
        loss = nn.functional.mse_loss(self.net(z).squeeze(1), y.float())
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.net.train()  # Monte-Carlo dropout: random masks in validation too
        pred = torch.stack([self.net(x).squeeze(1) for _ in range(2)]).mean(0)
        self.net.eval()
        self.log("val_loss", nn.functional.mse_loss(pred, y.float()))

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.02, momentum=0.9)
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": "val_loss"}}


class Jitter(Callback):
    """Perturbs the weights at every epoch's start, as some regularisers do; the module does too."""

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        with torch.no_grad():
            for p in pl_module.parameters():
                p.mul_(1 + 0.01 * torch.randn_like(p))


class JitteredClassifier(Classifier):
    def on_train_epoch_start(self) -> None:
        with torch.no_grad():
            for p in self.parameters():
                p.add_(0.01 * torch.rand_like(p))


def _fit(module: LightningModule, data: LightningDataModule, callbacks: list[Callback], **options: Any) -> None:
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        **options,
    )
    trainer.fit(module, datamodule=data)


def mid_epoch_validation() -> dict[str, torch.Tensor]:
    """A third of an epoch between validations (3 per epoch), shuffled validation data, 4 epochs."""
    seed_everything(7)
    model = Classifier()
    _fit(model, BlobsData(shuffle_val=True), [], max_epochs=4, val_check_interval=1 / 3)
    return model.state_dict()


def plateau_and_early_stopping() -> dict[str, torch.Tensor]:
    """Validation every 4 batches across epochs, MC dropout, ReduceLROnPlateau, early stopping."""
    seed_everything(11)
    model = NoisyRegressor()
    stop = EarlyStopping(monitor="val_loss", patience=2, min_delta=0.01)
    _fit(model, BlobsData(batch_size=6), [stop], max_epochs=5, val_check_interval=4, check_val_every_n_epoch=None)
    return model.state_dict()


def callback_and_module_hooks() -> dict[str, torch.Tensor]:
    """A callback and the module both draw in ``on_train_epoch_start`` (their order shows), clipping,
    accumulation, validation every other epoch, a sanity check of 2 batches."""
    seed_everything(3)
    model = JitteredClassifier(lr=0.02)
    _fit(
        model,
        BlobsData(batch_size=4),
        [Jitter()],
        max_epochs=4,
        check_val_every_n_epoch=2,
        accumulate_grad_batches=2,
        gradient_clip_val=0.5,
        num_sanity_val_steps=2,
    )
    return model.state_dict()


PROGRAMS = {
    "mid_epoch_validation": mid_epoch_validation,
    "plateau_and_early_stopping": plateau_and_early_stopping,
    "callback_and_module_hooks": callback_and_module_hooks,
}
