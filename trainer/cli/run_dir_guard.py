"""A run directory held from before Hydra writes into it, and cleaned up only of what this run created.

Hydra writes ``.hydra/config.yaml``, ``overrides.yaml`` and the job's log into the run directory
before the task starts. So the ``geartrain`` command takes the folder's lock first (here, before
Hydra runs): a second run given a live run's ``hydra.run.dir`` is refused before it writes a byte.

A run that fails before it wrote anything of its own (a config mistake, a missing file) leaves the
folder as it found it. What it removes is what it recorded creating: the folder and lock file when
they were not there before, the files Hydra wrote as the job started (recorded by the job, see
:meth:`RunDirGuard.record_hydra_files`), never a file by its name or pattern, never a file that was
there before the run, and never once the lock is no longer this process's (its file replaced).
However the run ends, its lock file goes with it, removed while still held (:func:`~trainer.cli.run_dirs.release_lock`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from trainer.cli.run_dirs import LOCK_FILE as LOCK_NAME
from trainer.cli.run_dirs import open_lock, release_lock, same_file, unwritable

__all__ = ["RunDirGuard", "current_guard", "guarded_run_dir", "hydra_written_files", "job_held"]

_CURRENT: list[RunDirGuard] = []


def current_guard() -> RunDirGuard | None:
    """The guard this process holds (the ``geartrain`` command's run or sweep folder), if any."""
    return _CURRENT[-1] if _CURRENT else None


#: A folder holding more than this many paths is not listed: a run there removes nothing after a failure.
_MAX_LISTED = 20_000


def _listing(folder: Path) -> set[Path] | None:
    """Every path under ``folder`` (links not followed); None for a folder too big to list at every start."""
    found: set[Path] = set()
    for root, dirs, files in os.walk(folder):
        found.update(Path(root, name) for name in (*dirs, *files))
        if len(found) > _MAX_LISTED:
            return None
    return found


class RunDirGuard:
    """The lock of one run (or sweep) folder, and the record of what this run created in it."""

    def __init__(self, folder: Path, handle: IO[str], created: list[Path], before: set[Path] | None) -> None:
        self.folder = folder
        self._handle = handle
        self._created = created  # folders (and the lock file) this run made, parents first
        self._before = before  # what the folder held when the lock was taken (None: too much to list)
        self._hydra: set[Path] = set()
        self.wrote = False  # set once a job finished or wrote files of its own: nothing is removed then

    def record_hydra_files(self, written: list[Path]) -> None:
        """Called as a job starts with the files Hydra wrote for it: those not there before are this run's."""
        if self._before is None:
            return
        root = Path(os.path.abspath(self.folder))
        for path in (Path(os.path.abspath(p)) for p in written):
            if path in self._before or not os.path.lexists(path) or root not in path.parents:
                continue
            self._hydra.add(path)
            for parent in path.parents:  # .hydra/, a sweep job's folder: made for these files
                if parent == root or parent in self._before:
                    break
                self._hydra.add(parent)

    def holds_lock(self) -> bool:
        """Whether the lock file is still the one this process locked (not removed or replaced meanwhile)."""
        return same_file(self.folder / LOCK_NAME, self._handle)

    def clean_up(self) -> None:
        """Remove what this run created, if it wrote nothing of its own and still holds the lock."""
        now = _listing(self.folder)
        if self.wrote or self._before is None or now is None or not self.holds_lock():
            return
        new = now - self._before
        own = {p for p in new - self._hydra if not p.is_dir() or p.is_symlink()} - set(self._created)
        if own:  # files the run wrote itself: a record of what it did, kept
            return
        for path in sorted(new - set(self._created), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                if path.is_dir() and not path.is_symlink():
                    path.rmdir()  # only when empty: anything else in it was not recorded
                else:
                    path.unlink()
        for path in reversed(self._created):
            with contextlib.suppress(OSError):
                path.rmdir() if path.is_dir() else path.unlink()


@contextlib.contextmanager
def guarded_run_dir(folder: Path, claimed: bool = False) -> Iterator[RunDirGuard | None]:
    """Hold ``folder``'s lock for the ``with`` block, recording what is created; clean up after a failure.

    ``claimed``: the folder was just created for this run (:func:`trainer.cli.run_dirs.claim_run_dir`).
    Refuses, naming the other run, when a live run holds the folder; nothing is written or removed then.
    """
    try:
        import fcntl  # noqa: F401 - POSIX only
    except ImportError:  # not POSIX: no advisory locks; the unique names still keep runs apart
        yield None
        return
    folder = Path(os.path.abspath(folder))
    created: list[Path] = []
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    lock = folder / LOCK_NAME
    try:
        folder.mkdir(parents=True, exist_ok=True)
        created += [p for p in reversed(missing) if p.is_dir()]
        if claimed and folder not in created and not any(folder.iterdir()):
            created.append(folder)
        had_lock = os.path.lexists(lock)
        handle = open_lock(lock)
    except OSError as err:
        for path in reversed(created):
            with contextlib.suppress(OSError):
                path.rmdir()
        raise unwritable(folder, err) from err
    try:
        if not had_lock:
            created.append(lock)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
        handle.flush()
        before = _listing(folder)
        guard = RunDirGuard(folder, handle, created, None if before is None else before - set(created))
        _CURRENT.append(guard)
        try:
            yield guard
        except BaseException:
            guard.clean_up()
            raise
        finally:
            _CURRENT.remove(guard)
    finally:
        release_lock(lock, handle)  # the lock file goes with the run; nothing is left behind in the folder


def hydra_written_files() -> list[Path]:
    """The files Hydra wrote for the job now starting: its ``.hydra/`` configs, its log, a sweep's ``multirun.yaml``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    written = [out / f"{hc.job.name}.log"]
    handler = (hc.job_logging or {}).get("handlers", {}).get("file", {})
    if handler and handler.get("filename"):
        written.append(Path(str(handler.get("filename"))))
    if hc.output_subdir is not None:
        written += [out / hc.output_subdir / name for name in ("config.yaml", "hydra.yaml", "overrides.yaml")]
    if hc.mode == RunMode.MULTIRUN:
        written.append(Path(hc.sweep.dir) / "multirun.yaml")
    return written


@contextlib.contextmanager
def job_held(run_dir: Path, shared: bool) -> Iterator[None]:
    """Around a Hydra job: record the files Hydra wrote for it with the command's guard.

    Without one (a folder the command could not name in advance, an interpolated ``hydra.run.dir``)
    the job's folder is held here; ``shared``: a rank other than 0 of a group, whose rank 0 holds it.
    """
    guard = current_guard()
    if guard is not None:
        guard.record_hydra_files(hydra_written_files())
        yield
        guard.wrote = True  # a finished job's files are its record: a later job's failure keeps them
    elif shared:
        yield
    else:
        with guarded_run_dir(run_dir):
            yield
