"""A sharded checkpoint directory is as strict and as safe as a file, and its failures say which file.

Before: a bigger model's directory loaded into a smaller one without a word; a crafted ``.metadata``
pointing at ``../elsewhere`` made the loader read outside the folder; every DCP failure printed
``rank 0: tuple: (FileNotFoundError(...), [<FrameSummary ...>])``; a truncated ``.metadata`` was
called a malicious pickle; a failed write of ``trainer.pt`` was a bare ``OSError`` that left
``.<name>.partial`` behind; wrong-typed values in ``trainer.pt`` gave torch's ``TypeError``; and a
weights-only directory's refusal advised ``torch.load(<folder>)``.
"""

from __future__ import annotations

import errno
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from strategies import SingleDeviceStrategy
from tests.helpers import jobs
from tests.helpers.trainers import quiet_trainer
from trainer.checkpoint.convert import main as convert
from trainer.checkpoint.sharded import TRAINER_STATE, load_sharded, save_sharded
from trainer.common.errors import CheckpointError

pytestmark = pytest.mark.timeout(240)


class ShardedSingle(SingleDeviceStrategy):
    """One CPU process writing sharded directories (as FSDP does)."""

    state_dict_type = "sharded"


def _module(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(4, 4) for _ in range(width)])


def _saved(path: Path, width: int = 2) -> Path:
    state = {"format": "geartrain", "version": 1, "state_dict": _module(width).state_dict()}
    save_sharded(path, state)
    return path


# ----------------------------------------------------------------- item 6: unexpected keys
def test_a_bigger_models_directory_is_refused_by_a_smaller_module(tmp_path: Path) -> None:
    bigger = _saved(tmp_path / "big.ckpt", width=3)
    with pytest.raises(CheckpointError, match=r"holds \['2.bias', '2.weight'\] \(2 unexpected\)"):
        load_sharded(bigger, _module(2))
    load_sharded(bigger, _module(2), strict=False)  # what matches, as load_state_dict(strict=False)


def test_a_bigger_models_directory_is_refused_on_resume(tmp_path: Path) -> None:
    class Bigger(jobs.BlockNet):
        def __init__(self) -> None:
            super().__init__()
            self.extra = nn.Linear(3, 3)

    def trainer(root: Path, epochs: int) -> Any:
        return quiet_trainer(root, strategy=ShardedSingle(device="cpu"), max_epochs=epochs)

    big = trainer(tmp_path, 1)
    big.fit(Bigger(), DataLoader(jobs.dataset(8), batch_size=4))
    big.save_checkpoint(tmp_path / "big.ckpt")
    with pytest.raises(CheckpointError, match="unexpected"):
        trainer(tmp_path / "r", 2).fit(
            jobs.BlockNet(), DataLoader(jobs.dataset(8), batch_size=4), ckpt_path=tmp_path / "big.ckpt"
        )


