"""The checkpoint format, in one place: the keys, the versions, Lightning's layout, the names on disk.

A geartrain checkpoint (``format="geartrain"``, format version 2) is laid out as Lightning 2.6 lays
out its own (``state_dict``, ``optimizer_states``, ``hyper_parameters``, ``epoch``, ``loops``, ...;
the table is docs/checkpoints.md's "Lightning's keys"), plus geartrain's entries (``format``,
``version``, ``progress``, ``rng``, ...), so that Lightning's ``load_from_checkpoint`` and
``Trainer.fit(ckpt_path=...)`` read it. ``progress`` is what geartrain resumes from; ``loops``
(:func:`lightning_loops`) repeats its counters for Lightning. Version 1 files are read by renaming
their entries (:func:`upgrade`), a Lightning 2.x file as geartrain's dict (:func:`lightning_resume_state`).

On disk (the names the writer makes and the reader and resolver follow):

- a checkpoint is a file ``<name>`` (``torch.save``, a zip archive), or a sharded directory
  ``<name>/`` holding :data:`SHARDED_MARKERS` (DCP's ``.metadata`` and our :data:`TRAINER_STATE`);
- a file is written as ``.<name>.<random>.tmp`` and renamed over ``<name>``; a directory is written as
  ``.<name>.partial`` (:data:`PARTIAL`) and renamed into place;
- a directory (or a file over a directory) being replaced is first moved aside to ``.<name>.old``
  (:data:`SET_ASIDE`) and removed once the new one is in place: after a kill between the two
  renames, ``.<name>.old`` is the checkpoint that was there, and the reader loads it;
- ``save_last="link"`` makes ``last.ckpt`` a relative symbolic link to the newest file; ``last.ckpt``
  next to a top-k file is a hard link where the filesystem allows (never written into afterwards).
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer.common.errors import CheckpointError

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "LIGHTNING_LAYOUT_VERSION",
    "METADATA",
    "PARTIAL",
    "SET_ASIDE",
    "SHARDED_MARKERS",
    "TRAINER_STATE",
    "check_version",
    "is_geartrain_checkpoint",
    "is_lightning_checkpoint",
    "is_our_checkpoint_dir",
    "lightning_loops",
    "lightning_resume_state",
    "merge_loops",
    "upgrade",
]

#: A sharded checkpoint directory holds DCP's metadata and our trainer state (everything but the model and
#: optimizer tensors): the two mark it as ours.
METADATA = ".metadata"
TRAINER_STATE = "trainer.pt"
SHARDED_MARKERS = (METADATA, TRAINER_STATE)
#: ``.<name>`` + this: a sharded directory being written, renamed to ``<name>`` once complete.
PARTIAL = ".partial"
#: ``.<name>`` + this: the checkpoint a replacement moved aside, removed once the new one is in place.
SET_ASIDE = ".old"

FORMAT_NAME = "geartrain"
#: 2: Lightning's keys (``optimizer_states``, ``hyper_parameters``, ``epoch``, ...); version 1 files
#: are read by renaming their entries (:func:`upgrade`).
FORMAT_VERSION = 2


#: Written as ``pytorch-lightning_version``: the Lightning release whose checkpoint layout geartrain's
#: files follow (Lightning runs no migration on it, and reads callback states by ``state_key``).
LIGHTNING_LAYOUT_VERSION = "2.6.6"

#: Version 1 names of entries that mean what Lightning's names mean.
_RENAMED = {
    "optimizers": "optimizer_states",
    "hparams": "hyper_parameters",
    "datamodule_hparams": "datamodule_hyper_parameters",
}


def upgrade(state: dict[str, Any]) -> dict[str, Any]:
    """A geartrain checkpoint of any format version in the current layout (renamed in place, returned).

    Version 1 wrote ``optimizers``, ``hparams`` and ``datamodule_hparams``; they are Lightning's
    ``optimizer_states``, ``hyper_parameters`` and ``datamodule_hyper_parameters``. ``epoch`` and ``global_step`` are added from ``progress`` where missing.
    """
    if int(state.get("version", 2)) < 2:
        for old, new in _RENAMED.items():
            if old in state and new not in state:
                state[new] = state.pop(old)
    progress = state.get("progress")
    if isinstance(progress, Mapping):
        epoch, step = progress.get("epoch", 0), progress.get("global_step", 0)
        if isinstance(epoch, int) and isinstance(step, int):  # values of a wrong type: the resume checks name them
            state.setdefault("epoch", epoch + (1 if progress.get("epoch_finished") is True else 0))
            state.setdefault("global_step", step)
    return state


def _tracked(total: int, current: int = 0, names: tuple[str, ...] = ("ready", "completed")) -> dict[str, Any]:
    """A Lightning progress entry: each counter of ``names`` at ``total`` in the run, ``current`` in the epoch."""
    return {"total": dict.fromkeys(names, total), "current": dict.fromkeys(names, current)}


def _batch_progress(total: int = 0, current: int = 0, is_last: bool | None = False) -> dict[str, Any]:
    """A loop's ``batch_progress``, without ``is_last_batch`` where Lightning's has none (``None``: predict)."""
    entry = _tracked(total, current, ("ready", "completed", "started", "processed"))
    if is_last is not None:
        entry["is_last_batch"] = is_last
    return entry


def lightning_loops(progress: Mapping[str, Any], automatic_optimization: bool) -> dict[str, Any]:
    """Lightning's ``loops`` entry for a run that stands at ``progress`` (``Progress.state_dict()``).

    Lightning resumes from these counters as from its own file saved at the same point: after a
    finished epoch ``e`` it starts epoch ``e + 1``; in the middle of epoch ``e`` after ``b`` batches,
    it continues that epoch at batch ``b``. Counters geartrain does not keep (per-epoch optimizer
    steps, scheduler steps, validation batches) are written as 0; Lightning restores nothing from them.
    """
    epoch = int(progress.get("epoch", 0))
    step = int(progress.get("global_step", 0))
    finished = bool(progress.get("epoch_finished", False))
    batches = 0 if finished else int(progress.get("batch_in_epoch", 0))
    total_batches = int(progress.get("batches_before_epoch", 0)) + batches
    in_epoch = int(progress.get("batch_in_epoch", 0))
    # Epochs started and epochs whose training is done: equal when no epoch is under way.
    started = epoch + 1 if finished or batches else epoch
    done = epoch + 1 if finished else epoch
    steps, no_steps = _tracked(step), _tracked(0)
    zero_grad = _tracked(step if automatic_optimization else 0, names=("ready", "completed", "started"))
    fit_loop: dict[str, Any] = {
        "state_dict": {},
        "epoch_loop.state_dict": {"_batches_that_stepped": step},
        "epoch_loop.batch_progress": _batch_progress(total_batches, in_epoch, finished),
        "epoch_loop.scheduler_progress": no_steps,
        "epoch_loop.automatic_optimization.state_dict": {},
        "epoch_loop.automatic_optimization.optim_progress": {
            "optimizer": {"step": steps if automatic_optimization else no_steps, "zero_grad": zero_grad}
        },
        "epoch_loop.manual_optimization.state_dict": {},
        "epoch_loop.manual_optimization.optim_step_progress": no_steps if automatic_optimization else steps,
        "epoch_loop.val_loop.state_dict": {},
        "epoch_loop.val_loop.batch_progress": _batch_progress(),
        "epoch_progress": {
            key: {**dict.fromkeys(("ready", "started"), started), **dict.fromkeys(("completed", "processed"), done)}
            for key in ("total", "current")
        },
    }
    return {
        "fit_loop": fit_loop,
        **{loop: {"state_dict": {}, "batch_progress": _batch_progress()} for loop in ("validate_loop", "test_loop")},
        "predict_loop": {"state_dict": {}, "batch_progress": _batch_progress(is_last=None)},
    }


def merge_loops(loops: dict[str, Any], extra: Mapping[str, Any]) -> None:
    """Put geartrain's resume entries ``extra`` into a checkpoint's ``loops``: the stateful training
    loaders' states (``combined_loader``) into ``fit_loop``'s ``state_dict``, where Lightning reads
    them (:mod:`trainer.data.stateful`), the others beside Lightning's loops."""
    for key, value in extra.items():
        if key == "combined_loader":
            loops["fit_loop"]["state_dict"] = {**loops["fit_loop"]["state_dict"], key: value}
        else:
            loops[key] = value


