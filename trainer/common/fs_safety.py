"""geartrain removes or replaces only what it wrote: the checks and the one replacement every save goes through.

A checkpoint path is replaced only when what is there is a file or link (replaced whole, as
``torch.save`` does), a sharded checkpoint directory of ours (DCP's ``.metadata`` and our
``trainer.pt``) or nothing; a folder that is not a checkpoint (a user's folder, the working
directory) is refused with a message naming it, before a byte is written. A replacement
(:func:`swap_in`) that involves a directory moves the old one aside to ``.<name>.old`` and removes it
once the new one is in place; the reader (``trainer.checkpoint.reader``) loads the set-aside one after a
kill in between. Here, in the leaf, because the trainer's writer, the strategies' sharded save and
``ModelCheckpoint``'s link all replace checkpoints; the names are the format's
(``trainer.checkpoint.format``), which re-exports them. Standard library only.
"""

from __future__ import annotations

import os
import shutil
import stat
import zipfile
from pathlib import Path

from trainer.common.errors import CheckpointError

__all__ = [
    "PARTIAL",
    "SET_ASIDE",
    "SHARDED_MARKERS",
    "check_replaceable",
    "fsync_dir",
    "is_geartrain_checkpoint",
    "is_our_checkpoint_dir",
    "remove_checkpoint",
    "swap_in",
]

#: The files that mark a sharded checkpoint directory as ours (DCP's metadata, our trainer state).
SHARDED_MARKERS = (".metadata", "trainer.pt")
#: ``.<name>`` + this: a sharded directory being written, renamed to ``<name>`` once complete.
PARTIAL = ".partial"
#: ``.<name>`` + this: the checkpoint a replacement moved aside, removed once the new one is in place.
SET_ASIDE = ".old"


def is_our_checkpoint_dir(path: str | os.PathLike[str]) -> bool:
    """True for a real directory (not a link) that a geartrain sharded save wrote: it holds both markers."""
    path = Path(path)
    return path.is_dir() and not path.is_symlink() and all((path / m).is_file() for m in SHARDED_MARKERS)


def is_geartrain_checkpoint(path: str | os.PathLike[str], run_id: str | None = None) -> bool:
    """True for a checkpoint geartrain wrote: a sharded directory of ours, or a ``torch.save`` file whose
    content opens with geartrain's format key (every file we write puts ``"format": "geartrain"`` first).
    With ``run_id``, a file must also name that run among its first keys (``"run_id"``, third): a
    checkpoint of another run is then not this run's to delete. (A sharded directory is told by its
    markers alone.)

    A file named by a checkpoint's bookkeeping is deleted only when this holds: a user's file (their
    notes, their own or Lightning's checkpoint) is never ours to delete, whatever the bookkeeping says.
    Reads the first bytes of the archive's pickle only, never the tensors.
    """
    path = Path(path)
    if path.is_symlink():
        return False
    if path.is_dir():
        return is_our_checkpoint_dir(path)
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(pickles) != 1:
                return False
            with archive.open(pickles[0]) as data:
                head = data.read(256)
    except (OSError, zipfile.BadZipFile, ValueError):
        return False
    return b"format" in head and b"geartrain" in head and (run_id is None or run_id.encode() in head)


def check_replaceable(path: str | os.PathLike[str]) -> None:
    """Raise :class:`CheckpointError` unless ``path`` is absent, a file, a link, or a checkpoint folder of ours.

    A link is replaced as a link (the file or folder it names is left alone).
    """
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        raise CheckpointError(f"Cannot write the checkpoint {path}: {os.strerror(err.errno or 0)}") from err
    if stat.S_ISLNK(mode):
        return
    if stat.S_ISDIR(mode):
        if is_our_checkpoint_dir(path):
            return
        raise CheckpointError(
            f"Refusing to replace {_shown(path)}: it is a folder, not a geartrain checkpoint (no .metadata and "
            "trainer.pt). geartrain replaces only checkpoints it wrote; give a path inside it, e.g. "
            f"{path / 'last.ckpt'}, or another name"
        )
    if stat.S_ISREG(mode):  # a file is replaced whole, as torch.save and Lightning replace one
        return
    raise CheckpointError(
        f"Refusing to replace {_shown(path)}: it is not a file or a checkpoint folder (a FIFO, a socket or a "
        "device); give another name"
    )


def _shown(path: Path) -> str:
    """``path`` as the user gave it, with the absolute folder where that says little (``.``, ``..``)."""
    return f"{path} ({path.resolve()})" if path.name in ("", ".", "..") else str(path)


def remove_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Delete the checkpoint at ``path`` (a file, a link, or a sharded directory of ours); False if left alone.

    Anything else at ``path`` is not geartrain's to delete and stays.
    """
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
    ``new`` is in place and the folder is synced, so a kill in between leaves a loadable checkpoint.
    """
    new, path = Path(new), Path(path)
    check_replaceable(path)
    if not _real_dir(path) and not _real_dir(new):
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


def _real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make renames in ``directory`` durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