# ----------------------------------------------------------------- item 9: storage confined
def test_a_metadata_pointing_outside_the_folder_is_refused_before_any_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    elsewhere = _saved(tmp_path / "elsewhere.ckpt")
    victim = _saved(tmp_path / "victim.ckpt")
    with open(victim / ".metadata", "rb") as f:
        metadata = pickle.load(f)
    for info in metadata.storage_data.values():
        info.relative_path = f"../elsewhere.ckpt/{info.relative_path}"
    with open(victim / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    reads: list[Any] = []
    monkeypatch.setattr(FileSystemReader, "read_data", lambda self, *a: reads.append(a))
    with pytest.raises(CheckpointError, match=r"names the storage file '\.\./elsewhere\.ckpt/.*outside"):
        load_sharded(victim, _module(2))
    assert convert(["to-file", str(victim), str(tmp_path / "x.ckpt")]) == 2
    assert reads == [] and not (tmp_path / "x.ckpt").exists() and elsewhere.is_dir()


# ----------------------------------------------------------------- item 10: messages
def test_a_missing_shard_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = _saved(tmp_path / "a.ckpt")
    shard = next(p for p in saved.iterdir() if p.suffix == ".distcp")
    shard.unlink()
    with pytest.raises(CheckpointError) as refused:
        load_sharded(saved, _module(2))
    message = str(refused.value)
    assert str(shard) in message and "No such file" in message
    assert "tuple" not in message and "FrameSummary" not in message
    assert convert(["to-file", str(saved), str(tmp_path / "x.ckpt")]) == 2
    err = capsys.readouterr().err
    assert str(shard) in err and "FrameSummary" not in err


def test_a_truncated_metadata_is_called_truncated_not_malicious(tmp_path: Path) -> None:
    saved = _saved(tmp_path / "a.ckpt")
    data = (saved / ".metadata").read_bytes()
    (saved / ".metadata").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as refused:
        load_sharded(saved, _module(2))
    assert "pickled Python objects" not in str(refused.value)
    assert "truncated" in str(refused.value) and ".metadata" in str(refused.value)


def test_a_failed_trainer_state_write_names_the_cause_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainer.checkpoint.sharded as sharded

    def full_disk(path: Path, obj: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(sharded, "write_checkpoint", full_disk)
    with pytest.raises(CheckpointError, match=r"writing .*trainer\.pt failed: No space left on device"):
        _saved(tmp_path / "a.ckpt")
    assert os.listdir(tmp_path) == []


def _with_trainer_state(tmp_path: Path, **changes: Any) -> Path:
    run = quiet_trainer(tmp_path, strategy=ShardedSingle(device="cpu"), max_epochs=1)
    run.fit(jobs.BlockNet(), DataLoader(jobs.dataset(8), batch_size=4))
    run.save_checkpoint(tmp_path / "a.ckpt")
    state = torch.load(tmp_path / "a.ckpt" / TRAINER_STATE, weights_only=True)
    for key, value in changes.items():
        if key.startswith("progress_"):
            state["progress"][key[len("progress_") :]] = value
        else:
            state[key] = value
    torch.save(state, tmp_path / "a.ckpt" / TRAINER_STATE)
    return tmp_path / "a.ckpt"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"progress_global_step": -5}, "progress.global_step=-5"),
        ({"progress_epoch": "three"}, "progress.epoch='three'"),
        ({"progress_epoch_finished": 3}, "progress.epoch_finished=3"),
        ({"progress": [1, 2]}, "progress=[1, 2]"),
        ({"lr_schedulers": {"a": 1}}, "lr_schedulers={'a': 1}"),
    ],
)
def test_wrong_typed_trainer_state_is_refused_with_a_message(tmp_path: Path, change: Any, named: str) -> None:
    path = _with_trainer_state(tmp_path, **change)
    again = quiet_trainer(tmp_path / "r", strategy=ShardedSingle(device="cpu"), max_epochs=2)
    with pytest.raises(CheckpointError, match="damaged or was edited") as refused:
        again.fit(jobs.BlockNet(), DataLoader(jobs.dataset(8), batch_size=4), ckpt_path=path)
    assert named in str(refused.value)


def test_a_weights_only_directory_advises_what_works(tmp_path: Path) -> None:
    run = quiet_trainer(tmp_path, strategy=ShardedSingle(device="cpu"), max_epochs=1)
    run.fit(jobs.BlockNet(), DataLoader(jobs.dataset(8), batch_size=4))
    run.save_checkpoint(tmp_path / "w.ckpt", weights_only=True)
    again = quiet_trainer(tmp_path / "r", strategy=ShardedSingle(device="cpu"), max_epochs=2)
    with pytest.raises(CheckpointError, match="weights only") as refused:
        again.fit(jobs.BlockNet(), DataLoader(jobs.dataset(8), batch_size=4), ckpt_path=tmp_path / "w.ckpt")
    message = str(refused.value)
    assert f"torch.load('{tmp_path / 'w.ckpt'}'" not in message
    assert f"checkpoint.convert to-file {tmp_path / 'w.ckpt'}" in message
