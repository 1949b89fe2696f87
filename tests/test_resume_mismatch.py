"""Resuming from a checkpoint that does not fit the run: one message before anything is loaded.

Another optimizer or scheduler than the checkpoint's, a missing entry, a file that is not readable:
each is one ``CheckpointError`` naming the file and what differs, not an error from inside torch
(``KeyError: 'step'`` at the first step) or a bare ``KeyError``. A restored learning-rate schedule
that ends before the resumed run warns, naming the scheduler, both lengths and how to restart it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.regression import Regressor, make_loader
from tests.helpers.trainers import quiet_trainer
from trainer.checkpoint.files import load_checkpoint
from trainer.checkpoint.resume import ScheduleEndsEarlyWarning
from trainer.errors import CheckpointError


def adamw(module: torch.nn.Module) -> Any:
    return torch.optim.AdamW(module.parameters(), lr=0.01)


def sgd(module: torch.nn.Module) -> Any:
    return torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)


def with_scheduler(
    make: Callable[[torch.optim.Optimizer], Any], opt: Callable[[torch.nn.Module], Any] = adamw
) -> Callable[[torch.nn.Module], Any]:
    def configure(module: torch.nn.Module) -> Any:
        optimizer = opt(module)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": make(optimizer), "interval": "epoch"}}

    return configure


def cosine_over(epochs: int) -> Callable[[torch.nn.Module], Any]:
    return with_scheduler(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=epochs))


def step_lr(optimizer: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)


def saved(tmp_path: Path, optim_fn: Callable[[torch.nn.Module], Any], epochs: int = 1) -> Path:
    trainer = quiet_trainer(tmp_path / "first", max_epochs=epochs)
    trainer.fit(Regressor(optim_fn), make_loader())
    path = tmp_path / "first.ckpt"
    trainer.save_checkpoint(path)
    return path


def resume(tmp_path: Path, path: Path, optim_fn: Callable[[torch.nn.Module], Any], epochs: int = 2) -> None:
    quiet_trainer(tmp_path / "second", max_epochs=epochs).fit(Regressor(optim_fn), make_loader(), ckpt_path=path)


def test_another_optimizer_is_named_in_one_line(tmp_path: Path) -> None:
    path = saved(tmp_path, adamw)
    assert load_checkpoint(path)["optimizer_types"] == ["AdamW"]
    with pytest.raises(CheckpointError) as info:
        resume(tmp_path, path, sgd)
    message = str(info.value)
    assert "optimizer AdamW" in message and "configures SGD" in message and str(path) in message
    assert "weights.pt" in message and "\n" not in message


def test_an_older_checkpoint_without_kinds_is_told_apart_by_its_state(tmp_path: Path) -> None:
    path = saved(tmp_path, adamw)
    state = torch.load(path, weights_only=True)
    del state["optimizer_types"], state["lr_scheduler_types"]
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=r"optimizer another kind \(.*betas.*\), this run configures SGD"):
        resume(tmp_path, path, sgd)


def test_another_scheduler_is_named(tmp_path: Path) -> None:
    path = saved(tmp_path, cosine_over(2))
    with pytest.raises(CheckpointError, match=r"scheduler CosineAnnealingLR, this run configures StepLR"):
        resume(tmp_path, path, with_scheduler(step_lr))


def test_a_scheduler_more_or_less_is_named(tmp_path: Path) -> None:
    path = saved(tmp_path, adamw)
    with pytest.raises(CheckpointError, match=r"0 scheduler state\(s\).*configures 1 \(StepLR\)"):
        resume(tmp_path, path, with_scheduler(step_lr))


@pytest.mark.parametrize("key", ["progress", "lr_schedulers"])
def test_a_missing_entry_is_named(tmp_path: Path, key: str) -> None:
    path = saved(tmp_path, adamw)
    state = torch.load(path, weights_only=True)
    del state[key]
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=rf"has no '{key}' entry, which resuming needs"):
        resume(tmp_path, path, adamw)


def test_the_same_kinds_resume_as_before(tmp_path: Path) -> None:
    path = saved(tmp_path, with_scheduler(step_lr))
    resume(tmp_path, path, with_scheduler(step_lr))


def test_a_schedule_that_ends_before_the_resumed_run_warns(tmp_path: Path) -> None:
    # The cosine spans the run it was made for (T_max = max_epochs, as conf/optim/adamw.yaml does);
    # resumed with max_epochs=3, the restored T_max=1 would run two epochs past its end.
    path = saved(tmp_path, cosine_over(1), epochs=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resume(tmp_path, path, cosine_over(3), epochs=3)
    said = [str(w.message) for w in caught if issubclass(w.category, ScheduleEndsEarlyWarning)]
    assert len(said) == 1, said
    assert "CosineAnnealingLR" in said[0] and "T_max=1 (epochs)" in said[0] and "trains for 3 epochs" in said[0]
    assert "weights.pt" in said[0]  # how to start a schedule of the new length


def test_a_schedule_resumed_as_planned_is_not_reported(tmp_path: Path) -> None:
    path = saved(tmp_path, cosine_over(3), epochs=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resume(tmp_path, path, cosine_over(3), epochs=3)
    assert not [w for w in caught if issubclass(w.category, ScheduleEndsEarlyWarning)]


def test_an_unreadable_file_is_one_short_line(tmp_path: Path) -> None:
    path = tmp_path / "garbage.ckpt"
    path.write_bytes(b"not a checkpoint\n")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "not a readable torch file" in message and "\n" not in message and len(message) < 300, message
