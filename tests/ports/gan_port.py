"""Lightning's basic GAN example, ported: manual optimisation with two optimizers, toggle_optimizer,
images logged through ``self.loggers[0].experiment``; trained on the 8x8 digits.

Written as Lightning code; only the import block below differs from a Lightning 2.x project.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# --- imports: the only lines that differ from the Lightning project ---
from callbacks import TensorBoardLogger
from trainer import DataModule as LightningDataModule
from trainer import Trainer, seed_everything
from trainer import TrainModule as LightningModule

# --- end of imports ---

DIGITS = Path(__file__).resolve().parents[2] / "examples" / "data" / "digits.npz"
IMG_SHAPE = (1, 8, 8)


def make_grid(images: torch.Tensor, nrow: int = 4) -> torch.Tensor:
    """(N, C, H, W) images tiled into one (C, rows*H, nrow*W) image, as torchvision's make_grid does."""
    n, c, h, w = images.shape
    rows = (n + nrow - 1) // nrow
    grid = images.new_zeros(c, rows * h, nrow * w)
    for i in range(n):
        r, col = divmod(i, nrow)
        grid[:, r * h : (r + 1) * h, col * w : (col + 1) * w] = images[i]
    return grid


class DigitsImages(LightningDataModule):
    def __init__(self, batch_size: int = 64) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        with np.load(DIGITS) as data:
            images = torch.from_numpy(data["images"][:512]).float().div(8.0).sub(1.0).view(-1, *IMG_SHAPE)
            labels = torch.from_numpy(data["labels"][:512]).long()
        self.dataset = TensorDataset(images, labels)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.dataset, batch_size=self.batch_size, shuffle=False)

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.dataset, batch_size=self.batch_size, shuffle=False)


class Generator(nn.Module):
    def __init__(self, latent_dim: int, img_shape: tuple[int, int, int]) -> None:
        super().__init__()
        self.img_shape = img_shape

        def block(in_feat: int, out_feat: int, normalize: bool = True) -> list[nn.Module]:
            layers: list[nn.Module] = [nn.Linear(in_feat, out_feat)]
            if normalize:
                layers.append(nn.BatchNorm1d(out_feat, 0.8))
            layers.append(nn.LeakyReLU(0.2, inplace=True))
            return layers

        self.model = nn.Sequential(
            *block(latent_dim, 32, normalize=False),
            *block(32, 64),
            nn.Linear(64, int(np.prod(img_shape))),
            nn.Tanh(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        img = self.model(z)
        return img.view(img.size(0), *self.img_shape)


class Discriminator(nn.Module):
    def __init__(self, img_shape: tuple[int, int, int]) -> None:
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(int(np.prod(img_shape)), 64),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(64, 32),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(32, 1),
            nn.Sigmoid(),
        )

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return self.model(img.view(img.size(0), -1))


class GAN(LightningModule):
    def __init__(
        self,
        channels: int = 1,
        width: int = 8,
        height: int = 8,
        latent_dim: int = 16,
        lr: float = 0.0002,
        b1: float = 0.5,
        b2: float = 0.999,
        batch_size: int = 64,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        data_shape = (channels, width, height)
        self.generator = Generator(latent_dim=self.hparams.latent_dim, img_shape=data_shape)
        self.discriminator = Discriminator(img_shape=data_shape)
        self.validation_z = torch.randn(8, self.hparams.latent_dim)
        self.example_input_array = torch.zeros(2, self.hparams.latent_dim)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.generator(z)

    def adversarial_loss(self, y_hat: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy(y_hat, y)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        imgs, _ = batch
        optimizer_g, optimizer_d = self.optimizers()

        z = torch.randn(imgs.shape[0], self.hparams.latent_dim)
        z = z.type_as(imgs)

        # train generator
        self.toggle_optimizer(optimizer_g)
        self.generated_imgs = self(z)
        sample_imgs = self.generated_imgs[:6]
        grid = make_grid(sample_imgs)
        self.loggers[0].experiment.add_image("train/generated_images", grid, self.current_epoch)
        valid = torch.ones(imgs.size(0), 1)
        valid = valid.type_as(imgs)
        g_loss = self.adversarial_loss(self.discriminator(self(z)), valid)
        self.log("g_loss", g_loss, prog_bar=True)
        self.manual_backward(g_loss)
        optimizer_g.step()
        optimizer_g.zero_grad()
        self.untoggle_optimizer(optimizer_g)

        # train discriminator
        self.toggle_optimizer(optimizer_d)
        valid = torch.ones(imgs.size(0), 1)
        valid = valid.type_as(imgs)
        real_loss = self.adversarial_loss(self.discriminator(imgs), valid)
        fake = torch.zeros(imgs.size(0), 1)
        fake = fake.type_as(imgs)
        fake_loss = self.adversarial_loss(self.discriminator(self(z).detach()), fake)
        d_loss = (real_loss + fake_loss) / 2
        self.log("d_loss", d_loss, prog_bar=True)
        self.manual_backward(d_loss)
        optimizer_d.step()
        optimizer_d.zero_grad()
        self.untoggle_optimizer(optimizer_d)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> tuple[list[torch.optim.Optimizer], list[Any]]:
        lr = self.hparams.lr
        b1 = self.hparams.b1
        b2 = self.hparams.b2
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=(b1, b2))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(b1, b2))
        return [opt_g, opt_d], []

    def on_validation_epoch_end(self) -> None:
        z = self.validation_z.type_as(self.generator.model[0].weight)
        sample_imgs = self(z)
        grid = make_grid(sample_imgs)
        for logger in self.loggers:
            logger.experiment.add_image("validation/generated_images", grid, self.current_epoch)


def train(root: str, strategy: str = "auto", devices: int = 1) -> tuple[GAN, dict[str, Any]]:
    """Train as Lightning's example does; return the module and what a test checks."""
    seed_everything(7)
    dm = DigitsImages(batch_size=64)
    model = GAN()
    logger = TensorBoardLogger(save_dir=root, name="gan")
    trainer = Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        max_epochs=2,
        logger=logger,
        enable_progress_bar=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, dm)
    return model, {
        "global_step": trainer.global_step,
        "current_epoch": trainer.current_epoch,
        "log_dir": str(trainer.logger.log_dir),
        "g_loss": float(trainer.callback_metrics["g_loss"]),
        "d_loss": float(trainer.callback_metrics["d_loss"]),
        "hparams": dict(model.hparams),
    }
