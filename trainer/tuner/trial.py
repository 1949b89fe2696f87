"""A trial inside a running ``fit``: a few optimizer steps with one callback, then the run put back.

The finders (``LearningRateFinder``, ``BatchSizeFinder``) reach it through :meth:`Trainer.run_trial`
from their ``on_fit_start``, where the module, strategy, optimizers and dataloaders are set up. A
trial trains with the run's own training step (every strategy, precision and accumulation), with
only the finder's callback listening, no validation and no loggers; afterwards the module's
weights, the optimizers, schedulers, progress counters, logged values and random-number generators
are what they were, so the run (or a later ``fit``) goes on as if no trial had happened.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from trainer.common.rng import rng_state, set_rng_state
from trainer.hooks import HookDispatch
from trainer.loops.fit import should_stop_training, train_epoch
from trainer.loops.step import Window

if TYPE_CHECKING:
    from callbacks.base import Callback
    from trainer.trainer import Trainer

__all__ = ["run_trial"]


def run_trial(trainer: Trainer, callback: Callback, steps: int, reload_dataloaders: bool = False) -> None:
    """Train ``steps`` optimizer steps from the current state with only ``callback``; then restore it.

    ``reload_dataloaders``: build the training loader again first (a batch size changed) and once
    more after restoring, so the run goes on with the loader as the attributes now say. The trial's
    exception (``torch.OutOfMemoryError`` for the batch-size finder) propagates after the state is
    restored.
    """
    if steps < 0:
        raise ValueError(f"run_trial(steps={steps}): the number of optimizer steps must be >= 0")
    module = trainer.module
    if module is None or trainer.stage != "fit":
        raise RuntimeError("Trainer.run_trial runs inside fit (from a callback's on_fit_start)")
    saved = _save(trainer)
    try:
        if reload_dataloaders:
            _reload(trainer)
        trainer.hooks = HookDispatch([callback], trainer)
        trainer.hooks.bind(module)
        trainer.max_steps, trainer.max_epochs = trainer.global_step + steps, -1
        trainer.limits = {**trainer.limits, "validate": 0}
        trainer.progress.should_stop = False
        module.train()
        window = Window()
        while steps and not should_stop_training(trainer):
            p = trainer.progress
            if p.epoch_finished:
                p.epoch, p.batch_in_epoch, p.epoch_finished = p.epoch + 1, 0, False
            before = p.global_step
            train_epoch(trainer, window)
            if p.global_step == before and not p.should_stop:
                break  # an empty loader (or a module ending every epoch at once): no step will come
    finally:
        _restore(trainer, saved)
        if reload_dataloaders:
            _reload(trainer)


def _reload(trainer: Trainer) -> None:
    from trainer.run import reload_loaders  # run imports the loops, which import this room's callers

    trainer.loaders.pop("fit", None)
    reload_loaders(trainer)


def _save(trainer: Trainer) -> dict[str, Any]:
    module = trainer.module
    assert module is not None
    return {
        "module": copy.deepcopy(module.state_dict()),
        "optimizers": [copy.deepcopy(opt.state_dict()) for opt in trainer.optimizers],
        "schedulers": list(trainer.lr_scheduler_configs),
        "scheduler_states": [copy.deepcopy(cfg.scheduler.state_dict()) for cfg in trainer.lr_scheduler_configs],
        "progress": copy.deepcopy(trainer.progress.__dict__),
        "metrics": trainer.metric_router.snapshot(),
        "rng": rng_state(),
        "options": (trainer.hooks, trainer.max_steps, trainer.max_epochs, trainer.limits),
        "num_training_batches": trainer.num_training_batches,
        # A resumed run's epoch order is replayed by its own first epoch, not by the trial.
        "resume_epoch_rng": trainer.checkpointing.take_resume_epoch_rng(),
    }


def _restore(trainer: Trainer, saved: dict[str, Any]) -> None:
    module = trainer.module
    assert module is not None
    module.load_state_dict(saved["module"])
    for opt, state in zip(trainer.optimizers, saved["optimizers"], strict=True):
        opt.load_state_dict(state)
        opt.zero_grad(set_to_none=True)
    trainer.lr_scheduler_configs = saved["schedulers"]
    for cfg, state in zip(trainer.lr_scheduler_configs, saved["scheduler_states"], strict=True):
        cfg.scheduler.load_state_dict(state)
    # In place: the loop that called the finder holds this object.
    trainer.progress.__dict__.update(saved["progress"])
    trainer.metric_router.restore(saved["metrics"])
    set_rng_state(saved["rng"])
    trainer.hooks, trainer.max_steps, trainer.max_epochs, trainer.limits = saved["options"]
    trainer.num_training_batches = saved["num_training_batches"]
    trainer.checkpointing.resume_epoch_rng = saved["resume_epoch_rng"]
