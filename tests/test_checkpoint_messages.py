"""A checkpoint that cannot be read or written is reported by its real cause, and files follow the umask.

Each case here was misreported before: a symlink loop, a directory, a FIFO or ``/dev/zero`` all read
"does not exist"; a string version "newer than this geartrain reads (1)"; a refused ``torch.hub.load``
payload "truncated or corrupted?" with torch's advice to load with ``weights_only=False``; a full disk
"enforce fail at inline_container.cc"; and every checkpoint was private (0600) whatever the umask.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import trainer.checkpoint.files as checkpoint_io
from trainer.checkpoint.files import AsyncCheckpointWriter, load_checkpoint
from trainer.checkpoint.files import write_checkpoint as save_checkpoint
from trainer.checkpoint.reader import read_checkpoint
from trainer.common.errors import CheckpointError

STATE = {"format": "geartrain", "version": 1, "state_dict": {"w": torch.ones(3)}}


def refused(path: Path) -> str:
    """The message both readers (geartrain's and the Lightning-aware one) give for ``path``."""
    messages = []
    for read in (load_checkpoint, read_checkpoint):
        with pytest.raises(CheckpointError) as info:
            read(path)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "weights_only=False" not in messages[0]
    return messages[0]


def test_a_symlink_loop_is_named_as_one(tmp_path: Path) -> None:
    loop = tmp_path / "loop.ckpt"
    loop.symlink_to(tmp_path / "other.ckpt")
    (tmp_path / "other.ckpt").symlink_to(loop)
    assert "symbolic link loop" in refused(loop)


def test_a_dangling_symlink_names_its_target(tmp_path: Path) -> None:
    link = tmp_path / "last.ckpt"
    link.symlink_to(tmp_path / "gone.ckpt")
    message = refused(link)
    assert "gone.ckpt" in message and "does not exist" in message


def test_a_directory_is_not_called_missing(tmp_path: Path) -> None:
    message = refused(tmp_path)
    assert "is a directory" in message and "does not exist" not in message


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.ckpt"
    os.mkfifo(fifo)
    assert "is a FIFO, not a regular file" in refused(fifo)  # opening it would wait for a writer forever


def test_a_device_is_refused() -> None:
    assert "is a device, not a regular file" in refused(Path("/dev/zero"))


def test_a_missing_file_still_says_so(tmp_path: Path) -> None:
    assert "does not exist" in refused(tmp_path / "missing.ckpt")


@pytest.mark.parametrize("version", ["1", 0, 1.0, None])
def test_a_version_that_is_not_a_whole_number_is_called_invalid(tmp_path: Path, version: Any) -> None:
    path = tmp_path / "odd.ckpt"
    torch.save({**STATE, "version": version}, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert "invalid format version" in str(info.value) and "newer" not in str(info.value)


def test_a_newer_version_still_says_newer(tmp_path: Path) -> None:
    path = tmp_path / "future.ckpt"
    torch.save({**STATE, "version": 99}, path)
    with pytest.raises(CheckpointError, match="version 99, newer than this geartrain reads"):
        load_checkpoint(path)


class _HubPayload:
    """Unpickling this would call ``torch.hub.load`` (fetch and run code): a torch name, still refused."""

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (torch.hub.load, ("someone/repo", "model"))


def test_a_torch_hub_payload_is_named_not_called_corrupted(tmp_path: Path) -> None:
    path = tmp_path / "payload.ckpt"
    torch.save({**STATE, "extra": _HubPayload()}, path)
    message = refused(path)
    assert "torch.hub.load" in message and "pickled Python objects" in message
    assert "corrupted" not in message and "add_safe_globals" not in message


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every checkpoint write goes to ``/dev/full``, which refuses writes with ENOSPC as a full disk does."""
    real_fdopen = os.fdopen

    def to_dev_full(fd: int, *args: Any, **kwargs: Any) -> Any:
        os.close(fd)
        return real_fdopen(os.open("/dev/full", os.O_WRONLY), *args, **kwargs)

    monkeypatch.setattr(checkpoint_io.os, "fdopen", to_dev_full)
    yield


def test_a_full_disk_is_named(tmp_path: Path, full_disk: None) -> None:
    with pytest.raises(CheckpointError) as info:
        save_checkpoint({**STATE, "big": torch.zeros(100_000)}, tmp_path / "a.ckpt")
    message = str(info.value)
    assert "the disk is full" in message and "MiB free" in message
    assert "inline_container" not in message
    assert not list(tmp_path.glob("*.tmp")) and not (tmp_path / "a.ckpt").exists()


def test_a_full_disk_is_named_by_an_async_save(tmp_path: Path, full_disk: None) -> None:
    writer = AsyncCheckpointWriter()
    writer.save({**STATE, "big": torch.zeros(100_000)}, tmp_path / "a.ckpt")
    with pytest.raises(CheckpointError, match="the disk is full"):
        writer.close()


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_checkpoints_follow_the_umask(tmp_path: Path, umask: int) -> None:
    previous = os.umask(umask)
    try:
        path = save_checkpoint(STATE, tmp_path / f"{umask:o}.ckpt")
        log = tmp_path / f"{umask:o}.log"
        log.write_text("a log file, made as every other file of a run is")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask == stat.S_IMODE(log.stat().st_mode)


def test_resuming_without_a_callback_whose_state_was_saved_warns_naming_it(tmp_path: Path) -> None:
    import warnings

    from callbacks import EarlyStopping
    from tests.helpers.callback_tools import Scripted, loaders
    from tests.helpers.trainers import quiet_trainer

    early = EarlyStopping(monitor="val/loss", patience=5)
    train, val = loaders()
    trainer = quiet_trainer(callbacks=[early], max_epochs=1)
    trainer.fit(Scripted(), train, val)
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    with pytest.warns(UserWarning, match=r"Please add the following callbacks: \[\"EarlyStopping\{'monitor'"):
        quiet_trainer(max_epochs=2).fit(Scripted(), train, val, ckpt_path=tmp_path / "a.ckpt")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*Please add the following callbacks")
        quiet_trainer(callbacks=[EarlyStopping(monitor="val/loss", patience=5)], max_epochs=2).fit(
            Scripted(), train, val, ckpt_path=tmp_path / "a.ckpt"
        )
