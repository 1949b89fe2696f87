"""Run directories of the ``geartrain`` command: one per run, never shared, and ``ckpt_path=last`` within a run's own line.

Hydra names a run's folder after the second it started (``outputs/<date>/<time>``), so runs started
in the same second would share one: mixed checkpoints, two event files, one run's ``overrides.yaml``
next to another's ``last.ckpt``. Here the folder is claimed with ``mkdir``, which exactly one
process can win, and a suffix (``-2``, ``-3``, ...) is added until one is free. A run also holds an
advisory lock on its folder while it runs (``flock``: released by the operating system when the
process ends, kill -9 included), so two runs given the same ``hydra.run.dir`` cannot interleave.
The lock file is removed as the run ends (a run killed with kill -9 leaves it, unheld: harmless).

``ckpt_path=last`` looks for the newest ``last.ckpt`` of *the same job*: a run started with the
same overrides, but for the budget (``max_epochs``, ``max_steps``, ``max_time``), the task and
``ckpt_path``, so a run never continues another job's state (another strategy, another sweep job,
another experiment); ``ckpt_path=<a run folder>`` takes that run's newest complete checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from trainer.common.errors import ConfigError

__all__ = [
    "LOCK_FILE",
    "claim_run_dir",
    "held_folder",
    "in_use",
    "locked_run_dir",
    "open_lock",
    "release_lock",
    "resolve_last_checkpoint",
    "run_folder_checkpoint",
    "same_file",
    "same_line",
    "unique_run_dir_overrides",
    "unwritable",
]

#: The file in a run directory that the live run holds an ``flock`` on.
LOCK_FILE = ".geartrain.lock"

#: Override keys that never make two runs different jobs: how far to train, from where, and the task
#: (``task=test ckpt_path=last`` evaluates the job a ``task=fit`` run trained).
_RESUME_KEYS = ("ckpt_path", "task", "trainer.max_epochs", "trainer.max_steps", "trainer.max_time")


def claim_run_dir(base: Path) -> Path:
    """Create and return ``base``, or ``base-2``, ``base-3``, ... : the first that no other process created.

    ``os.mkdir`` succeeds for exactly one caller, across processes, so two runs started in the same
    second get different folders.
    """
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        for n in range(1, 10_000):
            candidate = base if n == 1 else base.with_name(f"{base.name}-{n}")
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
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
    """``hydra.run.dir=`` (or ``hydra.sweep.dir=`` with ``-m``) naming a freshly claimed folder.

    Returns ``[]`` when the user chose the folder (``hydra.run.dir=``/``hydra.sweep.dir=`` given) or
    asked Hydra for something that runs nothing (``--help``, ``--cfg``, ``--info``, ...).
    """
    args = list(argv)
    if any(a.startswith(("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "--shell-completion")) for a in args):
        return []
    sweep = any(a in ("-m", "--multirun") for a in args)
    key = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    if any(a.startswith((f"{key}=", f"+{key}=", f"++{key}=")) for a in args):
        return []
    stamp = time.localtime(now)
    root = "multirun" if sweep else "outputs"
    base = Path(root, time.strftime("%Y-%m-%d", stamp), time.strftime("%H-%M-%S", stamp))
    return [f"{key}={claim_run_dir(base).as_posix()}"]


def held_folder(argv: Sequence[str]) -> Path | None:
    """The folder a run on ``argv`` writes into (``hydra.run.dir``, or ``hydra.sweep.dir`` with ``-m``).

    None when the command runs nothing (``--help``, ``--cfg``, ...) or the value is interpolated
    (``${now:...}``), which only Hydra can resolve.
    """
    args = list(argv)
    if any(a.startswith(("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "--shell-completion")) for a in args):
        return None
    key = "hydra.sweep.dir" if any(a in ("-m", "--multirun") for a in args) else "hydra.run.dir"
    values = [a.partition("=")[2] for a in args if a.lstrip("+").startswith(f"{key}=")]
    if not values or not values[-1] or "${" in values[-1]:
        return None
    return Path(values[-1].strip("'\""))


def in_use(folder: Path, handle: IO[str]) -> ConfigError:
    """The error for a run folder whose lock a live run holds (``handle``, the lock file, is closed here)."""
    handle.seek(0)
    holder = handle.read().strip() or "another process"
    handle.close()
    return ConfigError(
        f"run directory {folder} is in use by another live run ({holder}). Give this run its own "
        "folder (leave hydra.run.dir unset, or set another), or wait for that run to end"
    )


def open_lock(lock: Path) -> tuple[IO[str] | None, IO[str]]:
    """Open and ``flock`` the lock file ``lock``: ``(handle, handle)`` when taken, ``(None, handle)`` when a live run holds it.

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
            return None, handle
        if same_file(lock, handle):
            return handle, handle
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


