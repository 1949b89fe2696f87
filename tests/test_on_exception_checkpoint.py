"""``OnExceptionCheckpoint``: a run that raises leaves a checkpoint to resume from; one that ends well leaves none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import OnExceptionCheckpoint
from strategies import DDPStrategy
from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule


class Crash(RuntimeError):
    pass


class FailsAtStep(TrainModule):
    """Raises in ``training_step`` at ``fail_at`` (on ``rank`` only; None: every rank)."""

    def __init__(self, fail_at: int | None, rank: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.fail_at, self.rank = fail_at, rank

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == self.fail_at and self.rank in (None, self.trainer.global_rank):
            raise Crash(f"step {self.global_step}")
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self) -> DataLoader[Any]:
        x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def test_a_raising_fit_saves_a_full_checkpoint_that_resumes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = FailsAtStep(fail_at=3)
    callback = OnExceptionCheckpoint(tmp_path / "ckpts")
    with pytest.raises(Crash):
        quiet_trainer(tmp_path, callbacks=[callback], max_steps=6).fit(module)
    state = torch.load(callback.ckpt_path, weights_only=True)
    assert state["progress"]["global_step"] == 3 and state["optimizer_states"]
    assert all(torch.equal(state["state_dict"][k], v) for k, v in module.state_dict().items())
    # Resuming from it equals a run that never raised.
    torch.manual_seed(0)
    reference = FailsAtStep(fail_at=None)
    quiet_trainer(tmp_path / "ref", max_steps=6).fit(reference)
    resumed = FailsAtStep(fail_at=None)
    quiet_trainer(tmp_path / "res", max_steps=6).fit(resumed, ckpt_path=callback.ckpt_path)
    assert all(torch.equal(a, b) for a, b in zip(resumed.parameters(), reference.parameters(), strict=True))


def test_a_run_that_ends_well_removes_an_older_exception_checkpoint(tmp_path: Path) -> None:
    callback = OnExceptionCheckpoint(tmp_path, filename="crash")
    Path(callback.ckpt_path).write_bytes(b"stale")
    quiet_trainer(tmp_path, callbacks=[callback], max_steps=2).fit(FailsAtStep(fail_at=None))
    assert not Path(callback.ckpt_path).exists()
    with pytest.raises(ValueError, match="filename cannot be empty"):
        OnExceptionCheckpoint(tmp_path, filename="")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_under_ddp_the_rank_that_raised_saves_without_waiting_for_the_others(tmp_path: Path) -> None:
    torch.manual_seed(0)
    callback = OnExceptionCheckpoint(tmp_path / "ckpts")
    trainer = quiet_trainer(
        tmp_path,
        callbacks=[callback],
        max_steps=4,
        strategy=DDPStrategy(devices=2, device="cpu", timeout=120, start_method="spawn"),
    )
    with pytest.raises(Exception, match="Crash"):
        trainer.fit(FailsAtStep(fail_at=2, rank=1))
    state = torch.load(callback.ckpt_path, weights_only=True)
    assert state["progress"]["global_step"] == 2  # the steps both ranks took before rank 1 raised
    torch.manual_seed(0)
    two_steps = FailsAtStep(fail_at=None)
    quiet_trainer(
        tmp_path / "ref", max_steps=2, strategy=DDPStrategy(devices=2, device="cpu", start_method="spawn")
    ).fit(two_steps)
    assert all(torch.equal(state["state_dict"][k], v) for k, v in two_steps.state_dict().items())


def test_inside_an_accumulation_window_the_users_exception_comes_through_and_the_file_resumes_exactly(
    tmp_path: Path,
) -> None:
    """The window's gradients cannot be saved: the file holds the state at the window's first batch, with a
    warning, and resumes as a run that never raised; the exception the user's code raised is the one the
    caller sees (not a refusal to save inside the window)."""

    class FailsAtBatch(FailsAtStep):
        def __init__(self, fail: bool) -> None:
            super().__init__(fail_at=None)
            self.fail = fail

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.fail and batch_idx == 4:  # the second batch of the second window of three
                raise Crash(f"batch {batch_idx}")
            return super().training_step(batch, batch_idx)

    torch.manual_seed(0)
    module = FailsAtBatch(fail=True)
    callback = OnExceptionCheckpoint(tmp_path / "ckpts")
    trainer = quiet_trainer(tmp_path, callbacks=[callback], max_steps=6, accumulate_grad_batches=3)
    with pytest.raises(Crash), pytest.warns(UserWarning, match="inside an accumulation window.*first batch \\(3\\)"):
        trainer.fit(module)
    state = torch.load(callback.ckpt_path, weights_only=True)
    assert state["progress"]["global_step"] == 1 and state["progress"]["batch_in_epoch"] == 3
    torch.manual_seed(0)
    reference = FailsAtBatch(fail=False)
    quiet_trainer(tmp_path / "ref", max_steps=6, accumulate_grad_batches=3).fit(reference)
    resumed = FailsAtBatch(fail=False)
    quiet_trainer(tmp_path / "res", max_steps=6, accumulate_grad_batches=3).fit(resumed, ckpt_path=callback.ckpt_path)
    assert all(torch.equal(a, b) for a, b in zip(resumed.parameters(), reference.parameters(), strict=True))
