"""Writes the Lightning 2.x checkpoints the tests load (run with a Python that has pytorch-lightning).

    /tmp/plvenv/bin/python tests/data/lightning/make_checkpoints.py

A tiny regression (``Linear(4, 2)``, SGD with a StepLR scheduler) trained by Lightning for two
epochs, then saved with ``trainer.save_checkpoint`` (``epoch2.ckpt``, and ``attributedict.ckpt`` with
a Lightning ``AttributeDict`` among the hyperparameters); training then goes on to
four epochs and the final weights are saved as a plain state dict (``epoch4_weights.pt``), which a
geartrain run resumed from ``epoch2.ckpt`` must reproduce. ``pickled_hparams.ckpt``: a module whose
hyperparameters hold an ``nn.Module`` (pickled, loadable only with ``weights_only=False``) and an
``AttributeDict``. Not part of geartrain: it documents how the files were made.
"""

from __future__ import annotations

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().parents[2] / "helpers" / "numerics.py"))["pin"]()  # before torch

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

HERE = Path(__file__).parent


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 2, generator=g))


class Regression(pl.LightningModule):
    def __init__(self, in_dim: int = 4, out_dim: int = 2, lr: float = 0.1, tags: tuple = ("a", 1)) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(in_dim, out_dim)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}


class WithObjects(pl.LightningModule):
    def __init__(self, loss: nn.Module | None = None, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(4, 2)


def pickled_hparams() -> None:
    from lightning_fabric.utilities.data import AttributeDict

    torch.manual_seed(0)
    model = WithObjects(loss=nn.SmoothL1Loss(beta=0.5), lr=0.2)
    model.hparams["cfg"] = AttributeDict(depth=2)
    kw = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer = pl.Trainer(max_epochs=1, **kw)
    trainer.strategy.connect(model)  # save without training: the weights are the seeded initial ones
    trainer.save_checkpoint(HERE / "pickled_hparams.ckpt")


def main() -> None:
    torch.manual_seed(0)
    model = Regression(in_dim=4, out_dim=2, lr=0.1)
    loader = DataLoader(data(), batch_size=4, shuffle=False)
    kw = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer = pl.Trainer(max_epochs=2, **kw)
    trainer.fit(model, loader)
    trainer.save_checkpoint(HERE / "epoch2.ckpt")
    # Lightning's own AttributeDict inside the hyperparameters: a class the loader must allow by name.
    from lightning_fabric.utilities.data import AttributeDict

    model.hparams["cfg"] = AttributeDict(depth=2)
    trainer.save_checkpoint(HERE / "attributedict.ckpt")
    del model.hparams["cfg"]
    resumed = pl.Trainer(max_epochs=4, **kw)
    resumed.fit(Regression(), DataLoader(data(), batch_size=4, shuffle=False), ckpt_path=HERE / "epoch2.ckpt")
    torch.save(resumed.lightning_module.state_dict(), HERE / "epoch4_weights.pt")
    pickled_hparams()


if __name__ == "__main__":
    main()
