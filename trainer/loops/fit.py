"""The fit loop: epochs of training batches, validation when due, schedulers, stopping, preemption.

Hooks named ``hook`` below call every callback that overrides it, then the module's method, with
Lightning's exceptions, all declared in :mod:`trainer.hook_order`. At a training epoch's end the
callbacks that monitor a metric (checkpointing, early stopping) run after the module and after the
epoch's values are computed, so they see what the module logged in its own epoch-end hook.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from strategies.sampling import EmptyShardError
from trainer.common.errors import Preempted
from trainer.data.fit_loaders import request_train_loader, request_val_loaders
from trainer.data.stateful import load_states
from trainer.loops import fit_messages as messages
from trainer.loops.dataloader_iter import DataloaderIter, check_training_options, iter_steps, takes_dataloader_iter
from trainer.loops.evaluation import eval_loop, sanity_check, validation_enabled, warn_if_validation_is_half_defined
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

        on_fit_start; module.zero_grad()
        on_sanity_check_start, validation loop on num_sanity_val_steps batches, on_sanity_check_end
            (the random state is put back afterwards)
        a fresh run's first epoch's loader iterator is created
        on_train_start
        for each epoch:
            every reload_dataloaders_every_n_epochs epochs: the train loader requested again (the val
            loaders: by the first validation that is that many epochs after their last request)
            on_train_epoch_start
            (later epochs: the loader's iterator is created)
            for each batch:                                 (trainer/loops/step.py)
                batch transfer hooks; batch = strategy.batch_to_device(batch)
                on_train_batch_start(batch, i)              (module returning -1 ends the epoch)
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
                validation loop after every val_check_interval-th batch (Lightning's rule)
            validation loop at the epoch's end only for a loader without a length
            other callbacks' on_train_epoch_end; module.on_train_epoch_end; epoch values computed and logged
            epoch-interval schedulers; checkpointing and early stopping callbacks' on_train_epoch_end
        on_train_end
        on_fit_end

    Validation loop: see :func:`~trainer.loops.evaluation.eval_loop`.
    """
    p, hooks, refusing = state.progress, state.hooks, trainer.metric_router.refusing
    with refusing("on_fit_start"):  # self.log is refused by name where Lightning refuses it
        hooks("on_fit_start")
    assert state.module is not None
    state.module.zero_grad()  # as Lightning's stage starts: gradients left from before the fit are freed
    warn_if_validation_is_half_defined(state)
    if validation_enabled(state) and state.loop.num_sanity_val_steps != 0 and not state.loop.fast_dev_run:
        sanity_check(trainer, state)
    loader = request_train_loader(trainer)  # after the sanity check's val_dataloader(), as Lightning asks
    messages.warn_if_fewer_batches_than_log_interval(trainer, state, loader)
    every = state.loop.check_val_every_n_epoch
    if validation_enabled(state) and (every is None or (p.epoch + 1) % every == 0):
        request_val_loaders(trainer)  # as Lightning: known before on_train_start when this epoch validates
    assert state.module is not None
    if no_training_batches(trainer, state):
        with refusing("on_fit_end"):
            hooks("on_fit_end")
        return
    messages.warn_if_in_eval_mode(state.module)  # the user's modes stay as they are, as in Lightning 2.6
    # A fresh run opens its first epoch's loader here, before on_train_start, as Lightning does: that
    # draws the loader's worker seed from the global generator, before what the hooks draw. Later
    # epochs (and a resumed run's first) open theirs after on_train_epoch_start.
    fresh = p.epoch == 0 and p.batch_in_epoch == 0 and not trainer.checkpointing.resume_loader_states
    first_batches = _open_first_epoch(state) if fresh else None
    # Values logged in on_train_start count towards the first epoch's (Lightning's rule).
    store = MetricStore(trainer.strategy.reduce, epoch_agreement(trainer))
    with trainer.metric_router.logging(store, EPOCH_DEFAULTS):
        hooks("on_train_start")
    first_store: MetricStore | None = store
    while not should_stop_training(state):
        if p.epoch_finished:
            p.epoch, p.batch_in_epoch, p.epoch_finished = p.epoch + 1, 0, False
            if should_stop_training(state):
                break
        with trainer.profiler.profile("run_training_epoch"):  # once an epoch: free when nothing profiles
            try:
                train_epoch(trainer, state, first_store, first_batches)
            except EmptyShardError as err:  # one rank's stream gave nothing: said as an empty training set
                if trainer.is_global_zero:
                    warnings.warn(
                        f"Trainer.fit stopped: the training dataloader has no batches ({err}). Check the "
                        "dataset's sharding (every rank needs at least one batch), its split or path, and the "
                        "batch size.",
                        stacklevel=2,
                    )
                break
        first_store = first_batches = None
    _drop_open_window(state)
    with refusing("on_train_end"):
        hooks("on_train_end")
    with refusing("on_fit_end"):
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


