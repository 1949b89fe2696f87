"""The one writer: every checkpoint file reaches the disk here, atomically, in the foreground or a thread.

``ModelCheckpoint``, ``OnExceptionCheckpoint``, ``Trainer.save_checkpoint`` and the converter all
save through :func:`write_checkpoint` (one file, its extra names as hard links, then the files it
supersedes removed, in that order) or :class:`AsyncCheckpointWriter` (the same, in a thread, after a
CPU snapshot). A checkpoint is one dict of tensors and plain containers, so it loads with
``torch.load(path, weights_only=True)``; what goes in is the connector's, the names on disk are
:mod:`trainer.checkpoint.format`'s. A sharded directory is written by every rank together
(``Strategy.save_sharded``, ``strategies.sharded_checkpoint``): the shards are the strategy's.

The format's names, the reader's ``load_checkpoint`` and the leaf's state-dict and RNG helpers stay
importable from here, where earlier versions had them.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import shutil
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoint.format import FORMAT_NAME, FORMAT_VERSION, check_version
from trainer.checkpoint.reader import first_reason, load_checkpoint
from trainer.common.errors import CheckpointError
from trainer.common.fs_safety import check_replaceable, fsync_dir, swap_in
from trainer.common.rng import rng_state, set_rng_state
from trainer.common.state_dict import load_module_state, plain_state_dict, strip_wrapper_prefixes, to_plain
from trainer.common.tree import apply_to_tensors

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "AsyncCheckpointWriter",
    "CheckpointError",
    "check_version",
    "copy_checkpoint",
    "load_checkpoint",
    "load_module_state",
    "place_checkpoint",
    "plain_state_dict",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "strip_wrapper_prefixes",
    "to_plain",
    "write_checkpoint",
]


def save_checkpoint(state: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``state`` to ``path`` atomically: temporary file in the same folder, fsync, rename.

    A crash at any point leaves either the old file or the complete new one under ``path``, never a
    partial file. A failed write (disk full, ...) raises :class:`CheckpointError` and removes the
    temporary file.
    """
    return _write_atomically(Path(path), lambda f: torch.save(dict(state), f))


