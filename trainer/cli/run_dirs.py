"""Run directories of the ``geartrain`` command: one per run, never shared, locked while the run lives.

Hydra names a run's folder after the second it started (``outputs/<date>/<time>``), so runs started
in the same second would share one: mixed checkpoints, two event files, one run's ``overrides.yaml``
next to another's ``last.ckpt``. Here the folder is claimed with ``mkdir``, which exactly one
process can win, and a suffix (``-2``, ``-3``, ...) is added until one is free. A run also holds an
advisory lock on its folder while it runs (``flock``: released by the operating system when the
process ends, kill -9 included), so two runs given the same ``hydra.run.dir`` cannot interleave.
The lock file is removed as the run ends (a run killed with kill -9 leaves it, unheld: harmless).
``ckpt_path=last`` (the newest ``last.ckpt`` of the same job) is the resolver's (:mod:`trainer.checkpoint.resolve`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from trainer.common.errors import ConfigError

__all__ = [
    "LOCK_FILE",
    "claim_run_dir",
    "held_folder",
    "open_lock",
    "release_lock",
    "same_file",
    "unique_run_dir_overrides",
    "unwritable",
]

#: The file in a run directory that the live run holds an ``flock`` on.
LOCK_FILE = ".geartrain.lock"


def claim_run_dir(base: Path) -> Path:
    """Create and return ``base``, or ``base-2``, ``base-3``, ... : the first that no other process created."""
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        for n in range(1, 10_000):
            candidate = base if n == 1 else base.with_name(f"{base.name}-{n}")
            with contextlib.suppress(FileExistsError):  # another process's: try the next name
                candidate.mkdir()
                return candidate
    except OSError as err:
        raise unwritable(base, err) from err
    raise ConfigError(f"could not create a run directory next to {base}: 10000 names are taken")


def unwritable(folder: Path, err: OSError) -> ConfigError:
    """The message for a run directory that cannot be created or written (read-only disk, no permission)."""
    reason = os.strerror(err.errno) if err.errno else str(err)
    return ConfigError(
        f"cannot write the run directory {folder}: {reason} ({err.filename or folder}). Run geartrain from a "
        "folder you can write to, or give one: hydra.run.dir=/path/you/can/write (hydra.sweep.dir= with -m)"
    )


def unique_run_dir_overrides(argv: Sequence[str], now: float | None = None) -> list[str]:
    """The override of :func:`_folder_key` naming a freshly claimed folder; ``[]`` when the user gave it or
    the command runs nothing."""
    key = _folder_key(argv)
    if key is None or any(a.startswith((f"{key}=", f"+{key}=", f"++{key}=")) for a in argv):
        return []
    stamp = time.localtime(now)
    root = "multirun" if key == "hydra.sweep.dir" else "outputs"
    base = Path(root, time.strftime("%Y-%m-%d", stamp), time.strftime("%H-%M-%S", stamp))
    return [f"{key}={claim_run_dir(base).as_posix()}"]


def _folder_key(args: Sequence[str]) -> str | None:
    """The override naming a run's folder: ``hydra.run.dir``, ``hydra.sweep.dir`` with ``-m``; None when
    Hydra is asked for something that runs nothing (``--help``, ``--cfg``, ``--info``, ...)."""
    nothing = ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "--shell-completion")
    if any(a.startswith(nothing) for a in args):
        return None
    return "hydra.sweep.dir" if any(a in ("-m", "--multirun") for a in args) else "hydra.run.dir"


def held_folder(argv: Sequence[str]) -> Path | None:
    """The folder a run on ``argv`` writes into (the value of :func:`_folder_key`'s override); None when
    the command runs nothing or the value is interpolated (``${now:...}``), which only Hydra can resolve."""
    key = _folder_key(argv)
    values = [a.partition("=")[2] for a in argv if a.lstrip("+").startswith(f"{key}=")]
    if key is None or not values or not values[-1] or "${" in values[-1]:
        return None
    return Path(values[-1].strip("'\""))


def open_lock(lock: Path) -> IO[str]:
    """Open and ``flock`` ``lock`` (in a run folder): refused, naming the holder, when a live run holds it.

    A run removes its lock file as it ends, while still holding it. A process that opened the file
    just before that would lock a file no longer in the folder, so the lock counts only when the
    path still names the locked file; otherwise the new file is opened and locked.
    """
    import fcntl

    while True:
        handle: IO[str] = open(lock, "a+")  # noqa: SIM115 - held for the whole run
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ConfigError(
                f"run directory {lock.parent} is in use by another live run ({holder}). Give this run its own "
                "folder (leave hydra.run.dir unset, or set another), or wait for that run to end"
            ) from None
        if same_file(lock, handle):
            return handle
        handle.close()  # the run that held it removed it as it ended: lock the folder's new file


def same_file(lock: Path, handle: IO[str]) -> bool:
    """Whether ``lock`` still names the file ``handle`` has open (not removed or replaced meanwhile)."""
    try:
        return os.stat(lock).st_ino == os.fstat(handle.fileno()).st_ino
    except OSError:
        return False


def release_lock(lock: Path, handle: IO[str]) -> None:
    """Remove the lock file while still holding it (if it is still this run's), then release it."""
    if same_file(lock, handle):
        with contextlib.suppress(OSError):
            lock.unlink()
    handle.close()
