"""Writes the geartrain checkpoints that Lightning (and later geartrain versions) must read.

    .venv/bin/python tests/data/geartrain/make_checkpoints.py

The twin of ``tests/data/lightning/make_checkpoints.py``, the other way round: the same tiny
regression (``Linear(4, 2)``, SGD with momentum and a StepLR scheduler, 16 samples in batches of
4), trained by geartrain, files named after this geartrain's checkpoint format version ``N``:

- ``vN_epoch2.ckpt``: ``trainer.save_checkpoint`` after two epochs;
- ``vN_step6.ckpt``: ``ModelCheckpoint(every_n_train_steps=6)``'s file, in the middle of epoch 1;
- ``vN_epoch4_weights.pt``: the weights after four uninterrupted epochs (a plain state dict).

``v1_*`` were written by format version 1 (before Lightning's keys): they prove that geartrain
keeps reading its older files. ``tests/data/check_lightning_reads_ours.py`` loads the newest ones
with Lightning. Not part of geartrain: it documents how the files were made.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

runpy.run_path(str(Path(__file__).resolve().parents[2] / "helpers" / "numerics.py"))["pin"]()  # before torch

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import ModelCheckpoint
from strategies import SingleDeviceStrategy
from trainer import Trainer, TrainModule
from trainer.checkpoint.files import FORMAT_VERSION

HERE = Path(__file__).parent


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 2, generator=g))


class Regression(TrainModule):
    def __init__(self, in_dim: int = 4, out_dim: int = 2, lr: float = 0.1, tags: tuple[Any, ...] = ("a", 1)) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(in_dim, out_dim)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}


def trainer(root: Path, **kwargs: Any) -> Trainer:
    options: dict[str, Any] = dict(
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
    )
    options.update(kwargs)
    return Trainer(default_root_dir=root, strategy=SingleDeviceStrategy(device="cpu"), **options)


def main(out: Path = HERE) -> None:
    import tempfile

    v = f"v{FORMAT_VERSION}"
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        t = trainer(Path(tmp) / "a", max_epochs=2)
        t.fit(Regression(), DataLoader(data(), batch_size=4, shuffle=False))
        t.save_checkpoint(out / f"{v}_epoch2.ckpt")

        torch.manual_seed(0)
        steps = ModelCheckpoint(dirpath=Path(tmp) / "steps", filename="step6", every_n_train_steps=6, save_top_k=-1)
        trainer(Path(tmp) / "b", max_steps=6, callbacks=[steps], enable_checkpointing=True).fit(
            Regression(), DataLoader(data(), batch_size=4, shuffle=False)
        )
        (out / f"{v}_step6.ckpt").write_bytes((Path(tmp) / "steps" / "step6.ckpt").read_bytes())

        torch.manual_seed(0)
        model = Regression()
        trainer(Path(tmp) / "c", max_epochs=4).fit(model, DataLoader(data(), batch_size=4, shuffle=False))
        torch.save(model.state_dict(), out / f"{v}_epoch4_weights.pt")


if __name__ == "__main__":
    main()