def copy_checkpoint(source: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """Copy a checkpoint file to ``path`` as atomically as :func:`save_checkpoint` writes one.

    Cheaper than saving the same state twice (``last.ckpt`` next to a top-k file): no state to
    build, nothing to serialise.
    """
    return _copy(Path(source), Path(path), sync_dir=True)


def _copy(source: Path, path: Path, sync_dir: bool) -> Path:
    def copy(f: Any) -> None:
        with open(source, "rb") as src:
            shutil.copyfileobj(src, f, 1 << 20)

    return _write_atomically(path, copy, sync_dir)


def place_checkpoint(source: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """Put the checkpoint file ``source`` also at ``path``: a hard link where possible, else a copy.

    A link costs no second write (``last.ckpt`` next to a top-k file of 400 MB: microseconds instead
    of a copy and an fsync). It is made atomically: linked under a temporary name in ``path``'s
    folder, renamed over ``path``, folder fsynced; a reader sees the old ``path`` or the new one.
    The two names then share one inode, which is safe because geartrain never writes into an
    existing checkpoint file: every save writes a new temporary file and renames it over the name,
    so replacing one name later leaves the other with its content. Where the filesystem refuses
    links (another device, FAT, some network mounts, ...) the file is copied as
    :func:`copy_checkpoint` does.
    """
    return _place(Path(source), Path(path), sync_dir=True)


def _place(source: Path, path: Path, sync_dir: bool) -> Path:
    if source.resolve() == path.resolve():
        return path
    check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        # os.urandom, not the random module: a save must not move the run's Python RNG stream.
        tmp = path.parent / f".{path.name}.{os.urandom(6).hex()}.link.tmp"
        try:
            os.link(source, tmp)
            break
        except FileExistsError:
            continue
        except OSError:
            # EXDEV, EPERM, ENOTSUP, EMLINK, ...: no links here. A missing source fails in the copy.
            return _copy(source, path, sync_dir)
    try:
        swap_in(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise CheckpointError(f"Could not place checkpoint {path}: {err}") from err
    if sync_dir:
        fsync_dir(path.parent)
    return path


def write_checkpoint(
    state: Mapping[str, Any],
    path: str | os.PathLike[str],
    also_at: Iterable[str | os.PathLike[str]] = (),
    replaces: Iterable[str | os.PathLike[str]] = (),
) -> Path:
    """One whole save, in the order that never loses a checkpoint: write, place copies, remove old files.

    ``state`` is written atomically to ``path`` (:func:`save_checkpoint`), then placed at every
    ``also_at`` path (:func:`place_checkpoint`: hard link, else copy), and only then are the files
    it supersedes (``replaces``, e.g. a top-k file it pushed out) deleted. A failure at any step
    raises :class:`CheckpointError` and skips the later steps, so the old files are still there. A
    superseded file that cannot be deleted only warns: nothing is lost by keeping it.
    """
    extra = [Path(p) for p in also_at]
    # The folders are fsynced once, after every rename (the usual last.ckpt sits next to its top-k
    # file) and before any deletion: an old file goes only once the new names are durable.
    path = _write_atomically(Path(path), lambda f: torch.save(dict(state), f), sync_dir=False)
    for other in extra:
        _place(path, other, sync_dir=False)
    for folder in dict.fromkeys(p.parent for p in (path, *extra)):
        fsync_dir(folder)
    keep = {path, *extra}
    for old in replaces:
        if Path(old) in keep:
            continue
        try:
            Path(old).unlink(missing_ok=True)
        except OSError as err:
            warnings.warn(f"Could not remove the superseded checkpoint {old}: {err}", stacklevel=2)
    return path


def _write_atomically(path: Path, write: Callable[[Any], None], sync_dir: bool = True) -> Path:
    check_replaceable(path)  # a user's folder or file at the path is refused before anything is written
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates the file private (0600); a checkpoint follows the umask like the run's logs
        # and configs, so teammates in the group can read it where the umask lets them.
        os.fchmod(fd, 0o666 & ~_umask())
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


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (``/proc/self/status``).

    Elsewhere reading it means setting it and straight back, which another thread creating a file at
    that instant could observe; the writer thread of asynchronous saves is such a thread.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def snapshot_state(state: Mapping[str, Any], reuse: list[torch.Tensor] | None = None) -> dict[str, Any]:
    """A copy of ``state`` that later training cannot change: every tensor cloned into CPU memory.

    Containers are rebuilt, tensors are detached and copied (from any device) to the CPU; numbers and
    strings are shared, being immutable. Tensors that shared storage (tied weights) become separate
    copies, which loads the same.

    Args:
        state: the checkpoint dict.
        reuse: CPU tensors of an earlier snapshot that nobody reads any more, in the order this
            function meets tensors; where shape and dtype match, the copy goes into them instead of
            new memory (fresh memory costs page faults, often more than the copy). On return it holds
            this snapshot's tensors, for the next call.
    """
    old = list(reuse) if reuse is not None else []
    new: list[torch.Tensor] = []

    def copy(t: torch.Tensor) -> torch.Tensor:
        i = len(new)
        buffer = old[i] if i < len(old) else None
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

    :meth:`save` copies the state into CPU memory in the caller (that is the stall training sees),
    then a thread does the whole :func:`write_checkpoint` (atomic write: temporary file, fsync,
    rename; then the extra names; then removal of the files it supersedes, in that order, so a
    failed write removes nothing). Writes never overlap: a save first waits for the previous one. An error raised while writing is
    re-raised by the next :meth:`save` or by :meth:`wait`. The process does not end with a write in
    flight: the writer thread is not a daemon, and an ``atexit`` hook waits as well.

    The snapshot's CPU memory is kept and reused by the next save (one copy of the state stays
    allocated between saves; :meth:`close` frees it): re-touching fresh memory costs more than copying.

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
        self._registered = True
        self._buffers: list[torch.Tensor] = []
        atexit.register(self._at_exit)

    @property
    def pending(self) -> bool:
        """True while a write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def save(
        self,
        state: Mapping[str, Any],
        path: str | os.PathLike[str],
        also_at: Iterable[str | os.PathLike[str]] = (),
        replaces: Iterable[str | os.PathLike[str]] = (),
    ) -> None:
        """Snapshot ``state`` to CPU memory now; write it to ``path`` in the background.

        ``also_at`` and ``replaces`` are as in :func:`write_checkpoint`, done by the writer thread
        after the file is on disk. First waits for the previous write and re-raises its error, in
        which case this state is not written.
        """
        self.wait()
        snapshot = snapshot_state(state, reuse=self._buffers)
        args = (snapshot, Path(path), tuple(also_at), tuple(replaces))
        self._thread = threading.Thread(target=self._write, args=args, name="geartrain-checkpoint-writer", daemon=False)
        self._thread.start()

    def _write(
        self,
        snapshot: dict[str, Any],
        path: Path,
        also_at: tuple[str | os.PathLike[str], ...],
        replaces: tuple[str | os.PathLike[str], ...],
    ) -> None:
        try:
            write_checkpoint(snapshot, path, also_at, replaces)
        except BaseException as err:
            self._error = err

    def wait(self) -> None:
        """Block until the write in flight (if any) is on disk; re-raise its error if it failed."""
        thread = self._thread
        if thread is not None:
            thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Wait for the last write and drop the ``atexit`` hook."""
        try:
            self.wait()
        finally:
            self._buffers = []
            if self._registered:
                atexit.unregister(self._at_exit)
                self._registered = False

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
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"the disk is full ({os.strerror(seen.errno)}){_free_space(path)}"
        if isinstance(seen, OSError) and seen.errno is not None:
            return f"{os.strerror(seen.errno)} ({seen})"
        seen = seen.__cause__ or seen.__context__
    if "unexpected pos" in str(err) or "inline_container" in str(err):
        free = _free_bytes(path)
        if free is not None and free < 1 << 20:
            return f"the disk is full{_free_space(path)}"
        return f"the file could not be written completely (torch: {first_reason(err)}){_free_space(path)}"
    return str(err)


def _free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path.parent).free
    except OSError:
        return None


def _free_space(path: Path) -> str:
    free = _free_bytes(path)
    return "" if free is None else f"; {free / 2**20:.1f} MiB free in {path.parent}"
