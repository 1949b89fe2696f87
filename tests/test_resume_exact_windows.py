"""No checkpoint inside an accumulation window (issue #18, item 1), and the schedule's state resumed.

A checkpoint written between a window's first backward and its optimizer step would lose the
window's gradients on resume. ``ModelCheckpoint`` saves only at a window's end, ``save_checkpoint``
refuses inside one, and the step of the last save is restored, so a resumed run does not save again
at once. Every test stops a run (in-process, see ``tests/helpers/stop_resume.py``) at many points and
compares the resumed run's weights and optimizer state bitwise with an uninterrupted run.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback, ModelCheckpoint
from tests.helpers.stop_resume import assert_same_state, attempts
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule, seed_everything
from trainer.checkpoint.files import load_checkpoint

K = 3  # accumulate_grad_batches; 6 batches an epoch: 2 optimizer steps


class Reg(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def make() -> tuple[TrainModule, dict[str, Any]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 4, generator=g)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    return Reg(), {"train_dataloaders": DataLoader(data, batch_size=4, shuffle=True)}


OPTIONS: dict[str, Any] = {"max_epochs": 2, "accumulate_grad_batches": K}


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrainModule, Trainer]:
    return attempts(tmp_path_factory.mktemp("whole"), make, **OPTIONS)


@pytest.mark.parametrize("at", [2, 3, 4, 5, 8, 9, 11])
def test_stop_inside_a_window_then_resume_is_exact(tmp_path: Path, whole: Any, at: int) -> None:
    # Batch 2 starts right after the first backward: before the fix, last.ckpt was written there
    # (global step 0, one batch in) and the resume dropped that batch's gradient.
    assert_same_state(attempts(tmp_path, make, kills=[at], **OPTIONS), whole)


def test_stopped_twice_then_resumed_is_exact(tmp_path: Path, whole: Any) -> None:
    # Each resumed attempt used to save again at once, inside its first window, and lose a batch more.
    assert_same_state(attempts(tmp_path, make, kills=[5, 2, 3], **OPTIONS), whole)


def test_checkpoints_are_written_at_window_ends_only(tmp_path: Path) -> None:
    saved: list[tuple[int, int]] = []

    class Record(Callback):
        def on_save_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
            p = checkpoint["progress"]
            saved.append((p["global_step"], p["batch_in_epoch"]))

    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, filename="{step}")
    module, kwargs = make()
    quiet_trainer(tmp_path, [Record(), ckpt], enable_checkpointing=True, **OPTIONS).fit(module, **kwargs)
    assert saved == [(1, 3), (2, 6), (3, 3), (4, 6)]  # (global step, batch in epoch): window ends only
    assert sorted(p.name for p in tmp_path.glob("step=*.ckpt")) == [f"step={s}.ckpt" for s in (1, 2, 3, 4)]


def test_a_time_interval_that_comes_due_inside_a_window_saves_at_its_end(tmp_path: Path) -> None:
    clock = [0.0]
    ckpt = ModelCheckpoint(dirpath=tmp_path, train_time_interval=timedelta(seconds=1), save_top_k=-1, filename="{step}")
    ckpt._clock = lambda: clock[0]

    class Tick(Callback):
        def on_train_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int) -> None:
            clock[0] += 0.6  # due after the second batch, inside the first window

    steps: list[int] = []

    class Record(Callback):
        def on_save_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
            steps.append(checkpoint["progress"]["batch_in_epoch"] % K)

    module, kwargs = make()
    quiet_trainer(
        tmp_path, [Tick(), Record(), ckpt], enable_checkpointing=True, max_epochs=1, accumulate_grad_batches=K
    ).fit(module, **kwargs)
    assert steps and all(s == 0 for s in steps)  # every save at a window's end
    assert (tmp_path / "step=1.ckpt").exists()


def test_save_checkpoint_inside_a_window_is_refused(tmp_path: Path) -> None:
    class SaveMidWindow(Callback):
        def on_before_backward(self, trainer: Trainer, pl_module: TrainModule, loss: torch.Tensor) -> None:
            if trainer.checkpointing.in_accumulation_window:
                trainer.save_checkpoint(tmp_path / "mid.ckpt")

    module, kwargs = make()
    with pytest.raises(RuntimeError, match=r"inside an accumulation window.*accumulate_grad_batches=3"):
        quiet_trainer(tmp_path, [SaveMidWindow()], **OPTIONS).fit(module, **kwargs)
    assert not (tmp_path / "mid.ckpt").exists()


def test_save_checkpoint_at_a_window_end_and_weights_only_inside_one_are_allowed(tmp_path: Path) -> None:
    class Save(Callback):
        def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, *args: Any) -> None:
            if trainer.checkpointing.in_accumulation_window:
                trainer.save_checkpoint(tmp_path / "weights.ckpt", weights_only=True)
            else:
                trainer.save_checkpoint(tmp_path / "full.ckpt")

    module, kwargs = make()
    quiet_trainer(tmp_path, [Save()], **OPTIONS).fit(module, **kwargs)
    assert load_checkpoint(tmp_path / "full.ckpt")["progress"]["batch_in_epoch"] % K == 0
    assert "optimizer_states" not in load_checkpoint(tmp_path / "weights.ckpt")


def test_the_last_saved_step_is_restored(tmp_path: Path) -> None:
    attempts(tmp_path, make, kills=[5], **OPTIONS)  # stopped after step 1; finished from there
    state = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    (cb_state,) = (v for k, v in state["callbacks"].items() if k.startswith("ModelCheckpoint"))
    assert cb_state["last_saved_step"] == 4


@pytest.mark.parametrize("where", ["training_step", "optimizer_step"])
def test_save_on_exception_inside_a_window_resumes_the_window_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], whole: Any, where: str
) -> None:
    """As Lightning, an exception is saved, also one raised in the optimizer step; the file resumes exactly.

    The window's gradients are not in a checkpoint: the save drops them and rewinds to the window's
    first batch, so the resume trains the whole window again from the same weights.
    """

    class FailsOnce(Reg):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if where == "training_step" and batch_idx == 4:  # the second window has one backward done
                raise ValueError("boom")
            return super().training_step(batch, batch_idx)

        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
            if where == "optimizer_step" and batch_idx == 5:  # the second window's backward is all done
                optimizer_closure()
                raise ValueError("boom")
            super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)

    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_on_exception=True)  # saves at epochs' ends
    seed_everything(7)  # as attempts() does for the uninterrupted run
    failing, kwargs = make()
    failing.__class__ = FailsOnce  # the same object make() built: no other random numbers drawn
    with pytest.raises(ValueError, match="boom"):
        quiet_trainer(tmp_path, [ckpt], enable_checkpointing=True, **OPTIONS).fit(failing, **kwargs)
    assert "inside an accumulation window; its gradients are dropped" in capsys.readouterr().out
    saved = load_checkpoint(tmp_path / "epoch=0-step=1.ckpt")
    assert (saved["progress"]["global_step"], saved["progress"]["batch_in_epoch"]) == (1, K)

    seed_everything(7)
    resumed, kwargs = make()
    trainer = quiet_trainer(tmp_path / "resumed", **OPTIONS)
    trainer.fit(resumed, **kwargs, ckpt_path=tmp_path / "epoch=0-step=1.ckpt")
    assert_same_state((resumed, trainer), whole)
