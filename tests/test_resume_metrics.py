"""Everything a later decision reads is resumed (issue #18, items 2 and 3).

After a stop in the middle of an epoch, the epoch's values must be those of the uninterrupted run:
the mean of ``train/loss`` over the whole epoch (not only the batches after the resume) and a
torchmetrics object's result over the whole epoch, so a ``ReduceLROnPlateau`` on them steps
identically; and ``callback_metrics`` must hold the last validation's values, so a step-interval
plateau scheduler on ``val/loss`` keeps stepping on it as the uninterrupted run does. Each test
stops a run at many points (``tests/helpers/stop_resume.py``) and compares weights, optimizer state
and the learning rate bitwise with an uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback, ModelCheckpoint
from tests.helpers.stop_resume import KillAt, Killed, assert_same_state, attempts
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule
from trainer.checkpoint.files import load_checkpoint


class Net(TrainModule):
    """A regressor whose learning rate a plateau scheduler halves, on a metric chosen by ``monitor``."""

    def __init__(self, monitor: str, interval: str) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.monitor, self.interval = monitor, interval
        self.abs_error = torchmetrics.MeanMetric()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        out = self.net(x)
        loss = nn.functional.mse_loss(out, y)
        self.log("train/loss", loss, on_step=True, on_epoch=True)
        self.abs_error.update((out - y).abs().mean(dim=1))
        self.log("train/abs_error", self.abs_error, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=0.05)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0, threshold=0.05)
        config = {"scheduler": plateau, "interval": self.interval, "monitor": self.monitor, "strict": False}
        return {"optimizer": opt, "lr_scheduler": config}


def maker(monitor: str, interval: str) -> Any:
    def make() -> tuple[TrainModule, dict[str, Any]]:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(48, 4, generator=g)
        data = TensorDataset(x, x.sum(dim=1, keepdim=True).sin())
        return Net(monitor, interval), {
            "train_dataloaders": DataLoader(data, batch_size=6, shuffle=True),
            "val_dataloaders": DataLoader(TensorDataset(x[:12], x[:12].sum(dim=1, keepdim=True).sin()), batch_size=6),
        }

    return make


class EpochValues(Callback):
    """Records the epoch values callbacks see at each epoch's end, by epoch (a later attempt overwrites)."""

    def __init__(self, seen: dict[int, dict[str, float]]) -> None:
        self.seen = seen

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        m = trainer.callback_metrics
        self.seen[trainer.current_epoch] = {k: float(m[k]) for k in ("train/loss_epoch", "train/abs_error")}


EPOCH_MEAN: dict[str, Any] = {"max_epochs": 4, "limit_val_batches": 0}


@pytest.fixture(scope="module")
def whole_epoch_mean(tmp_path_factory: pytest.TempPathFactory) -> Any:
    seen: dict[int, dict[str, float]] = {}
    run = attempts(
        tmp_path_factory.mktemp("whole"),
        maker("train/loss_epoch", "epoch"),
        callbacks=lambda: [EpochValues(seen)],
        **EPOCH_MEAN,
    )
    return run, seen


@pytest.mark.parametrize("kills", [[3], [7], [12], [4, 11]], ids=str)
def test_a_plateau_scheduler_on_an_epoch_mean_steps_as_without_the_stop(
    tmp_path: Path, whole_epoch_mean: Any, kills: list[int]
) -> None:
    whole, whole_seen = whole_epoch_mean
    seen: dict[int, dict[str, float]] = {}
    resumed = attempts(
        tmp_path, maker("train/loss_epoch", "epoch"), kills, callbacks=lambda: [EpochValues(seen)], **EPOCH_MEAN
    )
    assert seen == whole_seen  # the epoch mean and the torchmetrics value over every batch of the epoch
    assert_same_state(resumed, whole)


def test_a_mid_epoch_checkpoint_holds_the_epoch_sums_counts_and_metric_states(tmp_path: Path) -> None:
    module, kwargs = maker("train/loss_epoch", "epoch")()
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=0, save_last=True)
    trainer = quiet_trainer(tmp_path, [KillAt(11), ckpt], enable_checkpointing=True, **EPOCH_MEAN)
    with pytest.raises(Killed):
        trainer.fit(module, **kwargs)
    state = load_checkpoint(tmp_path / "last.ckpt")  # after batch 10: 2 batches of 6 into epoch 1
    assert state["progress"]["epoch"] == 1 and state["progress"]["batch_in_epoch"] == 2
    entries = {e["name"]: e for e in state["metrics"]["train_epoch"]["store"]["entries"]}
    assert entries["train/loss"]["weight"] == 12
    assert entries["train/abs_error"]["metric_path"] == "abs_error"
    assert entries["train/abs_error"]["metric_state"]["update_count"] == 2
    assert "train/loss_epoch" in state["metrics"]["callback_metrics"]  # epoch 0's, as callbacks saw it


VAL_STEPS: dict[str, Any] = {"max_epochs": 2, "val_check_interval": 3, "num_sanity_val_steps": 0}


@pytest.fixture(scope="module")
def whole_val_steps(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return attempts(tmp_path_factory.mktemp("whole_val"), maker("val/loss", "step"), **VAL_STEPS)


@pytest.mark.parametrize("kills", [[5], [8], [11], [5, 4]], ids=str)
def test_a_step_plateau_scheduler_on_a_validation_metric_keeps_stepping_after_a_resume(
    tmp_path: Path, whole_val_steps: Any, kills: list[int]
) -> None:
    # Before the fix callback_metrics were empty after a resume: the scheduler (strict=False) skipped
    # every step until the next validation, where the uninterrupted run stepped on the last value.
    assert_same_state(attempts(tmp_path, maker("val/loss", "step"), kills, **VAL_STEPS), whole_val_steps)


def test_a_value_in_several_metric_dicts_is_saved_once_and_read_back_in_each(tmp_path: Path) -> None:
    """The loss sits in callback_metrics, logged_metrics and progress_bar_metrics: one tensor in the file."""
    from tests.helpers.regression import Regressor, make_loader

    class Logs(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            self.log("loss", loss, prog_bar=True)
            return loss

    trainer = quiet_trainer(tmp_path, max_epochs=1, log_every_n_steps=1)
    trainer.fit(Logs(), make_loader(8, 4))
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    saved = torch.load(tmp_path / "run.ckpt", weights_only=True)["metrics"]
    values = [saved[name]["loss"] for name in ("callback_metrics", "logged_metrics", "progress_bar_metrics")]
    assert values[0] is values[1] is values[2] and not values[0].requires_grad
    assert float(values[0]) == float(trainer.callback_metrics["loss"])
    restored = quiet_trainer(tmp_path, max_epochs=1)
    restored.metric_router.load_state_dict(saved)
    assert float(restored.callback_metrics["loss"]) == float(restored.logged_metrics["loss"]) == float(values[0])
