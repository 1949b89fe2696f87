"""Every way a fit ends inside an epoch resumes exactly: the rest of the epoch is trained, not skipped.

A fit stopped at step 12 (batch 2 of epoch 1) by ``max_steps``, ``max_time``, ``should_stop`` (a
callback's or the module's) or early stopping at a mid-epoch validation writes ``last.ckpt`` at that
epoch's end; resumed from it without the stop, it must end where the uninterrupted run ends (30 steps,
the same learning rate) with its weights bitwise, on one process and on two.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import stop_jobs
from tests.helpers.distributed import run_python, spawn

STOPS = ["max_steps", "max_time", "callback", "module", "early_stopping"]


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return stop_jobs.uninterrupted(str(tmp_path_factory.mktemp("whole")))


def _assert_same_run(resumed: dict[str, Any], whole: dict[str, Any]) -> None:
    assert (resumed["steps"], resumed["epoch"], resumed["lr"]) == (whole["steps"], whole["epoch"], whole["lr"])
    for key, value in whole["weights"].items():
        assert torch.equal(resumed["weights"][key], value), key


@pytest.mark.parametrize("stop", STOPS)
def test_a_fit_stopped_inside_an_epoch_resumes_the_rest_of_it_exactly(
    tmp_path: Path, whole: dict[str, Any], stop: str
) -> None:
    run = stop_jobs.stop_and_resume(str(tmp_path), stop)
    assert run["stopped"]["steps"] == (15 if stop == "early_stopping" else stop_jobs.STOP_AT)
    # The checkpoint says where in the epoch the run stopped, and that it is to go on.
    progress = run["saved_progress"]
    assert (progress["epoch"], progress["epoch_finished"], progress["should_stop"]) == (1, False, False)
    assert progress["batch_in_epoch"] == run["stopped"]["steps"] - 10
    _assert_same_run(run["resumed"], whole)


def test_the_stopped_run_still_ends_its_epoch_as_lightning(tmp_path: Path) -> None:
    """The stop's own epoch end happens (schedulers step, epoch counted), only the checkpoint differs."""
    run = stop_jobs.stop_and_resume(str(tmp_path), "max_steps")
    assert run["stopped"]["epoch"] == 2  # Lightning's current_epoch after an epoch ended by max_steps
    assert run["stopped"]["lr"] == pytest.approx(0.05 * 0.7**2)  # two epoch ends: two scheduler steps


def test_a_stop_inside_an_accumulation_window_resumes_from_the_windows_first_batch(tmp_path: Path) -> None:
    """``should_stop`` after batch 3 of a 2-batch window: its gradients are dropped, and said so."""
    options: dict[str, Any] = {"accumulate_grad_batches": 2, "dropout": 0.0, "max_epochs": 2}
    expected = stop_jobs.uninterrupted(str(tmp_path), **options)
    with pytest.warns(UserWarning, match=r"inside an accumulation window .* trains the window again from batch 2"):
        run = stop_jobs.stop_and_resume(str(tmp_path), "module", **{**options, "stop_at_batch": 13})
    assert run["saved_progress"]["batch_in_epoch"] == 2
    _assert_same_run(run["resumed"], expected)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_fits_stopped_inside_an_epoch_resume_exactly(tmp_path: Path) -> None:
    ranks = spawn(stop_jobs.ddp_ranks, str(tmp_path), ["max_steps", "callback"], world_size=2)
    for rank in ranks:
        for stop in ("max_steps", "callback"):
            assert rank[stop]["saved_progress"]["batch_in_epoch"] == 2
            _assert_same_run(rank[stop]["resumed"], rank["whole"])
    for key, value in ranks[0]["whole"]["weights"].items():
        assert torch.equal(ranks[1]["whole"]["weights"][key], value)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_save_checkpoint_after_a_ddp_spawn_fit_records_the_stop(tmp_path: Path) -> None:
    """The caller adopts rank 0's end of the run, resume point included: its file equals the ranks' last.ckpt."""
    result = run_python([stop_jobs.__file__, str(tmp_path)], timeout=200)
    assert result.returncode == 0, result.stderr
    after = torch.load(tmp_path / "after.ckpt", weights_only=True)
    last = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert after["progress"] == last["progress"] and after["progress"]["batch_in_epoch"] == 2
    assert after["lr_schedulers"] == last["lr_schedulers"]
    assert after["optimizer_states"][0]["param_groups"] == last["optimizer_states"][0]["param_groups"]


def test_a_resume_with_another_limit_train_batches_goes_on_from_the_batch_it_stopped_at(tmp_path: Path) -> None:
    """Stopped at batch 2 of epoch 1 with 6 batches an epoch: 10 an epoch trains batches 2-9; 2 says it trains none."""
    from callbacks import Callback, ModelCheckpoint
    from tests.helpers.trainers import quiet_trainer

    class Seen(Callback):
        def __init__(self) -> None:
            self.batches: list[tuple[int, int]] = []

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
            self.batches.append((trainer.current_epoch, batch_idx))

    def fit(root: Path, ckpt_path: Path | None = None, **options: Any) -> list[tuple[int, int]]:
        seen = Seen()
        ckpt = ModelCheckpoint(dirpath=root, save_top_k=0, save_last=True)
        trainer = quiet_trainer(root, [seen, ckpt], enable_checkpointing=True, **options)
        trainer.fit(stop_jobs.Net(), ckpt_path=ckpt_path, **stop_jobs._loaders(8))
        return seen.batches

    assert fit(tmp_path, limit_train_batches=6, max_steps=8)[-2:] == [(1, 0), (1, 1)]
    assert fit(tmp_path, tmp_path / "last.ckpt", max_epochs=2) == [(1, i) for i in range(2, 10)]
    fit(tmp_path / "low", limit_train_batches=6, max_steps=9)
    with pytest.warns(UserWarning, match=r"stopped after batch 3 of epoch 1, and this run trains 2 batches"):
        assert fit(tmp_path / "low", tmp_path / "low" / "last.ckpt", max_epochs=2, limit_train_batches=2) == []


def test_a_finders_trial_inside_the_fit_leaves_no_resume_point_behind(tmp_path: Path) -> None:
    """LearningRateFinder's trial stops inside an epoch; the hosting fit's own checkpoints must not take its place."""
    from callbacks import LearningRateFinder, ModelCheckpoint
    from tests.helpers.trainers import quiet_trainer

    finder = LearningRateFinder(num_training_steps=5, update_attr=False)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_top_k=0, save_last=True)
    trainer = quiet_trainer(tmp_path, [finder, ckpt], enable_checkpointing=True, max_epochs=2)
    trainer.fit(stop_jobs.Net(), **stop_jobs._loaders(8))
    progress = torch.load(tmp_path / "last.ckpt", weights_only=True)["progress"]
    assert (progress["global_step"], progress["epoch"], progress["epoch_finished"]) == (20, 1, True)
