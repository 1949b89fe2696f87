"""The one resolver: which checkpoint ``ckpt_path="last"`` means, for the ``Trainer`` and the ``geartrain`` command.

The ``Trainer``'s (:func:`resolve_ckpt_path`, Lightning's meaning, and ``"best"``) looks in its checkpoint
folder; the command's (:func:`resolve_last_checkpoint`) also in the same job's earlier runs
(:func:`same_line`), so a run never continues another job's state.
"""

from __future__ import annotations

import os
import re
import warnings
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from callbacks.checkpoint import ModelCheckpoint
from trainer.checkpoint.format import SET_ASIDE, SHARDED_MARKERS
from trainer.checkpoint.reader import fetch_url, is_url
from trainer.common.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from trainer.trainer import Trainer

__all__ = [
    "BestCheckpointMissing",
    "is_complete_checkpoint",
    "last_files",
    "last_of_folder",
    "newest_complete_checkpoint",
    "resolve_ckpt_path",
    "resolve_last_checkpoint",
    "run_folder_checkpoint",
    "same_line",
]

#: Override keys that never make two runs different jobs: how far to train, from where, and the task
#: (``task=test ckpt_path=last`` evaluates the job a ``task=fit`` run trained).
_RESUME_KEYS = ("ckpt_path", "task", "trainer.max_epochs", "trainer.max_steps", "trainer.max_time")


def is_complete_checkpoint(path: str | os.PathLike[str]) -> bool:
    """A torch checkpoint file (a zip archive, as every ``torch.save`` writes), or a sharded directory with
    both markers (followed through links)."""
    path = Path(path)
    if path.is_dir():
        return all((path / m).is_file() for m in SHARDED_MARKERS)
    return path.is_file() and zipfile.is_zipfile(path)  # an unreadable file is no zip archive (False)


def newest_complete_checkpoint(folder: str | os.PathLike[str], say: str | None) -> Path | None:
    """``folder/last.ckpt`` when it is complete; else the newest complete checkpoint in ``folder`` (None: none).

    What was recovered or skipped is printed after ``say`` (None: not printed), a line each: ``last.ckpt``
    missing after a kill between a save's two renames (its ``.last.ckpt.old`` is the checkpoint that was
    there), a link to a deleted checkpoint, a directory that was never completed.
    """
    folder = Path(folder)
    wanted = folder / "last.ckpt"
    if is_complete_checkpoint(wanted):
        return wanted
    notices: list[str] = []
    if wanted.is_symlink():
        notices.append(f"{wanted} links to {os.readlink(wanted)}, which is gone")
    elif wanted.is_dir():
        notices.append(f"{wanted} is a directory that was never completed (no .metadata or trainer.pt); skipped")
    elif wanted.exists():
        notices.append(f"{wanted} is not a complete checkpoint; skipped")
    aside = folder / f".{wanted.name}{SET_ASIDE}"
    found: Path | None = None
    if not os.path.lexists(wanted) and is_complete_checkpoint(aside):
        notices.append(f"{wanted} was being replaced when the run stopped; using the previous one, {aside}")
        found = aside
    else:
        # glob: no entries for a folder that is missing or cannot be read.
        entries = [p for p in folder.glob("*.ckpt") if not p.name.startswith(".") and p != wanted]
        complete = [p for p in entries if is_complete_checkpoint(p)]
        if complete:
            found = max(complete, key=lambda p: p.stat().st_mtime)
            notices.append(f"using the newest complete checkpoint of this run instead: {found}")
    if say is not None:
        for notice in notices:
            print(f"{say}: {notice}")
    return found


class BestCheckpointMissing(CheckpointError, ValueError):
    """``ckpt_path="best"`` with no best checkpoint: a ``ValueError`` as Lightning's, a ``CheckpointError`` as before."""


def resolve_ckpt_path(trainer: Trainer, ckpt_path: str | os.PathLike[str], stage: str | None = None) -> Path | None:
    """A path as given, or the file ``"last"``/``"best"`` stands for in ``trainer``'s run.

    ``"last"`` before any checkpoint exists is None: as in Lightning, no checkpoint is loaded and
    training starts from scratch, so a job script can pass ``ckpt_path="last"`` on every start
    (set and forget, for preemptible jobs). With ``stage`` (the running ``fit``, ``validate``,
    ...) that is said in a warning, in Lightning's words. ``"best"`` before any is an error.
    """
    if str(ckpt_path) not in ("last", "best"):
        return fetch_url(str(ckpt_path)) if is_url(ckpt_path) else Path(ckpt_path)
    # The first checkpoint callback (``Trainer.checkpoint_callback``): what has a ``best_model_path``.
    cb = next((c for c in trainer.callbacks if hasattr(c, "best_model_path")), None)
    if str(ckpt_path) == "best":
        found = getattr(cb, "best_model_path", None)
        if not found:
            call = f'`.{stage}(ckpt_path="best")` is set but ' if stage else ""
            raise BestCheckpointMissing(
                f"ckpt_path='best': no such checkpoint has been saved yet ({call}`ModelCheckpoint` is "
                "not configured to save the best model, or has saved none so far: it needs a logged `monitor` "
                "and save_top_k != 0)"
            )
        return Path(found)
    found = last_of_folder(trainer, cb) if cb is not None else None
    if not found and stage is not None and trainer.is_global_zero:
        fresh = " Training starts from scratch." if stage == "fit" else ""
        warnings.warn(
            f'.{stage}(ckpt_path="last") is set, but there is no last checkpoint available. No checkpoint '
            f"will be loaded.{fresh} HINT: Set `ModelCheckpoint(..., save_last=True)`.",
            stacklevel=2,
        )
    return Path(found) if found else None


