"""Asynchronous checkpoint writes: complete files, snapshots isolated from training, no overlap, errors surface."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import trainer.checkpoint.files as ckpt
from tests.helpers import REPO_ROOT
from tests.helpers.tiny_mlp import TinyMLP, make_batches
from tests.helpers.trainers import quiet_trainer
from trainer.checkpoint.files import AsyncCheckpointWriter, CheckpointError, load_checkpoint


def test_file_is_complete_and_holds_the_state_at_save_time(tmp_path: Path) -> None:
    weights = torch.arange(6.0)
    writer = AsyncCheckpointWriter()
    writer.save({"w": weights, "nested": {"step": 3, "t": [weights * 2]}}, tmp_path / "a.ckpt")
    weights.add_(100)  # training goes on while the file is written
    writer.close()
    state = torch.load(tmp_path / "a.ckpt", weights_only=True)
    assert torch.equal(state["w"], torch.arange(6.0))
    assert state["nested"]["step"] == 3 and torch.equal(state["nested"]["t"][0], torch.arange(6.0) * 2)
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temporary file


def test_two_saves_never_overlap_and_reused_buffers_do_not_leak(tmp_path: Path, monkeypatch: Any) -> None:
    active, most = [0], [0]
    lock = threading.Lock()
    real = ckpt.write_checkpoint

    def slow_save(state: Any, path: Any, *rest: Any) -> Any:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.2)
        out = real(state, path, *rest)
        with lock:
            active[0] -= 1
        return out

    monkeypatch.setattr(ckpt, "write_checkpoint", slow_save)
    writer = AsyncCheckpointWriter()
    w = torch.zeros(4)
    for i in range(3):
        w.fill_(i)
        writer.save({"w": w}, tmp_path / f"{i}.ckpt")
    writer.close()
    assert most[0] == 1
    for i in range(3):  # the second save reused the first one's buffer only after it was written
        assert torch.equal(torch.load(tmp_path / f"{i}.ckpt", weights_only=True)["w"], torch.full((4,), float(i)))


def test_a_failed_write_is_raised_on_wait_and_on_the_next_save(tmp_path: Path) -> None:
    unpicklable = {"w": torch.zeros(1), "bad": lambda: 0}  # torch.save fails inside the writer thread
    writer = AsyncCheckpointWriter()
    writer.save(unpicklable, tmp_path / "a.ckpt")
    with pytest.raises(CheckpointError, match=r"a\.ckpt"):
        writer.wait()
    writer.wait()  # reported once
    writer.save(unpicklable, tmp_path / "b.ckpt")
    with pytest.raises(CheckpointError, match=r"b\.ckpt"):
        writer.save({"w": torch.zeros(1)}, tmp_path / "c.ckpt")
    writer.close()
    assert not (tmp_path / "a.ckpt").exists() and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_process_does_not_exit_before_the_last_write(tmp_path: Path) -> None:
    code = f"""
import time, torch
import trainer.checkpoint.files as ckpt
real = ckpt.write_checkpoint
def slow(state, path, *rest):
    time.sleep(1.0)
    return real(state, path, *rest)
ckpt.write_checkpoint = slow
ckpt.AsyncCheckpointWriter().save({{"w": torch.ones(3)}}, {str(tmp_path / "x.ckpt")!r})
"""
    out = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": str(REPO_ROOT)}, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert torch.equal(torch.load(tmp_path / "x.ckpt", weights_only=True)["w"], torch.ones(3))


def test_trainer_async_save_matches_a_synchronous_one(tmp_path: Path) -> None:
    trainer = quiet_trainer(strategy="auto", num_sanity_val_steps=2, max_epochs=1)
    trainer.fit(TinyMLP(), train_dataloaders=make_batches(3))
    trainer.save_checkpoint(tmp_path / "sync.ckpt")
    trainer.save_checkpoint(tmp_path / "async.ckpt", async_=True)
    trainer.wait_for_checkpoints()
    sync, asynchronous = load_checkpoint(tmp_path / "sync.ckpt"), load_checkpoint(tmp_path / "async.ckpt")
    assert sync.keys() == asynchronous.keys()
    for key, value in sync["state_dict"].items():
        assert torch.equal(value, asynchronous["state_dict"][key])
    assert sync["progress"] == asynchronous["progress"]
