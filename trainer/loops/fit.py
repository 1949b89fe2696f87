"""The fit loop: epochs of training batches, validation when due, schedulers, stopping, preemption.

Hooks named ``hook`` below call the module's method first, then every callback that overrides it.
Where metrics are computed at an epoch's end, that happens between the two, so callbacks (checkpoint,
early stopping, loggers) see what the module logged in its own epoch-end hook.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

from trainer.common.errors import Preempted
from trainer.loops.evaluation import eval_loop, sanity_check, validation_enabled
from trainer.loops.iteration import iterate, last_batch_share, num_batches, set_sampler_epoch
from trainer.loops.step import make_train_batch, step_schedulers
from trainer.metrics.routing import EPOCH_DEFAULTS, STEP_DEFAULTS
from trainer.metrics.store import MetricStore
from trainer.metrics.sync import epoch_agreement
from trainer.profilers.base import profiled_iter

if TYPE_CHECKING:
    from trainer.run_state import RunState
    from trainer.trainer import Trainer

__all__ = ["fit_loop", "should_stop_training", "train_epoch"]


def fit_loop(trainer: Trainer, state: RunState) -> None:
    """Train until ``max_epochs``, ``max_steps`` or ``should_stop`` (obeyed once ``min_epochs``/``min_steps`` are met).

    Hook order::

        on_fit_start
        on_sanity_check_start, validation loop on num_sanity_val_steps batches, on_sanity_check_end
        on_train_start
        for each epoch:
            every reload_dataloaders_every_n_epochs epochs: train/val loaders requested again
            on_train_epoch_start
            for each batch:                                 (trainer/loops/step.py)
                on_train_batch_start(batch, i)              (module returning -1 ends the epoch)
                batch = strategy.batch_to_device(batch)
                for each micro-batch (one unless micro_batch_size):
                    with no_backward_sync(unless the window's last), forward_context():
                        out = training_step(batch, i)
                    on_before_backward(loss); strategy.backward(loss * share / k); on_after_backward
                if last batch of the accumulation window:
                    on_before_optimizer_step(optimizer)
                    strategy.clip_gradients(...)            (unscales exactly once first)
                    stepped = strategy.optimizer_step(optimizer)
                    if stepped: step-interval schedulers
                    on_before_zero_grad(optimizer); optimizer.zero_grad(set_to_none=True)
                    global_step += 1
                on_train_batch_end(out, batch, i)
                step values to loggers every log_every_n_steps steps
                preemption: after an optimizer step, save last.ckpt and stop if a signal came
                validation loop when val_check_interval says so
            validation loop at the epoch's end (if it did not just run)
            module.on_train_epoch_end; epoch values computed and logged
            epoch-interval schedulers; callbacks' on_train_epoch_end
        on_train_end
        on_fit_end

    Validation loop: see :func:`~trainer.loops.evaluation.eval_loop`.
    """
    p, hooks = state.progress, state.hooks
    hooks("on_fit_start")
    if validation_enabled(state) and state.loop.num_sanity_val_steps != 0 and not state.loop.fast_dev_run:
        sanity_check(trainer, state)
    assert state.module is not None
    if no_training_batches(trainer, state):
        hooks("on_fit_end")
        return
    state.module.train()
    hooks("on_train_start")
    while not should_stop_training(state):
        if p.epoch_finished:
            p.epoch, p.batch_in_epoch, p.epoch_finished = p.epoch + 1, 0, False
            if should_stop_training(state):
                break
        with trainer.profiler.profile("run_training_epoch"):  # once an epoch: free when nothing profiles
            train_epoch(trainer, state)
    _drop_open_window(state)
    hooks("on_train_end")
    hooks("on_fit_end")


def no_training_batches(trainer: Trainer, state: RunState) -> bool:
    """Whether the training loader has no batch on any rank; says so (once, as Lightning) when it has none.

    Training zero steps and ending as if it had trained hides an empty dataset or split; the
    ``geartrain`` command turns this into an error. ``limit_train_batches=0`` is a deliberate choice
    and is not reported.
    """
    loader = state.loaders["fit"]
    limit = state.loop.limits["fit"]
    num = num_batches(loader, limit) if loader is not None else 0
    if trainer.world_size > 1:
        import torch

        flag = torch.tensor(float(min(num, 1)), device=trainer.strategy.root_device)
        num = float(trainer.strategy.reduce(flag, op="sum").item())
    if num:
        return False
    state.num_training_batches = 0
    if limit != 0:
        dataset = getattr(loader, "dataset", None)
        size = f"a dataset of {len(dataset)} samples" if hasattr(dataset, "__len__") else "its dataset"  # type: ignore[arg-type]
        batcher = getattr(loader, "batch_sampler", None)
        batcher = getattr(batcher, "batch_sampler", batcher)  # the user's, inside the trainer's resumable one
        batch_size = getattr(loader, "batch_size", None) or getattr(batcher, "batch_size", None)
        dropping = getattr(loader, "drop_last", False) or getattr(batcher, "drop_last", False)
        drop = " with drop_last=True" if dropping else ""
        if trainer.is_global_zero:
            warnings.warn(
                f"Trainer.fit stopped: the training dataloader has no batches ({size}, batch_size={batch_size}{drop}). "
                "Check the dataset, its split or path, and the batch size.",
                stacklevel=2,
            )
    return True


def train_epoch(trainer: Trainer, state: RunState) -> None:
    """One epoch (or the rest of one, on resume); see :func:`fit_loop` for the hook order."""
    p, hooks = state.progress, state.hooks
    router, preemption = trainer.metric_router, trainer.preemption
    reload_every = trainer.reload_dataloaders_every_n_epochs
    if reload_every and p.epoch and p.epoch % reload_every == 0 and p.batch_in_epoch == 0:
        from trainer.run import reload_loaders  # run imports the loops: imported here, once per epoch

        reload_loaders(trainer)
    loader = state.loaders["fit"]
    assert loader is not None
    num = num_batches(loader, state.loop.limits["fit"])
    state.num_training_batches = num
    set_sampler_epoch(loader, p.epoch)
    store = MetricStore(trainer.strategy.reduce, epoch_agreement(trainer))
    val_every = _val_every(state, num)
    # check_val_every_n_epoch=None: every val_check_interval batches, counted across epochs.
    across = state.loop.check_val_every_n_epoch is None
    batch_offset = p.batches_before_epoch if across else 0
    validate_this_epoch = validation_enabled(state) and (
        across or (p.epoch + 1) % state.loop.check_val_every_n_epoch == 0  # type: ignore[operator]
    )
    last_val_at = -1
    router.start_train_epoch(store, state.module)  # after a mid-epoch resume: the epoch's sums so far
    with router.logging(store, EPOCH_DEFAULTS):
        hooks("on_train_epoch_start")
    resume_epoch_rng = trainer.checkpointing.take_resume_epoch_rng()
    train_batch = make_train_batch(trainer, state, last_batch_share(loader, num))
    log_every = state.loop.log_every_n_steps
    with router.logging(store, STEP_DEFAULTS):
        batches = iterate(loader, num, start=p.batch_in_epoch, epoch_rng=resume_epoch_rng)
        # With a profiler each fetch is its own action; without, the loop iterates the batches as before.
        for batch_idx, batch, is_last in profiled_iter(trainer.profiler, "train_dataloader_next", batches):
            steps_before = p.global_step
            state.is_last_batch = is_last
            result = train_batch(batch, batch_idx, is_last)
            # An identity-and-type test: ``out == -1`` on a loss tensor would run a kernel and, on a GPU,
            # wait for it (a host-device sync every step).
            if type(result) is int and result == -1:
                break
            if p.global_step != steps_before:
                if p.global_step % log_every == 0:
                    router.emit(dict(store.pending_step), p.global_step - 1)
                store.pending_step.clear()
                # Only after an optimizer step (gradients of a half-accumulated window are not in
                # checkpoints). One process: an attribute test; several: a small all-reduce about
                # every PREEMPT_CHECK_SECONDS, at a step the ranks agreed on.
                if preemption.due(p.global_step) and preemption.requested(p.global_step):
                    trainer.checkpointing.save_last()
                    preemption.requeue(trainer.is_global_zero)
                    raise Preempted
            if validate_this_epoch and val_every and (batch_offset + batch_idx + 1) % val_every == 0:
                eval_loop(trainer, state, "validate")
                last_val_at = p.batch_in_epoch
            if should_stop_training(state):
                _drop_open_window(state)
                break
    end_validation = validate_this_epoch and not across and not _may_stop(state)
    if end_validation and last_val_at != p.batch_in_epoch and p.batch_in_epoch:
        eval_loop(trainer, state, "validate")
        last_val_at = p.batch_in_epoch
    with router.logging(store, EPOCH_DEFAULTS):
        hooks.module("on_train_epoch_end")
        router.publish_epoch(store, max(p.global_step - 1, 0))
        # A validation metric may legitimately be missing in an epoch without validation
        # (check_val_every_n_epoch > 1, an early stop); a missing name is an error only when
        # validation ran (or there is none).
        step_schedulers(trainer, "epoch", metrics_due=last_val_at >= 0 or not validation_enabled(state))
        p.batches_before_epoch += p.batch_in_epoch
        p.epoch_finished = True
        # Finished (a checkpoint saved here resumes at the next epoch), but callbacks still see this
        # epoch as ``current_epoch``, as in Lightning, which counts it done only after these hooks.
        state.in_train_epoch_end = True
        try:
            hooks.callbacks_only("on_train_epoch_end")
        finally:
            state.in_train_epoch_end = False
    store.reset()


def _drop_open_window(state: RunState) -> None:
    """Training stopped inside an accumulation window: drop its gradients, which no step will apply.

    As in Lightning, a stop (early stopping, ``max_time``, a batch hook's -1 in the last epoch) does
    not wait for the window's end. Closing it here makes the state after the stop a checkpointable
    one (the saves of the epoch's and the fit's end hold exactly what a resume continues from).
    """
    window = state.window
    if window.has_loss or window.nonfinite:
        for optimizer in state.optimizers:
            optimizer.zero_grad(set_to_none=True)
        window.has_loss = window.nonfinite = False


def should_stop_training(state: RunState) -> bool:
    """``should_stop`` (once ``min_epochs`` and ``min_steps`` are met), ``max_steps`` or ``max_epochs`` reached."""
    p = state.progress
    if p.should_stop and _may_stop(state):
        return True
    if state.loop.max_steps != -1 and p.global_step >= state.loop.max_steps:
        return True
    max_epochs = state.loop.max_epochs
    if max_epochs is not None and max_epochs != -1:
        return p.epoch + (1 if p.epoch_finished else 0) >= max_epochs
    return False


def _may_stop(state: RunState) -> bool:
    """``should_stop`` is set and may be obeyed: ``min_epochs`` epochs and ``min_steps`` steps are done.

    As in Lightning, a stop requested earlier (early stopping, ``max_time``) waits until then.
    """
    p = state.progress
    if not p.should_stop:
        return False
    done_epochs = p.epoch + (1 if p.epoch_finished else 0)
    return done_epochs >= state.loop.min_epochs and p.global_step >= state.loop.min_steps


def _val_every(state: RunState, num: float) -> int | None:
    """Training batches between validation runs within an epoch (None: only at the epoch's end)."""
    interval = state.loop.val_check_interval
    if isinstance(interval, int):
        return interval
    if math.isinf(num):
        return None
    if interval is None:
        return int(num) or None
    return max(1, int(num * interval))
