"""Where a fit that stopped inside an epoch stood: what its later checkpoints resume from.

A stop inside an epoch (``max_steps``, ``max_time``, ``should_stop`` set by a callback or the module,
early stopping at a validation in the middle of an epoch) still ends the epoch as Lightning does: its
``on_train_epoch_end`` hooks, the epoch-interval schedulers, the monitoring callbacks. That work
belongs to the run that stopped. A checkpoint written during it (``last.ckpt`` at the epoch's end) or
after the fit (``save_checkpoint``) records instead the run as it stood after its last batch, so a
resume with a larger budget trains the rest of the epoch and ends as the uninterrupted run.

Kept from the stop: the counters, the schedulers, the optimizers' hyperparameters (an epoch
scheduler sets their learning rate), precision, every rank's random state, the sampler's order, the
epoch's metric sums, the data module, and the callbacks that decide the training (early stopping,
timers). Weights and the optimizers' other state do not change after the last step: they are read
when a file is written. So is the checkpoint callbacks' own state, which describes the files they
wrote. A stop inside an accumulation window (``should_stop`` at a batch that ends none) drops the
window's gradients; the resume trains that window again from its first batch, and a warning says so.
"""

from __future__ import annotations

import copy
import warnings
from typing import TYPE_CHECKING, Any

from callbacks.base import callback_states

if TYPE_CHECKING:
    from trainer.trainer import Trainer

__all__ = ["apply", "capture"]


def capture(trainer: Trainer, training: dict[str, Any]) -> dict[str, Any]:
    """The resume point of ``trainer`` now, given its ``training_state()`` (called by every rank at one batch)."""
    t = trainer
    progress = t.progress.state_dict()
    progress["should_stop"] = False  # a resume goes on: the stop was this run's
    if t.window.has_loss or t.window.nonfinite:
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
            state["loops"].update(value)
        elif key == "param_groups":
            for opt_state, groups in zip(state["optimizer_states"], value):
                opt_state["param_groups"] = [
                    {**saved, "params": live["params"]} for saved, live in zip(groups, opt_state["param_groups"])
                ]
        elif key != "progress":
            state[key] = value