def check_version(path: Path, version: Any) -> None:
    """Refuse a checkpoint whose format ``version`` is not one this geartrain reads, saying which way it is off."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CheckpointError(
            f"Checkpoint {path} has an invalid format version {version!r} (a whole number from 1 to "
            f"{FORMAT_VERSION} is expected): the file was not written by geartrain, or was edited"
        )
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"Checkpoint {path} has format version {version}, newer than this geartrain reads "
            f"({FORMAT_VERSION}); upgrade geartrain to load it."
        )


def is_lightning_checkpoint(state: Mapping[str, Any]) -> bool:
    """Whether ``state`` was written by Lightning (``pytorch-lightning_version``, or its keys without ours)."""
    if state.get("format") == FORMAT_NAME:
        return False
    return "pytorch-lightning_version" in state or ("state_dict" in state and "global_step" in state)


def lightning_resume_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A Lightning checkpoint as geartrain's checkpoint dict: weights, optimizers, schedulers, progress.

    The epoch and the batch in it come from Lightning's loop state (``fit_loop.epoch_progress`` and
    ``epoch_loop.batch_progress``) when present, else from ``epoch``; a checkpoint written after
    an epoch finished resumes at the next epoch, as in Lightning.
    """
    fit_loop = (state.get("loops") or {}).get("fit_loop") or {}
    epochs, batch_meta = fit_loop.get("epoch_progress"), fit_loop.get("epoch_loop.batch_progress") or {}
    done, batches = _progress(epochs, "completed"), _progress(batch_meta, "completed") or 0
    global_step = int(state.get("global_step", 0))
    if done is None:
        progress = {"epoch": int(state.get("epoch", 0)), "global_step": global_step, "epoch_finished": True}
    else:
        # Lightning counts an epoch processed once its batches and validation are done, completed only
        # after its epoch-end hooks: a ModelCheckpoint save in on_train_epoch_end has processed = e + 1,
        # completed = e, and Lightning resumes it at epoch e + 1. A file that counts epochs completed
        # only has one under way when its last batch is not done.
        started, processed = _progress(epochs, "started"), _progress(epochs, "processed")
        if started is None or processed is None:
            processed = done
            started = done + (1 if batches and not batch_meta.get("is_last_batch", True) else 0)
        progress = {"epoch": processed, "global_step": global_step, "batch_in_epoch": batches}
        if processed >= started:  # no epoch under way: the last one processed is finished
            progress.update(epoch=max(processed - 1, 0), epoch_finished=processed > 0)
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "state_dict": dict(state["state_dict"]),
        "progress": progress,
        "epoch": int(state.get("epoch", 0)),
        "global_step": global_step,
        "hyper_parameters": dict(state.get("hyper_parameters") or {}),
        "optimizer_states": list(state.get("optimizer_states", [])),
        "lr_schedulers": list(state.get("lr_schedulers", [])),
        "from_lightning": True,
    }


def _progress(entry: Any, field: str) -> int | None:
    if not isinstance(entry, Mapping):
        return None
    current = entry.get("current")
    if isinstance(current, Mapping) and field in current:
        return int(current[field])
    return None


def is_our_checkpoint_dir(path: str | os.PathLike[str]) -> bool:
    """True for a real directory (not a link) that a geartrain sharded save wrote: it holds both markers."""
    path = Path(path)
    return path.is_dir() and not path.is_symlink() and all((path / m).is_file() for m in SHARDED_MARKERS)


def is_geartrain_checkpoint(path: str | os.PathLike[str], run_id: str | None = None) -> bool:
    """True for a checkpoint geartrain wrote: a sharded directory of ours, or a ``torch.save`` file whose
    pickle opens with geartrain's format key (every file we write puts ``"format": "geartrain"`` first)
    and, with ``run_id``, names that run among its first keys (``"run_id"``, third).

    A file named by a checkpoint's bookkeeping is deleted only when this holds: a user's file (their
    own or Lightning's checkpoint, another run's) is never ours to delete, whatever the bookkeeping
    says. Reads the first bytes of the archive's pickle only, never the tensors.
    """
    path = Path(path)
    if path.is_symlink() or path.is_dir():
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
