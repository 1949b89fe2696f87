"""Resuming: whether a checkpoint can resume this run, what a resume changes, where a stopped fit stood.

Torch accepts an optimizer state of another kind and fails later, from inside its own code
(``KeyError: 'step'`` at the first step when an SGD state went into AdamW), and a missing entry fails
as a bare ``KeyError``: :func:`check_resumable` raises one :class:`~trainer.common.errors.CheckpointError`
before anything is loaded, naming the file, what differs and what to do. After the restore, one
warning each says when a restored schedule ends before the resumed run does
(:func:`load_schedulers`), when the training batches cannot be the interrupted run's
(:func:`batch_geometry`, :func:`warn_if_batches_differ`) and when a saved callback state found no
callback (:func:`load_callback_states`, which restores them).

A stop inside an epoch (``max_steps``, ``max_time``, ``should_stop``, early stopping at a validation
in the middle of an epoch) still ends the epoch as Lightning does: its ``on_train_epoch_end`` hooks,
the epoch-interval schedulers, the monitoring callbacks. A checkpoint written then or after the fit
records instead the run as it stood after its last batch (:func:`capture`, :func:`apply`), so a resume
with a larger budget trains the rest of the epoch and ends as the uninterrupted run. Kept from the
stop: the counters, the schedulers, the optimizers' hyperparameters (an epoch scheduler sets their
learning rate), precision, every rank's random state, the sampler's order, the epoch's metric sums,
the data module, and the callbacks that decide the training (early stopping, timers). Weights, the
optimizers' other state and the checkpoint callbacks' own state (the files they wrote) do not change
after the last step and are read when a file is written. A stop inside an accumulation window drops
the window's gradients; the resume trains that window again from its first batch, and a warning says so.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import callback_states
from trainer.checkpoint.format import merge_loops
from trainer.common.errors import CheckpointError

if TYPE_CHECKING:
    from trainer.trainer import Trainer

__all__ = [
    "InexactResumeWarning",
    "ScheduleEndsEarlyWarning",
    "apply",
    "batch_geometry",
    "capture",
    "check_resumable",
    "load_callback_states",
    "load_schedulers",
    "types_of",
    "warn_if_batches_differ",
]

#: What a full resume reads besides the weights.
REQUIRED = ("optimizer_states", "lr_schedulers", "progress")
#: Param-group flags that torch adds to optimizers over its versions; they say nothing of the kind.
_GENERIC_GROUP_KEYS = {"params", "foreach", "maximize", "capturable", "differentiable", "fused", "initial_lr"}
_GENERIC_SCHEDULER_KEYS = {"base_lrs", "last_epoch", "verbose", "optimizer"}
#: Attributes that hold a schedule's length, by the schedulers that have one.
_LENGTH_ATTRS = ("T_max", "total_steps", "total_iters")


class ScheduleEndsEarlyWarning(UserWarning):
    """A restored learning-rate schedule ends before the resumed run does."""


class InexactResumeWarning(UserWarning):
    """A resume whose training batches differ from the interrupted run's (world size or batch size changed)."""


def types_of(objects: Sequence[Any]) -> list[str]:
    """Class names, as checkpoints record them (``["AdamW"]``)."""
    return [type(obj).__name__ for obj in objects]


def weights_only_hint(path: Path) -> str:
    """How to start afresh from a checkpoint's weights: a plain state dict initialises them only."""
    convert, file = "", str(path)
    if Path(path).is_dir():  # a sharded directory: torch.load cannot read a folder; one file first
        convert, file = (
            f"convert it to one file (python -m trainer.checkpoint.convert to-file {path} full.ckpt), ",
            "full.ckpt",
        )
    return (
        f"start afresh from its weights: {convert}save them with torch.save(torch.load('{file}', "
        "weights_only=True)['state_dict'], 'weights.pt') and pass ckpt_path='weights.pt'"
    )