def _open_first_epoch(state: RunState) -> Iterator[tuple[int, Any, bool]]:
    """The batches of a fresh run's first epoch, its loader's iterator created now."""
    loader = state.loaders["fit"]
    assert loader is not None
    set_sampler_epoch(loader, 0)
    return iterate(loader, num_batches(loader, state.loop.limits["fit"]))


def train_epoch(
    trainer: Trainer,
    state: RunState,
    store: MetricStore | None = None,
    batches: Iterator[tuple[int, Any, bool]] | None = None,
) -> None:
    """One epoch (or the rest of one, on resume); see :func:`fit_loop` for the hook order.

    ``store``: where the epoch's values go, holding what ``on_train_start`` logged (default: a new one).
    ``batches``: the epoch's batches, when its loader was opened already (default: opened here).
    """
    p, hooks = state.progress, state.hooks
    router, preemption = trainer.metric_router, trainer.preemption
    reload_every = trainer.reload_dataloaders_every_n_epochs
    reload = bool(reload_every and p.epoch and p.epoch % reload_every == 0 and p.batch_in_epoch == 0)
    loader = request_train_loader(trainer, reload=reload)
    assert loader is not None
    num = num_batches(loader, state.loop.limits["fit"])
    state.num_training_batches = num
    if p.batch_in_epoch and p.batch_in_epoch >= num and trainer.is_global_zero:
        warnings.warn(
            f"The checkpoint resumed from stopped after batch {p.batch_in_epoch} of epoch {p.epoch}, and this run "
            f"trains {int(num)} batches an epoch (limit_train_batches={state.loop.limits['fit']}): epoch {p.epoch} "
            "ends without training more. Raise limit_train_batches to train the rest of it.",
            stacklevel=2,
        )
    if batches is None:  # an epoch opened before on_train_start was told its epoch then (once, as Lightning)
        set_sampler_epoch(loader, p.epoch)
    if store is None:
        store = MetricStore(trainer.strategy.reduce, epoch_agreement(trainer))
    val_every = _val_every(state, num)
    state.val_check_batch = math.inf if val_every is None else val_every  # Lightning's trainer.val_check_batch
    # check_val_every_n_epoch=None: every val_check_interval batches, counted across epochs.
    across = state.loop.check_val_every_n_epoch is None
    batch_offset = p.batches_before_epoch if across else 0
    validate_this_epoch = validation_enabled(state) and (
        across or (p.epoch + 1) % state.loop.check_val_every_n_epoch == 0  # type: ignore[operator]
    )
    if validate_this_epoch and val_every and not across and val_every > num:
        raise ValueError(
            f"Trainer(val_check_interval={state.loop.val_check_interval}) must be at most one epoch: it must be less "
            f"than or equal to the number of the training batches ({int(num)}). Set limit_val_batches=0 to switch "
            "validation off, or "
            "check_val_every_n_epoch=None to count the interval across epochs."
        )
    last_val_at = -1
    router.start_train_epoch(store, state.module)  # after a mid-epoch resume: the epoch's sums so far
    with router.logging(store, EPOCH_DEFAULTS):
        hooks("on_train_epoch_start")
    resume_epoch_rng = trainer.checkpointing.take_resume_epoch_rng()
    loader_states, trainer.checkpointing.resume_loader_states = trainer.checkpointing.resume_loader_states, []
    drop = not load_states(loader, loader_states, mid_epoch=p.batch_in_epoch > 0)  # it continues by itself
    assert state.module is not None
    fetches_itself = takes_dataloader_iter(state.module.training_step)  # Lightning's training_step(dataloader_iter)
    if fetches_itself:
        check_training_options(trainer, state)
    train_batch = make_train_batch(trainer, state, None if fetches_itself else last_batch_share(loader, num))
    log_every = state.loop.log_every_n_steps
    pending = store.pending_step  # the store's one dict of this step's values, cleared in place
    agree = preemption.agree  # set once per fit, when the signal handlers are installed

    # Whether a batch can end with a validation run at all: if not, the loop asks nothing per batch.
    checks_validation = validate_this_epoch and bool(val_every)

    def validation_due(batch_idx: int) -> bool:
        """Lightning's rule: after every ``val_every``-th batch (no extra run at the epoch's end)."""
        return (batch_offset + batch_idx + 1) % val_every == 0  # type: ignore[operator]

    def validate() -> None:
        nonlocal last_val_at
        p.validated_at = p.batches_before_epoch + p.batch_in_epoch
        if request_val_loaders(trainer) is not None:  # requested when first needed, or again when due
            eval_loop(trainer, state, "validate")
        last_val_at = p.batch_in_epoch

    if p.batch_in_epoch and checks_validation and validation_due(p.batch_in_epoch - 1):
        if p.validated_at != p.batches_before_epoch + p.batch_in_epoch:
            validate()  # resumed from a save made before a due validation ran: run it now
        else:
            last_val_at = p.batch_in_epoch
    with router.logging(store, STEP_DEFAULTS):
        if batches is None:
            batches = iterate(loader, num, start=p.batch_in_epoch, epoch_rng=resume_epoch_rng, drop=drop)
        # With a profiler each fetch is its own action (Lightning's name); without, the loop iterates the
        # batches as before. A step that fetches its own batches times each of its polls.
        fetched = profiled_iter(trainer.profiler, "[_TrainingEpochLoop].train_dataloader_next", batches)
        if fetches_itself:  # one call of the step per iteration, until the step has fetched the last batch
            opened = fetched
            fetched = iter_steps(DataloaderIter([(0, num, lambda: iter(opened))]))
        for batch_idx, batch, is_last in fetched:
            steps_before = p.global_step
            state.is_last_batch = is_last
            result = train_batch(batch, batch_idx, is_last)
            is_last = state.is_last_batch  # a step that fetches its own batches says so only after it ran
            # An identity-and-type test: ``out == -1`` on a loss tensor would run a kernel and, on a GPU,
            # wait for it (a host-device sync every step).
            if type(result) is int and result == -1:
                break
            global_step = p.global_step
            if global_step != steps_before:
                if log_every and global_step % log_every == 0:  # 0: never, as Lightning
                    router.emit(dict(pending), global_step - 1)
                elif pending:  # as Lightning: logged_metrics holds them between logging steps too
                    router.keep_logged(pending)
                pending.clear()
                # Only after an optimizer step (gradients of a half-accumulated window are not in
                # checkpoints). Whether to ask Preemption.requested, tested here on every step: in one
                # process, whether a signal was noted; under several, whether this is the step the
                # ranks agreed on for their next small all-reduce (about every PREEMPT_CHECK_SECONDS).
                if (
                    global_step >= preemption.next_check if agree else preemption.signal is not None
                ) and preemption.requested(global_step):
                    trainer.checkpointing.save_last()
                    preemption.requeue(trainer.is_global_zero)
                    raise Preempted
            # A step that fetches its own batches also validates after the epoch's last (Lightning's rule).
            due = checks_validation and (validation_due(batch_idx) or (fetches_itself and is_last))
            if due:
                validate()
            if should_stop_training(state):
                if not is_last:  # the rest of the epoch is for a resume to train (before the stop's own work)
                    trainer.checkpointing.mark_resume_point()
                # As Lightning: a stop asked for mid-epoch (and allowed by min_epochs/min_steps) validates first.
                if not due and validate_this_epoch and _may_stop(state):
                    validate()
                _drop_open_window(state)
                break
    # Without a length the epoch's end is the one moment to validate (Lightning's rule for such loaders).
    end_validation = validate_this_epoch and not val_every and not _may_stop(state)
    if end_validation and last_val_at != p.batch_in_epoch and p.batch_in_epoch:
        validate()
    with router.logging(store, EPOCH_DEFAULTS):
        # trainer/hook_order.py: callbacks that monitor nothing, the module, then the monitoring ones
        # (checkpointing, early stopping), which so see what the module logs here. The first ones see
        # the epoch's values of the steps, as in Lightning, which computes them when read.
        if hooks.overridden("on_train_epoch_end"):
            router.remember(store.epoch_values(), store)
            hooks.callbacks_only("on_train_epoch_end", monitors=False)
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
            hooks.callbacks_only("on_train_epoch_end", monitors=True)
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
    if done_epochs >= state.loop.min_epochs and p.global_step >= state.loop.min_steps:
        return True
    messages.tell_stop_waits(state)
    return False


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
