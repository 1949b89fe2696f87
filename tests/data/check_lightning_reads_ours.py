"""Lightning reads geartrain's checkpoints: run with a Python that has pytorch-lightning 2.x.

    python -m venv /tmp/pl && /tmp/pl/bin/pip install pytorch-lightning
    /tmp/pl/bin/python tests/data/check_lightning_reads_ours.py

Lightning is not a dependency of geartrain, so this script is run by hand (the test suite checks the
same layout without Lightning: ``tests/test_checkpoint_lightning_keys.py``). It needs no geartrain:
it loads the files ``tests/data/geartrain/make_checkpoints.py`` wrote (the newest format version
there) into the Lightning twin of that script's module, and checks that

1. ``LightningModule.load_from_checkpoint`` builds the module from the file's hyperparameters and
   loads its weights;
2. ``Trainer.fit(ckpt_path=<after 2 epochs>)`` resumes at epoch 2, step 8, with the optimizer's
   momentum and the scheduler's learning rate restored, and trains on to geartrain's own weights
   after 4 epochs, bit for bit;
3. ``Trainer.fit(ckpt_path=<after 6 steps>)`` resumes in the middle of epoch 1 at step 6;
4. Lightning's ``ModelCheckpoint`` finds its state under its own ``state_key``;
5. a tool reading ``ckpt["epoch"]``, ``ckpt["global_step"]``, ``ckpt["hyper_parameters"]`` finds them.

Prints one line per check and exits with status 1 if any fails.
"""

from __future__ import annotations

import re
import runpy
import sys
import tempfile
from pathlib import Path
from typing import Any

runpy.run_path(str(Path(__file__).resolve().parents[1] / "helpers" / "numerics.py"))["pin"]()  # before torch

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

HERE = Path(__file__).parent / "geartrain"


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 2, generator=g))


class Regression(pl.LightningModule):
    def __init__(self, in_dim: int = 4, out_dim: int = 2, lr: float = 0.1, tags: tuple = ("a", 1)) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(in_dim, out_dim)
        self.seen: list[tuple[int, int, int]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append((self.current_epoch, batch_idx, self.global_step))
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}


class Restored(pl.Callback):
    """What Lightning restored, read at the start of the resumed fit."""

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        opt = trainer.optimizers[0]
        self.epoch, self.step = trainer.current_epoch, trainer.global_step
        self.lr = opt.param_groups[0]["lr"]
        buffers = [opt.state[p].get("momentum_buffer") for p in module.parameters()]
        self.momentum = [None if b is None else b.clone() for b in buffers]  # training updates them in place


def trainer(root: str, **kwargs: Any) -> pl.Trainer:
    options = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    options.update(kwargs)
    return pl.Trainer(default_root_dir=root, accelerator="cpu", devices=1, **options)


def newest(pattern: str) -> Path:
    files = sorted(HERE.glob(pattern), key=lambda p: int(re.match(r"v(\d+)_", p.name).group(1)))  # type: ignore[union-attr]
    return files[-1]


def main() -> int:
    failures = 0

    def check(name: str, ok: bool, detail: str = "") -> None:
        nonlocal failures
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}")

    epoch2, step6 = newest("v*_epoch2.ckpt"), newest("v*_step6.ckpt")
    version = epoch2.name.split("_")[0]
    expected = torch.load(HERE / f"{version}_epoch4_weights.pt", weights_only=True)
    print(f"pytorch-lightning {pl.__version__}, geartrain files {version}")

    raw = torch.load(epoch2, weights_only=True)
    check("ckpt['epoch'], ['global_step'] after 2 epochs", (raw["epoch"], raw["global_step"]) == (2, 8))
    check(
        "ckpt['hyper_parameters']", raw["hyper_parameters"] == {"in_dim": 4, "out_dim": 2, "lr": 0.1, "tags": ("a", 1)}
    )

    model = Regression.load_from_checkpoint(epoch2)
    same = all(torch.equal(v, raw["state_dict"][k]) for k, v in model.state_dict().items())
    check("load_from_checkpoint: hyperparameters", dict(model.hparams) == raw["hyper_parameters"])
    check("load_from_checkpoint: weights", same)

    with tempfile.TemporaryDirectory() as tmp:
        restored = Restored()
        model = Regression()
        t = trainer(tmp, max_epochs=4, callbacks=[restored])
        t.fit(model, DataLoader(data(), batch_size=4, shuffle=False), ckpt_path=epoch2)
        momentum_ok = all(
            m is not None and torch.equal(m, raw["optimizer_states"][0]["state"][i]["momentum_buffer"])
            for i, m in enumerate(restored.momentum)
        )
        check(
            "fit(ckpt_path): resumes at epoch 2, step 8",
            (restored.epoch, restored.step) == (2, 8),
            f"{restored.epoch}, {restored.step}",
        )
        check("fit(ckpt_path): optimizer momentum restored", momentum_ok)
        check("fit(ckpt_path): scheduler restored", restored.lr == 0.1 * 0.5**2, str(restored.lr))
        check("fit(ckpt_path): ends at epoch 4, step 16", (t.current_epoch, t.global_step) == (4, 16))
        diff = max(float((v - expected[k]).abs().max()) for k, v in model.state_dict().items())
        check("fit(ckpt_path): geartrain's weights after 4 epochs, bitwise", diff == 0.0, f"max |diff| {diff}")

        raw6 = torch.load(step6, weights_only=True)
        restored = Restored()
        model = Regression()
        # A ModelCheckpoint like the one that wrote the file finds its state by Lightning's state_key.
        saver = pl.callbacks.ModelCheckpoint(dirpath=tmp, every_n_train_steps=6, save_top_k=-1)
        t = trainer(tmp, max_epochs=2, callbacks=[restored, saver], enable_checkpointing=True)
        t.fit(model, DataLoader(data(), batch_size=4, shuffle=False), ckpt_path=step6)
        (saved_state,) = raw6["callbacks"].values()
        check("mid-epoch file: ModelCheckpoint state found by state_key", saver.state_key in raw6["callbacks"])
        check(
            "mid-epoch file: ModelCheckpoint restored best_model_path",
            saver.best_model_path == saved_state["best_model_path"],
            saver.best_model_path,
        )
        check("mid-epoch file: ckpt['epoch'], ['global_step']", (raw6["epoch"], raw6["global_step"]) == (1, 6))
        check(
            "mid-epoch file: resumes in epoch 1 at step 6",
            (restored.epoch, restored.step) == (1, 6) and model.seen[0] == (1, 2, 6),
            f"{restored.epoch}, {restored.step}, first batch {model.seen[:1]}",
        )
        check("mid-epoch file: ends at epoch 2, step 8", (t.current_epoch, t.global_step) == (2, 8))

    print("all checks passed" if not failures else f"{failures} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