@contextlib.contextmanager
def locked_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock for the ``with`` block; refuse, naming the other run, if a live run holds it."""
    try:
        import fcntl  # noqa: F401 - POSIX only
    except ImportError:  # not POSIX: no advisory locks; the unique names still keep runs apart
        yield
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = run_dir / LOCK_FILE
    held, handle = open_lock(lock)
    if held is None:
        raise in_use(run_dir, handle)
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        yield
    finally:
        release_lock(lock, handle)


def _overrides(run_dir: Path) -> list[str] | None:
    """The task overrides a run was started with (``.hydra/overrides.yaml``); None if it kept none."""
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return None
    try:
        from omegaconf import OmegaConf

        loaded = OmegaConf.to_container(OmegaConf.load(path))
    except Exception:
        return None
    return [str(x) for x in loaded] if isinstance(loaded, list) else None


def _pairs(overrides: Sequence[str]) -> dict[str, str]:
    pairs = {}
    for item in overrides:
        if "=" not in item:
            continue  # not an override (a flag's value, such as --config-dir's folder)
        key, _, value = item.lstrip("+~").partition("=")
        pairs[key] = value
    return pairs


def same_line(mine: Sequence[str], theirs: Sequence[str], sweep: bool = False) -> bool:
    """Whether a run started with ``theirs`` is the same job as one started with ``mine``.

    Every override equal, except those that only say how far to train, from where, and the task
    (``ckpt_path``, ``task``, ``trainer.max_epochs``, ...): another strategy, device count, seed
    or learning rate is another job, whose state this run must never continue (in a sweep: job 1
    never takes job 0's). ``sweep`` is kept for callers; the rule is the same.
    """
    a, b = _pairs(mine), _pairs(theirs)

    def keep(key: str) -> bool:
        return key not in _RESUME_KEYS and not key.startswith("hydra.")

    return {k: v for k, v in a.items() if keep(k)} == {k: v for k, v in b.items() if keep(k)}


def resolve_last_checkpoint(base: Path, run_dir: Path, overrides: Sequence[str], sweep: bool) -> str:
    """The ``last.ckpt`` that ``ckpt_path=last`` means for a run in ``run_dir`` started with ``overrides``.

    This run's own, else the newest of earlier runs under ``base/outputs`` and ``base/multirun``
    that :func:`same_line` accepts. The choice is printed, so a resume never silently picks a file.
    """
    from trainer.common.fs_safety import is_complete_checkpoint, newest_complete_checkpoint

    own, notices = newest_complete_checkpoint(run_dir / "checkpoints")
    for notice in notices:
        print(f"ckpt_path=last: {notice}", file=sys.stdout)
    if own is not None:
        return str(own)
    if notices:  # this run saved checkpoints, none complete: never another run's in their place
        raise ConfigError(
            f"ckpt_path=last: {run_dir / 'checkpoints'} holds no complete checkpoint (see above). "
            "Give one: ckpt_path=path/to/file.ckpt"
        )
    found = [p for root in ("outputs", "multirun") for p in (base / root).glob("**/last.ckpt")]
    found = [p for p in found if p.parent.name == "checkpoints" and is_complete_checkpoint(p)]
    matching = [p for p in found if same_line(overrides, _overrides(p.parent.parent) or [], sweep)]
    if not matching:
        where = f"{base / 'outputs'} or {base / 'multirun'}"
        if found:
            other = max(found, key=lambda p: p.stat().st_mtime)
            kind = "the same overrides (other than the task, ckpt_path, max_epochs, max_steps, max_time)"
            raise ConfigError(
                f"ckpt_path=last: no last.ckpt of a run with {kind} under {where} ({len(found)} of other "
                f"runs, the newest {other}). To resume one of those, give it: ckpt_path={other}"
            )
        raise ConfigError(
            f"ckpt_path=last: no last.ckpt under {where}. "
            "Train first (a run saves checkpoints/last.ckpt), or give a file: ckpt_path=path/to/file.ckpt"
        )
    newest = max(matching, key=lambda p: p.stat().st_mtime)
    print(f"ckpt_path=last: using {newest}", file=sys.stdout)
    return str(newest)


def run_folder_checkpoint(run_dir: Path) -> str:
    """``ckpt_path=<a run folder>``: that run's ``checkpoints/last.ckpt``, else its newest complete checkpoint."""
    from trainer.common.fs_safety import newest_complete_checkpoint

    found, notices = newest_complete_checkpoint(run_dir / "checkpoints")
    for notice in notices:
        print(f"ckpt_path={run_dir}: {notice}", file=sys.stdout)
    if found is None:
        raise ConfigError(
            f"ckpt_path={run_dir}: the run folder's checkpoints/ holds no complete checkpoint. "
            "Give a checkpoint file: ckpt_path=path/to/file.ckpt"
        )
    print(f"ckpt_path={run_dir}: using {found}", file=sys.stdout)
    return str(found)
