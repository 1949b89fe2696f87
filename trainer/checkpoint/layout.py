"""Lightning's keys in geartrain's checkpoints, and reading the files of older geartrain versions.

A geartrain checkpoint (format version 2) is laid out as Lightning 2.6 lays out its own, plus
geartrain's entries, so that Lightning's ``LightningModule.load_from_checkpoint`` and
``Trainer.fit(ckpt_path=...)`` read it and tools reading ``ckpt["epoch"]`` work:

============================== ==========================================================
``state_dict``                 the model's weights (one copy, read by both)
``optimizer_states``           one ``optimizer.state_dict()`` per optimizer
``lr_schedulers``              one ``scheduler.state_dict()`` per scheduler
``hyper_parameters``           ``save_hyperparameters()``'s plain values
``epoch``, ``global_step``     ``trainer.current_epoch`` and ``trainer.global_step`` at the save
``pytorch-lightning_version``  the Lightning version whose layout the file follows
``callbacks``                  each callback's ``state_dict()`` under its ``state_key``
``loops``                      Lightning's loop progress (``fit_loop``, ``validate_loop``, ...),
                               derived from geartrain's ``progress``; beside them geartrain's
                               sampler order (``epoch_rng``) and batch geometry (``batches``)
============================== ==========================================================

geartrain's own entries stay beside them (``format``, ``version``, ``progress``, ``rng``,
``precision``, ``config``, ...). ``progress`` is what geartrain resumes from; the few counters in
``loops`` are written for Lightning only. Version 1 files (``optimizers``, ``hparams``) are read by
renaming their entries (:func:`upgrade`), so every reader sees one layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["LIGHTNING_LAYOUT_VERSION", "lightning_loops", "upgrade"]

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


def _counts(n: int, *names: str) -> dict[str, int]:
    return dict.fromkeys(names, n)


def _batch_progress(total: int, current: int, is_last: bool | None) -> dict[str, Any]:
    names = ("ready", "completed", "started", "processed")
    entry: dict[str, Any] = {"total": _counts(total, *names), "current": _counts(current, *names)}
    if is_last is not None:
        entry["is_last_batch"] = is_last
    return entry


def _evaluation_loop(is_last: bool | None = False) -> dict[str, Any]:
    return {"state_dict": {}, "batch_progress": _batch_progress(0, 0, is_last)}


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
    steps = {"total": _counts(step, "ready", "completed"), "current": _counts(0, "ready", "completed")}
    no_steps = {"total": _counts(0, "ready", "completed"), "current": _counts(0, "ready", "completed")}
    zero_grad = {
        "total": _counts(step if automatic_optimization else 0, "ready", "completed", "started"),
        "current": _counts(0, "ready", "completed", "started"),
    }
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
        "epoch_loop.val_loop.batch_progress": _batch_progress(0, 0, False),
        "epoch_progress": {
            "total": {**_counts(started, "ready", "started"), **_counts(done, "completed", "processed")},
            "current": {**_counts(started, "ready", "started"), **_counts(done, "completed", "processed")},
        },
    }
    return {
        "fit_loop": fit_loop,
        "validate_loop": _evaluation_loop(),
        "test_loop": _evaluation_loop(),
        "predict_loop": {"state_dict": {}, "batch_progress": _batch_progress(0, 0, None)},
    }