def check_shapes(path: Path, state: Mapping[str, Any]) -> None:
    """Refuse entries of the wrong kind (a damaged or hand-edited file) with a message, not torch's TypeError.

    The progress counters must be whole numbers from 0 and its flags booleans; optimizer and
    scheduler states lists of dicts.
    """
    from dataclasses import fields

    from trainer.progress import Progress

    def refuse(what: str, value: Any, expected: str) -> CheckpointError:
        return CheckpointError(
            f"{path} holds {what}={value!r}, where {expected} is expected: the checkpoint is damaged or was "
            "edited; resume from another checkpoint"
        )

    for key in ("optimizer_states", "lr_schedulers"):
        entries = state.get(key, [])
        if not isinstance(entries, (list, tuple)) or not all(isinstance(e, Mapping) for e in entries):
            raise refuse(key, entries, "a list of state dicts")
    progress = state.get("progress", {})
    if not isinstance(progress, Mapping):
        raise refuse("progress", progress, "a dict of counters")
    for f in fields(Progress):
        value = progress.get(f.name, f.default)  # a missing entry is its default, which passes
        if f.type in (bool, "bool"):
            if not isinstance(value, bool):
                raise refuse(f"progress.{f.name}", value, "True or False")
        else:  # counters from 0; a counter whose default is -1 (validated_at: "none yet") from -1
            low = min(0, f.default) if isinstance(f.default, int) else 0
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise refuse(f"progress.{f.name}", value, f"a whole number from {low}")


def check_resumable(path: Path, state: Mapping[str, Any], trainer: Trainer) -> None:
    """Raise :class:`CheckpointError` unless ``state`` holds what resuming needs, of the kinds configured."""
    if "optimizer_states" not in state:
        raise CheckpointError(
            f"{path} holds weights only; it cannot resume training (to train from it, {weights_only_hint(path)})"
        )
    missing = [key for key in REQUIRED if key not in state]
    if missing:
        raise CheckpointError(
            f"{path} has no {', '.join(repr(k) for k in missing)} entry, which resuming needs (it holds: "
            f"{', '.join(sorted(map(str, state)))}); it was not written whole by Trainer.save_checkpoint"
        )
    check_shapes(path, state)
    _check_kinds(path, "optimizer", state["optimizer_states"], state.get("optimizer_types"), trainer.optimizers)
    schedulers = [cfg.scheduler for cfg in trainer.lr_scheduler_configs]
    _check_kinds(path, "scheduler", state["lr_schedulers"], state.get("lr_scheduler_types"), schedulers)


def _check_kinds(
    path: Path, what: str, saved: Sequence[Any], saved_types: Sequence[str] | None, current: Sequence[Any]
) -> None:
    now = types_of(current)
    if len(saved) != len(current):
        raise CheckpointError(
            f"{path} has {len(saved)} {what} state(s) ({', '.join(saved_types or []) or 'kinds not recorded'}), "
            f"the module configures {len(current)} ({', '.join(now) or 'none'}): resume with the {what}s "
            f"it was trained with, or {weights_only_hint(path)}"
        )
    for i, (state, obj) in enumerate(zip(saved, current)):
        was = saved_types[i] if saved_types is not None else None
        if was is None:  # a file that records no kinds (Lightning's, an older one): tell them apart by their keys
            keys = _signature(state, what)
            was = now[i] if keys == _signature(obj.state_dict(), what) else f"another kind ({', '.join(sorted(keys))})"
        if was != now[i]:
            raise CheckpointError(
                f"{path} was trained with the {what} {was}, this run configures {now[i]}: "
                f"resume with the {what} it was trained with, or {weights_only_hint(path)}"
            )


def _signature(state: Any, what: str) -> set[str]:
    """The keys that tell an optimizer's (a scheduler's) kind: its param-group options (its settings)."""
    if not isinstance(state, Mapping):
        return set()
    if what == "optimizer":
        groups = state.get("param_groups") or [{}]
        return {str(k) for k in groups[0]} - _GENERIC_GROUP_KEYS
    return {str(k) for k in state if not str(k).startswith("_")} - _GENERIC_SCHEDULER_KEYS


