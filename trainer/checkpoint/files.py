"""The one writer: every checkpoint file reaches the disk here, atomically, in the foreground or a thread.

Every save (``ModelCheckpoint``, ``OnExceptionCheckpoint``, ``Trainer.save_checkpoint``, the
converter, a sharded directory's :mod:`~trainer.checkpoint.sharded`) ends in :func:`finish_save`:
its extra names as hard links, then the files it supersedes removed. Every replacement goes through
:func:`swap_in`, which replaces only checkpoints of ours (a directory set aside as ``.<name>.old``).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import os
import shutil
import stat
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoint.format import FORMAT_VERSION, PARTIAL, SET_ASIDE, is_our_checkpoint_dir
from trainer.checkpoint.reader import first_reason, load_checkpoint
from trainer.common.errors import CheckpointError
from trainer.common.tree import apply_to_tensors

__all__ = [
    "FORMAT_VERSION",
    "AsyncCheckpointWriter",
    "CheckpointError",
    "check_replaceable",
    "fsync_dir",
    "load_checkpoint",
    "place_checkpoint",
    "remove_checkpoint",
    "swap_in",
    "write_checkpoint",
]


def place_checkpoint(source: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """Put the checkpoint ``source`` (a file or a sharded directory) also at ``path``: hard links where possible.

    A link costs no second write. It is made atomically: linked under a temporary name in ``path``'s
    folder (a directory's files into ``.<name>.partial``), renamed over ``path``; a reader sees the
    old ``path`` or the new one. The names share inodes, which is safe because geartrain never writes
    into an existing checkpoint file (every save renames a new file over the name). Where the
    filesystem refuses links (another device, FAT, some network mounts) the files are copied. The
    caller syncs the folder (:func:`finish_save`, once for all the save's names).
    """
    source, path = Path(source), Path(path)
    if source.resolve() == path.resolve():
        return path
    check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # os.urandom, not the random module: a save must not move the run's Python RNG stream.
    tmp = path.parent / (f".{path.name}{PARTIAL}" if source.is_dir() else f".{path.name}.{os.urandom(6).hex()}.tmp")
    try:
        if source.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)  # our own name: a copy a killed save left
            shutil.copytree(source, tmp, copy_function=_link_or_copy)
        else:
            _link_or_copy(source, tmp)
        swap_in(tmp, path)
    except OSError as err:
        remove_checkpoint(tmp)
        raise CheckpointError(f"Could not place checkpoint {path}: {err}") from err
    return path


def _link_or_copy(source: str | os.PathLike[str], dest: str | os.PathLike[str]) -> None:
    """A hard link (no second write), else a copy, synced before a rename can show it under its name."""
    try:
        os.link(source, dest)
    except OSError:  # EXDEV, EPERM, ENOTSUP, EMLINK, ...: no links here. A missing source fails in the copy.
        shutil.copy2(source, dest)
        with open(dest, "rb") as copy:
            os.fsync(copy.fileno())


def write_checkpoint(
    state: Mapping[str, Any],
    path: str | os.PathLike[str],
    also_at: Iterable[str | os.PathLike[str]] = (),
    replaces: Iterable[str | os.PathLike[str]] = (),
) -> Path:
    """One whole save, in the order that never loses a checkpoint: write, place copies, remove old files.

    ``state`` is written to a temporary file in ``path``'s folder, fsynced and renamed over ``path``
    (a crash leaves the old file or the new one, never a partial file), then :func:`finish_save`. A
    failure raises :class:`CheckpointError` and skips the later steps: the old files are still there.
    """
    path = _write_atomically(Path(path), lambda f: torch.save(dict(state), f), sync_dir=False)
    finish_save(path, [Path(p) for p in also_at], replaces)
    return path


def finish_save(path: Path, also_at: Sequence[Path], replaces: Iterable[str | os.PathLike[str]]) -> None:
    """The end of every save, once its file or sharded directory is in place at ``path``.

    It is placed at every ``also_at`` path (:func:`place_checkpoint`), the folders are synced once, and only
    then are the checkpoints it supersedes (``replaces``, e.g. a top-k file it pushed out) deleted. A
    superseded checkpoint that cannot be deleted only warns: nothing is lost by keeping it.
    """
    for other in also_at:
        place_checkpoint(path, other)
    for folder in dict.fromkeys(p.parent for p in (path, *also_at)):
        fsync_dir(folder)
    keep = {p.resolve() for p in (path, *also_at)}
    for old in map(Path, replaces):
        if old.resolve() in keep:
            continue
        try:
            if not remove_checkpoint(old):
                warnings.warn(f"Kept the superseded {old}: it is not a checkpoint of ours", stacklevel=2)
        except OSError as err:
            warnings.warn(f"Could not remove the superseded checkpoint {old}: {err}", stacklevel=2)


def check_replaceable(path: str | os.PathLike[str]) -> None:
    """Raise :class:`CheckpointError` unless ``path`` is absent, a file, a link, or a checkpoint folder of ours.

    A file is replaced whole (as ``torch.save`` does), a link as a link (what it names is left alone);
    anything else (a user's folder, the working directory) is refused, naming it, before a byte is written.
    """
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        raise CheckpointError(f"Cannot write the checkpoint {path}: {os.strerror(err.errno or 0)}") from err
    if stat.S_ISLNK(mode) or stat.S_ISREG(mode) or is_our_checkpoint_dir(path):
        return
    shown = f"{path} ({path.resolve()})" if path.name in ("", ".", "..") else str(path)
    if stat.S_ISDIR(mode):
        raise CheckpointError(
            f"Refusing to replace {shown}: it is a folder, not a geartrain checkpoint (no .metadata and "
            "trainer.pt). geartrain replaces only checkpoints it wrote; give a path inside it, e.g. "
            f"{path / 'last.ckpt'}, or another name"
        )
    raise CheckpointError(
        f"Refusing to replace {shown}: it is not a file or a checkpoint folder (a FIFO, a socket or a "
        "device); give another name"
    )


def remove_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Delete the checkpoint at ``path`` (a file, a link, or a sharded directory of ours); False if left alone."""
    path = Path(path)
    if is_our_checkpoint_dir(path):
        shutil.rmtree(path, ignore_errors=True)
        return True
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
        return True
    return not os.path.lexists(path)


def swap_in(new: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Rename ``new`` (a file, a link or a directory) to ``path``, over what is there (a checkpoint of ours).

    ``os.replace`` where it can; where a directory is involved on either side, what is at ``path`` is
    moved aside to ``.<name>.old`` first (a link is removed, never what it names) and deleted once
    ``new`` is in place and the folder is synced, so a kill in between leaves a loadable checkpoint
    (the reader's ``complete_path`` finds it).
    """
    new, path = Path(new), Path(path)
    check_replaceable(path)
    if not any(p.is_dir() and not p.is_symlink() for p in (path, new)):
        os.replace(new, path)
        return
    aside = path.parent / f".{path.name}{SET_ASIDE}"
    remove_checkpoint(aside)
    if path.is_symlink():
        path.unlink()  # save_last="link": the link goes, the directory it named stays
    elif os.path.lexists(path):
        os.replace(path, aside)
    os.replace(new, path)
    fsync_dir(path.parent)
    remove_checkpoint(aside)


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make renames in ``directory`` durable (POSIX); a no-op where directories cannot be opened."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def symlink(target: str | os.PathLike[str], link: str | os.PathLike[str]) -> None:
    """Point ``link`` at ``target`` (relative to the link's folder), replacing what was there atomically.

    A sharded checkpoint directory at ``link`` (an earlier save without links) is moved aside and
    removed once the link is in place; anything else that is not a checkpoint is refused.
    """
    check_replaceable(link)
    tmp = f"{link}.tmp-link"
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(os.path.relpath(target, os.path.dirname(link) or "."), tmp)
    swap_in(tmp, link)


def _write_atomically(path: Path, write: Callable[[Any], None], sync_dir: bool = True) -> Path:
    check_replaceable(path)  # a user's folder or file at the path is refused before anything is written
    path.parent.mkdir(parents=True, exist_ok=True)
    # os.urandom, not the random module: a save must not move the run's Python RNG stream.
    tmp_name = path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp"
    # Made as the run's logs are (0666 less the umask, applied by the kernel), not private as mkstemp's.
    fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        swap_in(tmp_name, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        raise CheckpointError(f"Could not write checkpoint {path}: {write_failure(path, err)}") from err
    if sync_dir:
        fsync_dir(path.parent)
    return path


def snapshot_state(state: Mapping[str, Any], reuse: list[torch.Tensor] | None = None) -> dict[str, Any]:
    """A copy of ``state`` that later training cannot change: every tensor cloned into CPU memory.

    Containers are rebuilt and tensors copied to the CPU (tied weights become separate copies, which
    load the same). ``reuse``: the CPU tensors of an earlier snapshot nobody reads any more, in the
    order this function meets tensors; where shape and dtype match the copy goes into them (fresh
    memory costs page faults, often more than the copy). On return it holds this snapshot's tensors.
    """
    old = list(reuse) if reuse is not None else []
    new: list[torch.Tensor] = []

    def copy(t: torch.Tensor) -> torch.Tensor:
        buffer = old[len(new)] if len(new) < len(old) else None
        if buffer is not None and buffer.shape == t.shape and buffer.dtype == t.dtype:
            buffer.copy_(t.detach())
        else:
            buffer = t.detach().to("cpu", copy=True)
        new.append(buffer)
        return buffer

    copied = apply_to_tensors(dict(state), copy)
    assert isinstance(copied, dict)
    if reuse is not None:
        reuse[:] = new
    return copied


class AsyncCheckpointWriter:
    """Write checkpoints in a background thread, so training is blocked only for a CPU snapshot.

    The one background writer: :meth:`save` (a file), ``AsyncCheckpointIO`` (a user's IO) and a
    sharded save (DCP's future, then the renames) each hand :meth:`run` the write to do. Writes never
    overlap: a new one first waits for the previous one. A write's error is re-raised by the next
    :meth:`save` or :meth:`run`, or by :meth:`wait`. The process does not end with a write in flight:
    the thread is not a daemon, and an ``atexit`` hook waits too. :meth:`save`'s snapshot memory is
    reused by the next save (:meth:`close` frees it).

    Example:
        >>> import tempfile, torch
        >>> writer = AsyncCheckpointWriter()
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     writer.save({"w": torch.zeros(2)}, f"{tmp}/a.ckpt")
        ...     writer.wait()
        ...     sorted(torch.load(f"{tmp}/a.ckpt"))
        ['w']
        >>> writer.close()
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._buffers: list[torch.Tensor] = []
        atexit.register(self._at_exit)

    def save(
        self,
        state: Mapping[str, Any],
        path: str | os.PathLike[str],
        also_at: Iterable[str | os.PathLike[str]] = (),
        replaces: Iterable[str | os.PathLike[str]] = (),
    ) -> None:
        """Snapshot ``state`` now and write it as :func:`write_checkpoint` does, in the background (after
        waiting for the previous write: its error is raised here, and this state is not written)."""
        self.wait()
        snapshot = snapshot_state(state, reuse=self._buffers)
        self.run(functools.partial(write_checkpoint, snapshot, Path(path), tuple(also_at), tuple(replaces)))

    def run(self, write: Callable[[], object]) -> None:
        """Call ``write`` in the background thread once the previous write is done (its error is raised here)."""
        self.wait()

        def target() -> None:
            try:
                write()
            except BaseException as err:
                self._error = err

        self._thread = threading.Thread(target=target, name="geartrain-checkpoint-writer", daemon=False)
        self._thread.start()

    def wait(self) -> None:
        """Block until the write in flight (if any) is on disk; re-raise its error if it failed."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Wait for the last write, free the snapshot's memory and drop the ``atexit`` hook."""
        try:
            self.wait()
        finally:
            self._buffers = []
            atexit.unregister(self._at_exit)

    def _at_exit(self) -> None:
        try:
            self.wait()
        except BaseException as err:
            print(f"geartrain: the last asynchronous checkpoint write failed: {err}", file=sys.stderr)


def write_failure(path: Path, err: BaseException) -> str:
    """What stopped writing ``path``: the disk's own reason where the chain of errors holds one.

    torch reports a write the disk refused as ``enforce fail at inline_container.cc ... unexpected
    pos``; the ``OSError`` underneath (or the free space left) says what happened.
    """
    try:
        free: int | None = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    free_space = "" if free is None else f"; {free / 2**20:.1f} MiB free in {path.parent}"
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"{os.strerror(seen.errno)} (the disk is full){free_space}"
        if isinstance(seen, OSError) and seen.errno is not None:
            return f"{os.strerror(seen.errno)} ({seen})"
        seen = seen.__cause__ or seen.__context__
    if "unexpected pos" in str(err) or "inline_container" in str(err):
        full = free is not None and free < 1 << 20
        reason = (
            "the disk is full" if full else f"the file could not be written completely (torch: {first_reason(err)})"
        )
        return reason + free_space
    return str(err)
