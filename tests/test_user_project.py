"""A user's own project under ``geartrain --config-dir`` trains to its end with the default callbacks.

The default callbacks monitor the default job's metrics (``val/acc`` for the best checkpoint,
``val/loss`` for early stopping). A module that logs only one of them must still train: the callback
whose metric is missing says so once, naming the override that sets it, and stands aside; and the
default task (fit, then test) fits only when the module has no test set. Run as a user runs it (the
command in a subprocess, default task and callbacks), on one process and on two DDP processes.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from tests.helpers.cli import run_dirs, run_geartrain

NET = '''
import torch
from torch.utils.data import DataLoader, TensorDataset
from trainer import DataModule, TrainModule


class Blobs(DataModule):
    """Two classes of points around (-1, -1) and (1, 1); 64 to train on, 32 to validate on."""

    def setup(self, stage):
        g = torch.Generator().manual_seed(0)
        y = torch.arange(96) % 2
        x = (2.0 * y - 1.0).unsqueeze(1) + 0.5 * torch.randn(96, 2, generator=g)
        self.train_set, self.val_set = TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=16, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=16)


class _Net(TrainModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class LossOnly(_Net):
    """Logs train/loss and val/loss: the best-checkpoint monitor (val/acc) is missing."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.layer(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", torch.nn.functional.cross_entropy(self.layer(x), y), sync_dist=True)


class AccOnly(_Net):
    """Logs val/acc only: the early-stopping monitor (val/loss) is missing."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/acc", (self.layer(x).argmax(1) == y).float().mean(), sync_dist=True)
'''

EPOCHS = 3
CASES = {
    # module: (the message it must give once, the override it must name, whether a best file is kept)
    "LossOnly": ("ModelCheckpoint(monitor='val/acc')", "callbacks.model_checkpoint.monitor=val/loss", False),
    "AccOnly": ("EarlyStopping(monitor='val/loss')", "callbacks.early_stopping.monitor=val/acc", True),
}


def make_project(root: Path, module: str) -> Path:
    (root / "my_project").mkdir()
    (root / "my_project" / "__init__.py").write_text("")
    (root / "my_project" / "net.py").write_text(textwrap.dedent(NET))
    conf = root / "my_conf"
    (conf / "model").mkdir(parents=True)
    (conf / "data").mkdir()
    (conf / "model" / "mine.yaml").write_text(f"_target_: my_project.net.{module}\n")
    (conf / "data" / "mine.yaml").write_text("_target_: my_project.net.Blobs\n")
    return conf


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("processes", [1, 2], ids=["single", "ddp"])
@pytest.mark.parametrize("module", sorted(CASES))
def test_a_project_logging_other_metrics_trains_to_its_end(tmp_path: Path, module: str, processes: int) -> None:
    conf = make_project(tmp_path, module)
    strategy = ["strategy=ddp", "trainer.devices=2"] if processes == 2 else []
    result = run_geartrain(
        "--config-dir", str(conf), "model=mine", "data=mine", f"trainer.max_epochs={EPOCHS}", *strategy,
        cwd=tmp_path,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "Traceback" not in output

    said, override, keeps_best = CASES[module]
    assert output.count(said) == 1, output[-3000:]  # once, by rank 0 only, at the first validation
    assert override in output
    assert "so it was fit only" in output  # the default task, fit_test, without a test set
    (run,) = run_dirs(tmp_path)
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["progress"]["global_step"] == EPOCHS * 4 // processes  # every step of every epoch ran
    best = [p.name for p in (run / "checkpoints").glob("epoch=*.ckpt")]
    assert bool(best) == keeps_best, best