def last_files(folder: str | os.PathLike[str] | None, name: str = "last", extension: str = ".ckpt") -> set[str]:
    """The last files ``ckpt_path="last"`` may mean in ``folder``: ``last.ckpt``, ``last-v1.ckpt``, ...

    ``name`` and ``extension`` are the checkpoint callback's (Lightning's ``CHECKPOINT_NAME_LAST`` and
    ``FILE_EXTENSION``); ``ModelCheckpoint._find_last_checkpoints`` (Lightning's method) answers with this.
    """
    path = Path(folder or "")
    if not folder or not path.is_dir():
        return set()
    pattern = re.compile(rf"^{re.escape(name)}(-v?\d+)?{re.escape(extension)}$")
    return {str(p) for p in path.iterdir() if pattern.match(p.name)}


def last_of_folder(trainer: Trainer, callback: Any) -> str | None:
    """``"last"`` for a ``Trainer``: the callback's newest complete last file, else what a kill left in its folder.

    ``callback`` is the trainer's checkpoint callback: its ``last_model_path`` once it saved, else its
    folder's last files (:func:`last_files`; a subclass that overrides Lightning's
    ``_find_last_checkpoints`` is asked instead). Notices about a recovered file are printed on rank 0.
    """
    found = getattr(callback, "last_model_path", None)
    if not found or not is_complete_checkpoint(found):
        find = getattr(type(callback), "_find_last_checkpoints", None)
        if find is ModelCheckpoint._find_last_checkpoints:  # its answer, without a call back into callbacks/
            names = last_files(callback.dirpath, callback.CHECKPOINT_NAME_LAST, callback.FILE_EXTENSION)
        else:
            names = set(callback._find_last_checkpoints(trainer)) if find is not None else set()
        files = [Path(p) for p in names if is_complete_checkpoint(p)]
        found = str(max(files, key=lambda p: p.stat().st_mtime)) if files else None
    folder = Path(callback.dirpath) if getattr(callback, "dirpath", None) else trainer.checkpointing.default_directory()
    left = any(os.path.lexists(folder / name) for name in ("last.ckpt", f".last.ckpt{SET_ASIDE}"))
    if not found and left:
        # What a kill left: last.ckpt's set-aside .old, or the newest complete checkpoint when
        # last.ckpt is a link to an evicted one or a directory never completed. With no last file
        # at all (save_last=False), "last" means none, as in Lightning: not the newest top-k file.
        newest = newest_complete_checkpoint(folder, "ckpt_path='last'" if trainer.is_global_zero else None)
        found = str(newest) if newest is not None else None
    return found


def _overrides(run_dir: Path) -> list[str]:
    """The task overrides a run was started with (Hydra's ``.hydra/overrides.yaml``, a list); none if it kept none."""
    try:
        loaded = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return []
    return [str(x) for x in loaded] if isinstance(loaded, list) else []


def same_line(mine: Sequence[str], theirs: Sequence[str]) -> bool:
    """Whether a run started with ``theirs`` is the same job as one started with ``mine``: every override but
    ``_RESUME_KEYS`` and ``hydra.*`` equal. Another strategy, device count, seed or learning rate is another job,
    whose state this run must never continue (in a sweep: job 1 never takes job 0's)."""

    def job(overrides: Sequence[str]) -> dict[str, str]:
        pairs = (item.lstrip("+~").partition("=") for item in overrides if "=" in item)  # not a flag's value
        return {key: value for key, _, value in pairs if key not in _RESUME_KEYS and not key.startswith("hydra.")}

    return job(mine) == job(theirs)


def resolve_last_checkpoint(base: Path, run_dir: Path, overrides: Sequence[str]) -> str:
    """The ``last.ckpt`` that ``ckpt_path=last`` means for a run in ``run_dir`` started with ``overrides``.

    This run's own, else the newest of earlier runs under ``base/outputs`` and ``base/multirun``
    that :func:`same_line` accepts (a sweep's job or a single run alike). The choice is printed, so a
    resume never silently picks a file.
    """
    own = newest_complete_checkpoint(run_dir / "checkpoints", "ckpt_path=last")
    if own is not None:
        return str(own)
    if os.path.lexists(run_dir / "checkpoints" / "last.ckpt"):  # this run's, incomplete: never another run's instead
        raise ConfigError(
            f"ckpt_path=last: {run_dir / 'checkpoints'} holds no complete checkpoint (see above). "
            "Give one: ckpt_path=path/to/file.ckpt"
        )
    found = [p for root in ("outputs", "multirun") for p in (base / root).glob("**/last.ckpt")]
    found = [p for p in found if p.parent.name == "checkpoints" and is_complete_checkpoint(p)]
    matching = [p for p in found if same_line(overrides, _overrides(p.parent.parent))]
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
    print(f"ckpt_path=last: using {newest}")
    return str(newest)


def run_folder_checkpoint(run_dir: Path) -> str:
    """``ckpt_path=<a run folder>``: that run's ``checkpoints/last.ckpt``, else its newest complete checkpoint."""
    found = newest_complete_checkpoint(run_dir / "checkpoints", f"ckpt_path={run_dir}")
    if found is None:
        raise ConfigError(
            f"ckpt_path={run_dir}: the run folder's checkpoints/ holds no complete checkpoint. "
            "Give a checkpoint file: ckpt_path=path/to/file.ckpt"
        )
    print(f"ckpt_path={run_dir}: using {found}")
    return str(found)
