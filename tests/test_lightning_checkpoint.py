"""Checkpoints written by Lightning 2.x load into geartrain modules and resume training (issue #13).

The files under ``tests/data/lightning`` were written by pytorch-lightning 2.6 with
``tests/data/lightning/make_checkpoints.py`` (a ``Linear(4, 2)`` regression with SGD and StepLR).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule
from trainer.common.errors import CheckpointError

DATA = Path(__file__).parent / "data" / "lightning"


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 2, generator=g))


class Regression(TrainModule):
    """The geartrain twin of make_checkpoints.py's LightningModule (same names, same hyperparameters)."""

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


def test_load_from_checkpoint_reads_a_lightning_file() -> None:
    lightning = torch.load(DATA / "epoch2.ckpt", weights_only=True)
    model = Regression.load_from_checkpoint(DATA / "epoch2.ckpt")
    assert dict(model.hparams) == {"in_dim": 4, "out_dim": 2, "lr": 0.1, "tags": ("a", 1)}
    for name, value in model.state_dict().items():
        assert torch.equal(value, lightning["state_dict"][name])


def test_load_from_checkpoint_kwargs_override_lightning_hparams() -> None:
    model = Regression.load_from_checkpoint(DATA / "epoch2.ckpt", lr=0.5)
    assert model.hparams.lr == 0.5


def test_lightning_attributedict_loads_with_weights_only() -> None:
    with pytest.raises(Exception, match="Weights only load failed"):  # plain weights_only refuses the class ...
        torch.load(DATA / "attributedict.ckpt", weights_only=True)
    model = Regression.load_from_checkpoint(DATA / "attributedict.ckpt")  # ... ours allows it by name
    assert model.hparams.lr == 0.1
    from trainer.checkpoint.reader import read_checkpoint

    assert read_checkpoint(DATA / "attributedict.ckpt")["hyper_parameters"]["cfg"] == {"depth": 2}


class WithObjects(TrainModule):
    """The twin of make_checkpoints.py's ``WithObjects``: a hyperparameter that is an ``nn.Module``."""

    def __init__(self, loss: nn.Module | None = None, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(4, 2)


def test_pickled_hyperparameters_load_with_weights_only_false_as_in_lightning() -> None:
    path = DATA / "pickled_hparams.ckpt"  # also holds Lightning's AttributeDict, read without Lightning
    for safe in (None, True):  # the default stays safe, and the refusal says what Lightning users pass
        with pytest.raises(CheckpointError, match=r"SmoothL1Loss.*load_from_checkpoint\(path, weights_only=False\)"):
            WithObjects.load_from_checkpoint(path, weights_only=safe)
    model = WithObjects.load_from_checkpoint(path, weights_only=False)
    assert isinstance(model.hparams.loss, nn.SmoothL1Loss) and model.hparams.loss.beta == 0.5
    assert model.hparams.lr == 0.2
    torch.manual_seed(0)  # make_checkpoints.py saved the seeded initial weights
    for name, value in nn.Linear(4, 2).state_dict().items():
        assert torch.equal(model.state_dict()[f"layer.{name}"], value)
    # Plain data loads with weights_only=False too, as before.
    assert Regression.load_from_checkpoint(DATA / "epoch2.ckpt", weights_only=False).hparams.lr == 0.1


def test_fit_resumes_a_lightning_checkpoint_exactly(tmp_path: Path) -> None:
    """Lightning trained 2 epochs, saved, resumed to 4: geartrain resuming the same file reaches its weights bitwise."""
    expected = torch.load(DATA / "epoch4_weights.pt", weights_only=True)
    model = Regression()
    trainer = quiet_trainer(tmp_path, max_epochs=4)
    trainer.fit(model, DataLoader(data(), batch_size=4, shuffle=False), ckpt_path=DATA / "epoch2.ckpt")
    assert trainer.global_step == 16
    assert trainer.lr_scheduler_configs[0].scheduler.get_last_lr() == [0.1 * 0.5**4]
    for name, value in model.state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_resume_refuses_a_lightning_file_with_other_schedulers(tmp_path: Path) -> None:
    class NoScheduler(Regression):
        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = quiet_trainer(tmp_path, max_epochs=3)
    with pytest.raises(CheckpointError, match="scheduler state"):
        trainer.fit(NoScheduler(), DataLoader(data(), batch_size=4), ckpt_path=DATA / "epoch2.ckpt")


def test_lightning_loop_state_maps_to_geartrain_progress() -> None:
    """An epoch-end file resumes at the next epoch; a mid-epoch file resumes after its last batch."""
    from trainer.checkpoint.format import lightning_resume_state

    def state(epochs_done: int, batches: int, last: bool) -> dict[str, Any]:
        loops = {
            "fit_loop": {
                "epoch_progress": {"current": {"completed": epochs_done}},
                "epoch_loop.batch_progress": {"current": {"completed": batches}, "is_last_batch": last},
            }
        }
        return {
            "state_dict": {},
            "global_step": 11,
            "epoch": epochs_done,
            "loops": loops,
            "pytorch-lightning_version": "2.6.6",
        }

    assert lightning_resume_state(state(2, 4, True))["progress"] == {
        "epoch": 1,
        "global_step": 11,
        "batch_in_epoch": 4,
        "epoch_finished": True,
    }
    assert lightning_resume_state(state(2, 3, False))["progress"] == {
        "epoch": 2,
        "global_step": 11,
        "batch_in_epoch": 3,
    }
