"""geartrain removes or replaces only what it wrote, and resumes only this run's newest complete checkpoint.

Before: the replace helpers moved aside and deleted anything at a target path (a user's folder, the
working directory); a run refused because another live run held its ``hydra.run.dir`` deleted that
run's folder, and any early error deleted every top-level ``*.log`` of a reused folder; a kill
mid-save made ``ckpt_path=last`` resume an older run; ``save_last="link"`` evicted before relinking
and turned ``last.ckpt`` into a folder on a save that did not rank.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from callbacks import ModelCheckpoint
from strategies import SingleDeviceStrategy
from tests.helpers import jobs
from tests.helpers.cli import run_geartrain
from tests.helpers.trainers import quiet_trainer
from trainer.checkpoint.convert import main as convert
from trainer.checkpoint.files import write_checkpoint as save_checkpoint
from trainer.checkpoint.resolve import resolve_last_checkpoint
from trainer.cli.run_dir_guard import guarded_run_dir as locked_run_dir
from trainer.common.errors import CheckpointError

pytestmark = pytest.mark.timeout(240)

QUICK = ("trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "task=fit")
QUIET = ("trainer.enable_progress_bar=false", "logger=none")


class ShardedSingle(SingleDeviceStrategy):
    """One CPU process writing sharded directories (as FSDP does)."""

    state_dict_type = "sharded"


def _user_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "notes.txt").write_text("mine")
    return path


def _a_checkpoint(path: Path) -> Path:
    save_checkpoint({"format": "geartrain", "version": 1, "state_dict": {"w": torch.ones(2)}}, path)
    return path


# ----------------------------------------------------------------- item 1: targets that are not ours
def test_convert_refuses_to_replace_a_users_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _a_checkpoint(tmp_path / "last.ckpt")
    folder = _user_folder(tmp_path / "some_existing_folder")
    assert convert(["to-dir", str(source), f"{folder}/"]) == 2
    assert (folder / "notes.txt").read_text() == "mine"
    said = capsys.readouterr()
    assert "Refusing to replace" in said.err and str(folder) in said.err and "wrote" not in said.out


def test_convert_to_file_refuses_a_folder_as_the_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _a_checkpoint(tmp_path / "last.ckpt")
    assert convert(["to-dir", str(source), str(tmp_path / "dir.ckpt")]) == 0
    folder = _user_folder(tmp_path / "existing_folder")
    assert convert(["to-file", str(tmp_path / "dir.ckpt"), str(folder)]) == 2
    assert (folder / "notes.txt").read_text() == "mine"
    assert "Refusing to replace" in capsys.readouterr().err


def test_convert_refuses_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    work = _user_folder(tmp_path / "work")
    source = _a_checkpoint(work / "last.ckpt")
    monkeypatch.chdir(work)
    for target in (str(work), "."):
        assert convert(["to-dir", str(source), target]) == 2
        err = capsys.readouterr().err
        assert "Refusing to replace" in err and str(work) in err and "Traceback" not in err
    assert sorted(os.listdir(work)) == ["last.ckpt", "notes.txt"]
    assert sorted(os.listdir(tmp_path)) == ["work"]  # no "..partial" left next to it


def test_save_checkpoint_refuses_to_replace_a_folder(tmp_path: Path) -> None:
    folder = _user_folder(tmp_path / "an" / "existing_folder")
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(jobs.BlockNet(), DataLoader(jobs.dataset(8), batch_size=4))
    with pytest.raises(CheckpointError, match=r"Refusing to replace .*existing_folder: it is a folder"):
        trainer.save_checkpoint(folder)
    assert (folder / "notes.txt").read_text() == "mine"
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(CheckpointError, match="not a file or a checkpoint folder"):
        trainer.save_checkpoint(tmp_path / "pipe")


def test_a_sharded_save_refuses_a_folder_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    folder = _user_folder(tmp_path / "folder.ckpt")
    trainer = quiet_trainer(tmp_path, strategy=ShardedSingle(device="cpu"), max_epochs=1)
    trainer.fit(jobs.BlockNet(), DataLoader(jobs.dataset(8), batch_size=4))
    with pytest.raises(CheckpointError, match="Refusing to replace"):
        trainer.save_checkpoint(folder)
    assert sorted(os.listdir(folder)) == ["notes.txt"]
    trainer.save_checkpoint(tmp_path / "ours.ckpt")  # a checkpoint of ours is replaced as before
    trainer.save_checkpoint(tmp_path / "ours.ckpt")
    assert (tmp_path / "ours.ckpt" / ".metadata").is_file()


# ----------------------------------------------------------------- item 2: run directories
def test_a_refused_run_leaves_the_live_runs_folder_alone(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text("the live run's\n")
    (folder / ".hydra" / "overrides.yaml").write_text("- the live run's\n")
    (folder / "__main__.log").write_text("the live run's log\n")
    with locked_run_dir(folder):
        result = run_geartrain(*QUICK, *QUIET, f"hydra.run.dir={folder}", cwd=tmp_path)
        assert result.returncode == 1 and "in use by another live run" in result.stderr
        assert (folder / ".hydra" / "config.yaml").read_text() == "the live run's\n"
        assert (folder / ".hydra" / "overrides.yaml").read_text() == "- the live run's\n"
        assert (folder / "__main__.log").read_text() == "the live run's log\n"
        assert (folder / ".geartrain.lock").exists()


def test_an_early_error_keeps_the_users_files_in_a_reused_folder(tmp_path: Path) -> None:
    logs = _user_folder(tmp_path / "logs")
    (logs / "server.log").write_text("a user's log\n")
    result = run_geartrain(*QUICK, *QUIET, "hydra.run.dir=logs", "data.batch_size=0", cwd=tmp_path)
    assert result.returncode == 1
    assert (logs / "server.log").read_text() == "a user's log\n"
    assert sorted(os.listdir(logs)) == ["notes.txt", "server.log"]  # Hydra's files of this run: gone again


# ----------------------------------------------------------------- item 3: resume of this run
def _sharded_fit(root: Path, epochs: int, ckpt_path: str | None = None, **options: Any) -> Any:
    options = {"save_last": True, "save_top_k": 0, **options}
    trainer = quiet_trainer(
        root,
        [ModelCheckpoint(dirpath=root / "checkpoints", **options)],
        strategy=ShardedSingle(device="cpu"),
        enable_checkpointing=True,
        max_epochs=epochs,
    )
    trainer.fit(jobs.BlockNet(), DataLoader(jobs.dataset(40), batch_size=4), ckpt_path=ckpt_path)
    return trainer


def test_ckpt_path_last_takes_this_runs_set_aside_checkpoint_not_an_older_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    older = tmp_path / "outputs" / "2026-01-01" / "10-00-00"
    _a_checkpoint(older / "checkpoints" / "last.ckpt")
    run = tmp_path / "outputs" / "2026-01-02" / "10-00-00"
    _sharded_fit(run, 1)
    last = run / "checkpoints" / "last.ckpt"
    os.replace(last, last.parent / ".last.ckpt.old")  # a kill between a save's two renames
    chosen = resolve_last_checkpoint(tmp_path, run, [])
    assert chosen == str(last.parent / ".last.ckpt.old")
    assert "was being replaced" in capsys.readouterr().out


def test_ckpt_path_last_with_a_dangling_link_takes_this_runs_newest_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    older = tmp_path / "outputs" / "2026-01-01" / "10-00-00"
    _a_checkpoint(older / "checkpoints" / "last.ckpt")
    run = tmp_path / "outputs" / "2026-01-02" / "10-00-00"
    _a_checkpoint(run / "checkpoints" / "epoch=0-step=10.ckpt")
    os.symlink("epoch=9-step=99.ckpt", run / "checkpoints" / "last.ckpt")  # names an evicted file
    chosen = resolve_last_checkpoint(tmp_path, run, [])
    assert chosen == str(run / "checkpoints" / "epoch=0-step=10.ckpt")
    out = capsys.readouterr().out
    assert "which is gone" in out and str(older) not in out


# ----------------------------------------------------------------- item 4: save_last="link"
def test_a_kill_after_eviction_still_resumes_from_the_newest_checkpoint(tmp_path: Path) -> None:
    """Eviction happens after the relink; a link left dangling anyway is recovered from."""
    trainer = _sharded_fit(tmp_path, 2, save_last="link", save_top_k=1)
    checkpoints = tmp_path / "checkpoints"
    last = checkpoints / "last.ckpt"
    assert last.is_symlink() and last.resolve().exists()
    target = last.resolve()
    os.remove(last)
    os.symlink("epoch=0-step=10.ckpt", last)  # what a kill between eviction and relink used to leave
    resumed = quiet_trainer(tmp_path / "r", strategy=ShardedSingle(device="cpu"), max_epochs=2)
    resumed.fit(jobs.BlockNet(), DataLoader(jobs.dataset(40), batch_size=4), ckpt_path=str(target))
    assert resumed.global_step == trainer.global_step
    cb = ModelCheckpoint(dirpath=checkpoints, save_last="link", save_top_k=1)
    again = quiet_trainer(tmp_path, [cb], strategy=ShardedSingle(device="cpu"), enable_checkpointing=True, max_epochs=2)
    again.fit(jobs.BlockNet(), DataLoader(jobs.dataset(40), batch_size=4), ckpt_path="last")
    assert again.global_step == trainer.global_step  # resumed from the complete newest, not refused


def test_relinking_happens_before_eviction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainer.checkpoint.connector as checkpoint

    order: list[str] = []
    link, remove = checkpoint.symlink, checkpoint.remove_checkpoint
    monkeypatch.setattr(checkpoint, "symlink", lambda *a: (order.append("link"), link(*a))[1])
    monkeypatch.setattr(checkpoint, "remove_checkpoint", lambda p: (order.append("evict"), remove(p))[1])
    _sharded_fit(tmp_path, 3, save_last="link", save_top_k=1)
    assert order == ["link", "link", "evict", "link", "evict"]


class _Worsening(jobs.BlockNet):
    """Logs a score that only gets worse, so no save after the first ranks in a top-1."""

    def on_train_epoch_end(self) -> None:
        self.log("score", float(self.current_epoch))


def test_a_save_that_does_not_rank_keeps_last_a_link(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    cb = ModelCheckpoint(dirpath=checkpoints, save_last="link", save_top_k=1, monitor="score", mode="min")
    trainer = quiet_trainer(
        tmp_path, [cb], strategy=ShardedSingle(device="cpu"), enable_checkpointing=True, max_epochs=3
    )
    trainer.fit(_Worsening(), DataLoader(jobs.dataset(40), batch_size=4))  # died with IsADirectoryError
    last = checkpoints / "last.ckpt"
    assert last.is_symlink() and (last.resolve() / ".metadata").is_file()
    assert "step=30" in last.resolve().name
    assert cb.best_model_path.endswith("epoch=0-step=10.ckpt")
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "epoch=0-step=10.ckpt",
        "epoch=2-step=30.ckpt",
        "last.ckpt",
    ]