def schedule_length(scheduler: Any) -> tuple[str, int] | None:
    """The attribute holding ``scheduler``'s length and its value, for schedulers that end; else ``None``."""
    if isinstance(scheduler, torch.optim.lr_scheduler.CosineAnnealingWarmRestarts):
        return None  # restarts by design: it has no end to run past
    for attr in _LENGTH_ATTRS:
        value = getattr(scheduler, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return attr, value
    return None


def load_schedulers(path: Path, states: Sequence[Mapping[str, Any]], trainer: Trainer) -> None:
    """Load the schedulers' saved states, then warn for each that ends before this run (its name and length).

    A schedule whose length is the one the module made for this run (a run resumed as it was
    planned) behaves as it would have without the interruption, and is not reported.
    """
    for cfg, saved in zip(trainer.lr_scheduler_configs, states):
        planned = schedule_length(cfg.scheduler)
        cfg.scheduler.load_state_dict(saved)
        length = schedule_length(cfg.scheduler)
        if length is None or length == planned:
            continue
        attr, value = length
        run, unit = (
            (trainer.max_epochs, "epochs") if cfg.interval == "epoch" else (trainer.max_steps, "optimizer steps")
        )
        if run is None or run <= 0 or run <= value * cfg.frequency:  # None, -1: the run has no such limit
            continue
        name = type(cfg.scheduler).__name__
        if trainer.is_global_zero:
            warnings.warn(
                f"{name} restored from {path} has {attr}={value} ({unit}), but this run trains for {run} "
                f"{unit}: after {value} {unit} the learning rate runs past the schedule's end. To keep the "
                f"schedule, resume with the run length it was made for; to schedule the new length, "
                f"{weights_only_hint(path)}",
                ScheduleEndsEarlyWarning,
                stacklevel=2,
            )


def batch_geometry(trainer: Trainer) -> dict[str, Any] | None:
    """How the training loader forms batches: processes, per-process batch size, accumulation and kind.

    Kinds: ``"samples"`` (a sampler batched by the loader: resharded to any number of processes),
    ``"batch_sampler"`` (the user's batch sampler: each rank takes whole batches of it), ``"iterable"``
    (an ``IterableDataset``, sharded by the user's code). None for loaders of another sort.
    """
    from torch.utils.data import BatchSampler, IterableDataset

    loader = trainer.loaders.get("fit")
    dataset = getattr(loader, "dataset", None)
    batch_size: int | None
    if isinstance(dataset, IterableDataset):
        kind, batch_size = "iterable", getattr(loader, "batch_size", None)
    else:
        batches = getattr(loader, "batch_sampler", None)
        inner = getattr(batches, "batch_sampler", batches)  # inside the trainer's ResumableBatchSampler
        if inner is None:
            return None
        if type(inner) is BatchSampler:
            kind, batch_size = "samples", inner.batch_size
        else:
            kind, batch_size = "batch_sampler", None
    return {
        "kind": kind,
        "world_size": trainer.world_size,
        "batch_size": batch_size,
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
    }


def warn_if_batches_differ(path: Path, saved: Mapping[str, Any] | None, trainer: Trainer) -> None:
    """One line on rank 0 when this run cannot continue on the batches the interrupted run would have seen."""
    now = batch_geometry(trainer)
    if saved is None or now is None or not trainer.is_global_zero:
        return
    changes: list[str] = []
    was_world, world = int(saved["world_size"]), int(now["world_size"])
    if saved["kind"] != now["kind"]:
        changes.append(f"the training batches were formed by a {saved['kind']} loader, now by a {now['kind']} one")
    elif now["kind"] != "samples" and was_world != world:
        what = "its own batch sampler" if now["kind"] == "batch_sampler" else "an IterableDataset sharded by your code"
        changes.append(
            f"the training loader uses {what}, which cannot be resharded from {was_world} to {world} processes"
        )
    elif now["kind"] == "samples" and saved["batch_size"] * was_world != now["batch_size"] * world:
        was_global = saved["batch_size"] * was_world
        keep = (
            f"batch_size={was_global // world} keeps it"
            if was_global % world == 0
            else f"{was_global} is not divisible by {world} processes, so no batch_size keeps it"
        )
        changes.append(
            f"the global batch was {was_global} (batch_size {saved['batch_size']} x {was_world} processes), now "
            f"{now['batch_size'] * world} ({now['batch_size']} x {world}); {keep}"
        )
    if saved["accumulate_grad_batches"] != now["accumulate_grad_batches"]:
        changes.append(
            f"accumulate_grad_batches was {saved['accumulate_grad_batches']}, now {now['accumulate_grad_batches']}"
        )
    if changes:
        warnings.warn(
            f"Resuming {path} inexactly: {'; '.join(changes)}. From here the optimizer sees other batches "
            "than the uninterrupted run would (docs/data.md).",
            InexactResumeWarning,
            stacklevel=2,
        )


def load_callback_states(saved: Mapping[str, Any], trainer: Trainer) -> None:
    """Give each callback its saved state, then warn (rank 0, as Lightning) naming the states no callback took.

    A callback's state is under its ``state_key``, or a key an earlier geartrain gave it
    (``EarlyStopping``'s before it took Lightning's).
    """
    taken: set[str] = set()
    for cb in trainer.callbacks:
        keys = (cb.state_key, *getattr(cb, "earlier_state_keys", ()))
        taken.update(keys)
        key = next((k for k in keys if k in saved), None)
        if key is not None:
            cb.load_state_dict(saved[key])
    missing = [key for key, value in saved.items() if value and key not in taken]
    if missing and trainer.is_global_zero:
        warnings.warn(
            "Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided "
            f"during `Trainer` instantiation. Please add the following callbacks: {missing}.",
            UserWarning,
            stacklevel=3,
        )


def capture(trainer: Trainer, training: dict[str, Any]) -> dict[str, Any]:
    """The resume point of ``trainer`` now, given its ``training_state()`` (called by every rank at one batch)."""
    t = trainer
    progress = t.progress.state_dict()
    progress["should_stop"] = False  # a resume goes on: the stop was this run's
    if t.checkpointing.in_accumulation_window:
        k = max(int(t.accumulate_grad_batches), 1)
        progress["batch_in_epoch"] = (progress["batch_in_epoch"] // k) * k
        if t.is_global_zero:
            warnings.warn(
                f"Training stopped inside an accumulation window (batch {t.progress.batch_in_epoch} of epoch "
                f"{t.progress.epoch}, accumulate_grad_batches={k}): its gradients are dropped, and a resume "
                f"trains the window again from batch {progress['batch_in_epoch']}.",
                stacklevel=3,
            )
    training = {k: v for k, v in training.items() if k != "optimizer_states"}  # read when a file is written
    hyper = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] for opt in t.optimizers]
    watching_files = {id(cb) for cb in t.checkpoint_callbacks}
    point: dict[str, Any] = {
        **training,
        "progress": progress,
        "param_groups": hyper,
        "callbacks": callback_states(cb for cb in t.callbacks if id(cb) not in watching_files),
        "metrics": t.metric_router.state_dict(t.module, mid_epoch=True),
    }
    if t.datamodule is not None:
        point["datamodule"] = t.datamodule.state_dict()
    return copy.deepcopy(point)  # the epoch's end changes these objects in place


def apply(state: dict[str, Any], point: dict[str, Any]) -> None:
    """Put the resume ``point`` into a checkpoint's content ``state`` (its progress is already in)."""
    for key, value in point.items():
        if key == "callbacks":
            state["callbacks"] = {**state["callbacks"], **value}
        elif key == "loops":
            merge_loops(state["loops"], value)
        elif key == "param_groups":
            for opt_state, groups in zip(state["optimizer_states"], value):
                opt_state["param_groups"] = [
                    {**saved, "params": live["params"]} for saved, live in zip(groups, opt_state["param_groups"])
                ]
        elif key != "progress":
            state[key] = value
