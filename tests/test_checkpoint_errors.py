"""Bad checkpoint files fail with a clear CheckpointError and run nothing: truncated, random bytes,
foreign, newer, of another model, a malicious pickle; a full disk keeps the previous file."""

from __future__ import annotations

import errno
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import trainer.checkpoint.files as ckpt_io
from tests.helpers.regression import Small
from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule
from trainer.checkpoint.files import CheckpointError, load_checkpoint
from trainer.checkpoint.files import write_checkpoint as save_checkpoint


@pytest.fixture
def good_ckpt(tmp_path: Path) -> Path:
    module = Small()
    trainer = quiet_trainer(tmp_path, strategy="auto", num_sanity_val_steps=2, enable_checkpointing=True, max_steps=2)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 3)), batch_size=4)
    trainer.fit(module, data)
    path = tmp_path / "checkpoints" / "last.ckpt"
    assert path.is_file()
    return path


def evaluate_with(tmp_path: Path, path: Path, module: TrainModule | None = None) -> None:
    trainer = quiet_trainer(tmp_path / "eval", strategy="auto", num_sanity_val_steps=2, enable_checkpointing=True)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 3)), batch_size=4)
    trainer.fit(module or Small(), data, ckpt_path=path)


def test_truncated_checkpoint(tmp_path: Path, good_ckpt: Path) -> None:
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(good_ckpt.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        load_checkpoint(cut)


def test_random_bytes(tmp_path: Path) -> None:
    noise = tmp_path / "noise.ckpt"
    noise.write_bytes(os.urandom(4096))
    with pytest.raises(CheckpointError, match="not a readable torch file"):
        load_checkpoint(noise)


def test_not_a_geartrain_checkpoint(tmp_path: Path) -> None:
    plain = tmp_path / "plain.pt"
    torch.save({"weight": torch.zeros(2)}, plain)
    with pytest.raises(CheckpointError, match="not a geartrain checkpoint"):
        load_checkpoint(plain)


def test_newer_format_version(tmp_path: Path, good_ckpt: Path) -> None:
    state = torch.load(good_ckpt, weights_only=True)
    state["version"] = ckpt_io.FORMAT_VERSION + 1
    newer = tmp_path / "newer.ckpt"
    torch.save(state, newer)
    with pytest.raises(CheckpointError, match="newer than this geartrain reads"):
        load_checkpoint(newer)


def test_checkpoint_of_a_different_model_lists_keys_and_shapes(tmp_path: Path, good_ckpt: Path) -> None:
    with pytest.raises(CheckpointError) as info:
        evaluate_with(tmp_path, good_ckpt, Small(width=5))
    assert "shape mismatches" in str(info.value)
    assert "layer.weight: checkpoint (4, 3) vs model (5, 3)" in str(info.value)

    class Renamed(Small):
        def __init__(self) -> None:
            super().__init__()
            self.extra = nn.Linear(1, 1)

    with pytest.raises(CheckpointError) as info:
        evaluate_with(tmp_path, good_ckpt, Renamed())
    assert "missing keys (2): extra.bias, extra.weight" in str(info.value)


class Payload:
    """Creates a file when unpickled: what a malicious checkpoint would do."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.target}",))


def test_malicious_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    evil = tmp_path / "evil.ckpt"
    with evil.open("wb") as f:
        pickle.dump({"format": "geartrain", "version": 1, "state_dict": Payload(target)}, f)
    with pytest.raises(CheckpointError, match="refusing"):
        load_checkpoint(evil)
    torch.save({"format": "geartrain", "version": 1, "x": Payload(target)}, tmp_path / "evil2.ckpt")
    with pytest.raises(CheckpointError, match="refusing"):
        load_checkpoint(tmp_path / "evil2.ckpt")
    assert not target.exists()


@pytest.fixture
def disk_full(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch.save writes a little, then fails as a full disk does."""

    def failing_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        f.write(b"partial bytes")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt_io.torch, "save", failing_save)
    yield


def test_disk_full_keeps_the_previous_checkpoint(tmp_path: Path, good_ckpt: Path, disk_full: None) -> None:
    before = good_ckpt.read_bytes()
    files_before = sorted(p.name for p in good_ckpt.parent.iterdir())
    with pytest.raises(CheckpointError, match="No space left on device"):
        save_checkpoint({"format": "geartrain"}, good_ckpt)
    assert good_ckpt.read_bytes() == before
    assert sorted(p.name for p in good_ckpt.parent.iterdir()) == files_before  # no temporary file left
