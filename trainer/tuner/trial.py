"""A trial inside a running entry point: a few steps with one callback, then the run put back.

The finders (``LearningRateFinder``, ``BatchSizeFinder``) reach it through :meth:`Trainer.run_trial`
from their ``on_fit_start`` (or, for the batch-size finder, ``on_validation_start``,
``on_test_start``, ``on_predict_start``), where the module, strategy, optimizers and dataloaders are
set up. In ``fit`` a trial trains with the run's own training step (every strategy, precision and
accumulation); in ``validate``/``test``/``predict`` it runs that stage's loop over its first
batches. Only the finder's callback listens, there is no validation inside and no logger; afterwards
the module's weights, the optimizers, schedulers, progress counters, logged values and
random-number generators are what they were, so the run (or a later one) goes on as if no trial had
happened.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from trainer.common.rng import rng_state, set_rng_state
from trainer.data.fit_loaders import has_val_data, request_train_loader, request_val_loaders
from trainer.data.loaders import resolve_loaders
from trainer.hooks import HookDispatch
from trainer.loops.evaluation import eval_loop, predict_loop
from trainer.loops.fit import should_stop_training, train_epoch
from trainer.loops.step import Window

if TYPE_CHECKING:
    from callbacks.base import Callback
    from trainer.trainer import Trainer

__all__ = ["EVAL_STAGES", "restore_run", "run_eval_trial", "run_trial", "save_run"]


#: The entry points a trial evaluates in (``fit``'s trials train).
EVAL_STAGES = ("validate", "test", "predict")


def run_trial(trainer: Trainer, callback: Callback, steps: int, reload_dataloaders: bool = False) -> None:
    """Train ``steps`` optimizer steps from the current state with only ``callback``; then restore it.

    Inside ``validate``/``test``/``predict`` the trial runs that stage's loop over its first
    ``steps`` batches instead (:func:`run_eval_trial`).

    ``reload_dataloaders``: build the training loader again first (a batch size changed) and once
    more after restoring, so the run goes on with the loader as the attributes now say. The trial's
    exception (``torch.OutOfMemoryError`` for the batch-size finder) propagates after the state is
    restored.
    """
    if steps < 0:
        raise ValueError(f"run_trial(steps={steps}): the number of steps must be >= 0")
    module = trainer.module
    if module is not None and trainer.stage in EVAL_STAGES:
        run_eval_trial(trainer, callback, steps, reload_dataloaders)
        return
    if module is None or trainer.stage != "fit":
        raise RuntimeError(
            "Trainer.run_trial runs inside fit, validate, test or predict (from a callback's on_fit_start, "
            "on_validation_start, on_test_start or on_predict_start)"
        )
    state = trainer.run_state
    saved = save_run(trainer, weights=True)
    try:
        if reload_dataloaders:
            _reload(trainer)
        state.hooks = HookDispatch([callback], trainer)
        state.hooks.bind(module)
        state.loop = dataclasses.replace(
            state.loop,
            max_steps=state.progress.global_step + steps,
            max_epochs=-1,
            limits={**state.loop.limits, "validate": 0},
        )
        state.window = Window()  # the run's own window (and its manual optimizers') stays as it is
        state.progress.should_stop = False
        module.train()
        while steps and not should_stop_training(state):
            p = state.progress
            if p.epoch_finished:
                p.epoch, p.batch_in_epoch, p.epoch_finished = p.epoch + 1, 0, False
            before = p.global_step
            train_epoch(trainer, state)
            if p.global_step == before and not p.should_stop:
                break  # an empty loader (or a module ending every epoch at once): no step will come
    finally:
        restore_run(trainer, saved)
        if reload_dataloaders:
            _reload(trainer, validation=True)


def run_eval_trial(trainer: Trainer, callback: Callback, batches: int, reload_dataloaders: bool = False) -> None:
    """Run the running evaluation stage's loop over its first ``batches`` batches with only ``callback``.

    Nothing is kept: logged values, counters and random generators are put back, no prediction is
    kept. ``reload_dataloaders``: the stage's loaders are built again before (a batch size changed)
    and after, so the stage goes on with loaders as the attributes now say.
    """
    state, stage, module = trainer.run_state, trainer.stage, trainer.module
    assert stage in EVAL_STAGES and module is not None
    saved = save_run(trainer)
    try:
        if reload_dataloaders:
            state.loaders[stage] = resolve_loaders(trainer, stage, state.given_loaders.get(stage))
        state.hooks = HookDispatch([callback], trainer)
        state.hooks.bind(module)
        state.loop = dataclasses.replace(state.loop, limits={**state.loop.limits, stage: batches})
        if not batches:
            pass  # nothing runs (as a fit trial of no steps): the loaders were rebuilt, if asked
        elif stage == "predict":
            predict_loop(trainer, state, keep=False)
        else:
            eval_loop(trainer, state, stage)
    finally:
        restore_run(trainer, saved)
        if reload_dataloaders:
            state.loaders[stage] = resolve_loaders(trainer, stage, state.given_loaders.get(stage))


def _reload(trainer: Trainer, validation: bool = False) -> None:
    """The loaders built again (a batch size changed): training's now, and with ``validation`` the
    validation loaders too when the fit validates (as Lightning resets both), else when next needed."""
    trainer.loaders.pop("fit", None)
    trainer.loaders.pop("validate", None)
    request_train_loader(trainer)
    if validation and trainer.run_state.loop.limits["validate"] not in (0, 0.0) and has_val_data(trainer.run_state):
        request_val_loaders(trainer)


def save_run(trainer: Trainer, weights: bool = False) -> dict[str, Any]:
    """What a trial or the ``Tuner`` changes: the run state, the logged values, the random generators.

    ``weights``: the module's weights too (a trial trains them; the ``Tuner``'s hosting fit does not).
    """
    saved: dict[str, Any] = {
        "run": trainer.run_state.state_dict(weights=weights),
        "window": trainer.run_state.window,
        "metrics": trainer.metric_router.snapshot(),
        "rng": rng_state(),
        # A resumed run's epoch order is replayed by its own first epoch, not by the trial.
        "resume_epoch_rng": trainer.checkpointing.take_resume_epoch_rng(),
        "resume_loader_states": trainer.checkpointing.resume_loader_states,
        # A trial ends inside an epoch: where it stopped is not where the hosting run stands.
        "resume_point": trainer.checkpointing.resume_point,
    }
    trainer.checkpointing.resume_loader_states = []  # loaded by the resumed run's first epoch, not by a trial
    return saved


def restore_run(trainer: Trainer, saved: dict[str, Any]) -> None:
    """Put back what :func:`save_run` saved."""
    trainer.run_state.load_state_dict(saved["run"])
    trainer.run_state.window = saved["window"]
    trainer.metric_router.restore(saved["metrics"])
    set_rng_state(saved["rng"])
    trainer.checkpointing.resume_epoch_rng = saved["resume_epoch_rng"]
    trainer.checkpointing.resume_loader_states = saved["resume_loader_states"]
    trainer.checkpointing.resume_point = saved["resume_point"]
