"""The loops. Each function's docstring is its hook order; read ``fit_loop`` first.

Hooks named ``hook`` below call the module's method first, then every callback that overrides it.
Where metrics are computed at an epoch's end, that happens between the two, so callbacks (checkpoint,
early stopping, loggers) see what the module logged in its own epoch-end hook.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

import torch

from trainer.common.errors import Preempted
from trainer.common.rng import rng_state, set_rng_state
from trainer.common.tree import move_to_device
from trainer.data import ResumableBatchSampler
from trainer.metrics import MetricStore
from trainer.microbatch import train_micro_batches

if TYPE_CHECKING:
    from strategies.base import Strategy
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["ManualOptimizer", "Preempted", "eval_loop", "fit_loop", "predict_loop"]


#: Under several processes, about how often (in seconds) ranks agree on whether a preemption signal
#: arrived: a signal stops training about this long after it came (or after the next step, for
#: slower steps), at the same step on every rank. See ``Trainer._preemption_requested``.
PREEMPT_CHECK_SECONDS = 0.5
#: ... and at least every this many optimizer steps.
PREEMPT_CHECK_MAX_STEPS = 1000
_STEP_DEFAULTS = (True, False)  # (on_step, on_epoch) for self.log in training steps
_EPOCH_DEFAULTS = (False, True)  # ... in epoch-end hooks and evaluation


def fit_loop(trainer: Trainer) -> None:
    """Train until ``max_epochs``, ``max_steps`` or ``should_stop``.

    Hook order::

        on_fit_start
        on_sanity_check_start, validation loop on num_sanity_val_steps batches, on_sanity_check_end
        on_train_start
        for each epoch:
            on_train_epoch_start
            for each batch:                                 (train_batch)
                on_train_batch_start(batch, i)              (module returning -1 ends the epoch)
                batch = strategy.batch_to_device(batch)
                with no_backward_sync(unless last micro-batch):
                    with forward_context(): out = training_step(batch, i)
                    on_before_backward(loss); strategy.backward(loss / k); on_after_backward
                    (micro_batch_size: the two lines above run per micro-batch, loss * its share)
                if last micro-batch of the step:
                    on_before_optimizer_step(optimizer)
                    strategy.clip_gradients(...)            (unscales exactly once first)
                    stepped = strategy.optimizer_step(optimizer)
                    if stepped: step-interval schedulers
                    on_before_zero_grad(optimizer); optimizer.zero_grad(set_to_none=True)
                    global_step += 1
                on_train_batch_end(out, batch, i)
                step values to loggers every log_every_n_steps steps
                validation loop when val_check_interval says so
            validation loop at the epoch's end (if it did not just run)
            module.on_train_epoch_end; epoch values computed and logged
            epoch-interval schedulers; callbacks' on_train_epoch_end
        on_train_end
        on_fit_end

    Validation loop: see :func:`eval_loop`.
    """
    p = trainer.progress
    trainer._hook("on_fit_start")
    if _validation_enabled(trainer) and trainer.num_sanity_val_steps != 0 and not trainer.fast_dev_run:
        _sanity_check(trainer)
    assert trainer.module is not None
    trainer.module.train()
    trainer._hook("on_train_start")
    while not _should_stop_training(trainer):
        if p.epoch_finished:
            p.epoch, p.batch_in_epoch, p.epoch_finished = p.epoch + 1, 0, False
            if _should_stop_training(trainer):
                break
        train_epoch(trainer)
    trainer._hook("on_train_end")
    trainer._hook("on_fit_end")


def train_epoch(trainer: Trainer) -> None:
    """One epoch (or the rest of one, on resume); see :func:`fit_loop` for the hook order."""
    p = trainer.progress
    loader = trainer._loaders["fit"]
    assert loader is not None
    num = trainer._num_batches("fit", loader)
    trainer.num_training_batches = num
    _set_sampler_epoch(loader, p.epoch)
    store = MetricStore(trainer.strategy.reduce)
    val_every = _val_every(trainer, num)
    validate_this_epoch = _validation_enabled(trainer) and (p.epoch + 1) % trainer.check_val_every_n_epoch == 0
    last_val_at = -1
    trainer._epoch_keys.clear()
    with _logging(trainer, store, _EPOCH_DEFAULTS):
        trainer._hook("on_train_epoch_start")
    resume_epoch_rng, trainer._resume_epoch_rng = trainer._resume_epoch_rng, None
    agree = trainer._preempt_agree
    run_batch = _plain_batch_fn(trainer) or train_batch
    with _logging(trainer, store, _STEP_DEFAULTS):
        batches = _iterate(loader, num, start=p.batch_in_epoch, epoch_rng=resume_epoch_rng)
        for batch_idx, batch, is_last in batches:
            steps_before = p.global_step
            result = run_batch(trainer, batch, batch_idx, is_last)
            # An identity-and-type test: ``out == -1`` on a loss tensor would run a kernel and, on a GPU,
            # wait for it (a host-device sync every step).
            if type(result) is int and result == -1:
                break
            if p.global_step != steps_before:
                if p.global_step % trainer.log_every_n_steps == 0:
                    trainer._emit(dict(store.pending_step), p.global_step - 1)
                store.pending_step.clear()
                # Only after an optimizer step (gradients of a half-accumulated window are not in
                # checkpoints). One process: an attribute test. Several: every rank takes part in a
                # small all-reduce at the step they agreed on last time, about every
                # PREEMPT_CHECK_SECONDS (after every step it cost DDP 25% here).
                if (
                    p.global_step >= trainer._next_preempt_check if agree else trainer._preempt_signal is not None
                ) and trainer._preemption_requested():
                    trainer._save_for_preemption()
                    raise Preempted
            if validate_this_epoch and val_every and (batch_idx + 1) % val_every == 0:
                _validate_during_fit(trainer)
                last_val_at = p.batch_in_epoch
            if _should_stop_training(trainer):
                break
    if validate_this_epoch and last_val_at != p.batch_in_epoch and not p.should_stop and p.batch_in_epoch:
        _validate_during_fit(trainer)
        last_val_at = p.batch_in_epoch
    with _logging(trainer, store, _EPOCH_DEFAULTS):
        trainer._call_module("on_train_epoch_end")
        values = store.epoch_values()
        trainer._remember(values, store)
        trainer._emit(values, max(p.global_step - 1, 0))
        # A validation metric may legitimately be missing in an epoch without validation
        # (check_val_every_n_epoch > 1, an early stop); a missing name is an error only when
        # validation ran (or there is none).
        _step_schedulers(trainer, "epoch", metrics_due=last_val_at >= 0 or not _validation_enabled(trainer))
        p.epoch_finished = True
        trainer._call_callbacks("on_train_epoch_end")
    store.reset()


def train_batch(trainer: Trainer, batch: Any, batch_idx: int, is_last: bool) -> Any:
    """One training batch: hooks, forward, and (automatic optimisation) backward and step."""
    strategy, module = trainer.strategy, trainer.module
    assert module is not None
    trainer._current_batch = batch
    if trainer._hook("on_train_batch_start", batch, batch_idx) == -1:
        return -1
    batch = strategy.batch_to_device(batch)
    trainer._current_batch = batch
    if module.automatic_optimization:
        out = _automatic_step(trainer, batch, batch_idx, is_last)
    else:
        with strategy.forward_context():
            out = strategy.step("training_step", batch, batch_idx)
    trainer.progress.batch_in_epoch = batch_idx + 1  # before the hook: a checkpoint saved there resumes after it
    trainer._hook("on_train_batch_end", out, batch, batch_idx)
    return out


#: The Strategy and Precision methods a training or an evaluation batch goes through.
_TRAIN_SEAMS = (
    ("batch_to_device", "forward_context", "no_backward_sync", "step", "backward", "clip_gradients", "optimizer_step"),
    ("convert_input", "forward_context", "backward", "optimizer_step"),
)
_EVAL_SEAMS = (("batch_to_device", "forward_context", "step"), ("convert_input", "forward_context"))


def _default_seams(strategy: Strategy, seams: tuple[tuple[str, ...], tuple[str, ...]]) -> bool:
    """Whether ``strategy`` and its precision keep the base classes' do-nothing versions of ``seams``.

    Compared on the types, so a subclass that overrides one (DDP's ``step``, autocast's
    ``forward_context``) is seen even if it calls ``super()``.
    """
    from strategies.base import Strategy
    from strategies.precision import Precision

    s_type, p_type = type(strategy), type(strategy.precision)
    return all(getattr(s_type, name) is getattr(Strategy, name) for name in seams[0]) and all(
        getattr(p_type, name) is getattr(Precision, name) for name in seams[1]
    )


def _plain_batch_fn(trainer: Trainer) -> Callable[[Trainer, Any, int, bool], Any] | None:
    """:func:`train_batch` with the strategy's and precision's seams fused away, or None where one matters.

    Taken when every seam is the base class's do-nothing (one device, float32) and the run uses
    automatic optimisation with one optimizer and no accumulation, clipping, micro-batching or
    non-finite check. The step is then the four lines of a hand-written loop, with the hooks that
    the module or a callback overrides called at the same points as in :func:`train_batch`; a hook
    nobody overrides costs a test of a local. That saves about 10 us a step on a CPU (the contexts,
    the method hops). Decided once per epoch from the types of the strategy and precision, so a
    subclass overriding any seam takes the general path. Bitwise the same as :func:`train_batch`
    (``tests/test_loop_fast_path.py``).
    """
    module, strategy = trainer.module, trainer.strategy
    assert module is not None
    if (
        not _default_seams(strategy, _TRAIN_SEAMS)
        or not module.automatic_optimization
        or trainer._micro_batcher is not None
        or trainer.accumulate_grad_batches != 1
        or trainer.gradient_clip_val is not None
        or trainer.on_nonfinite is not None
        or len(trainer.optimizers) != 1
    ):
        return None
    device, p, hook = strategy.root_device, trainer.progress, trainer._hook
    # Strategy.step calls the step on strategy.module (the user's module, after the precision's conversion).
    training_step = cast("TrainModule", strategy.module).training_step
    optimizer = trainer.optimizers[0]
    step_schedulers = any(cfg.interval == "step" for cfg in trainer.lr_scheduler_configs)
    batch_start, before_backward, after_backward, before_step, before_zero_grad, batch_end = (
        trainer._overridden(name)
        for name in (
            "on_train_batch_start",
            "on_before_backward",
            "on_after_backward",
            "on_before_optimizer_step",
            "on_before_zero_grad",
            "on_train_batch_end",
        )
    )

    def plain_batch(trainer: Trainer, batch: Any, batch_idx: int, is_last: bool) -> Any:
        trainer._current_batch = batch
        if batch_start and hook("on_train_batch_start", batch, batch_idx) == -1:
            return -1
        trainer._current_batch = batch = move_to_device(batch, device)
        out = training_step(batch, batch_idx)
        loss = _loss_of(out)
        if loss is not None:  # (a step that returned None skips the update, as in _automatic_step)
            if before_backward:
                hook("on_before_backward", loss)
            loss.backward()
            if after_backward:
                hook("on_after_backward")
            p.nonfinite_in_a_row = 0
            if before_step:
                hook("on_before_optimizer_step", optimizer)
            optimizer.step()
            if step_schedulers:
                _step_schedulers(trainer, "step", steps_done=p.global_step + 1)
            if before_zero_grad:
                hook("on_before_zero_grad", optimizer)
            optimizer.zero_grad(set_to_none=True)
            p.global_step += 1
        p.batch_in_epoch = batch_idx + 1
        if batch_end:
            hook("on_train_batch_end", out, batch, batch_idx)
        return out

    return plain_batch


def _automatic_step(trainer: Trainer, batch: Any, batch_idx: int, is_last: bool) -> Any:
    strategy, p = trainer.strategy, trainer.progress
    k = trainer.accumulate_grad_batches
    boundary = (batch_idx + 1) % k == 0 or is_last
    if trainer._micro_batcher is not None:  # Trainer(micro_batch_size=...): see trainer/microbatch.py
        out = train_micro_batches(trainer, batch, batch_idx, boundary)
    else:
        with strategy.no_backward_sync(not boundary):
            with strategy.forward_context():
                out = strategy.step("training_step", batch, batch_idx)
            loss = _loss_of(out)
            if loss is not None and trainer.on_nonfinite is not None and not _loss_is_finite(trainer, loss, batch_idx):
                loss = None
                trainer._window_nonfinite = True
            if loss is not None:
                trainer._hook("on_before_backward", loss)
                strategy.backward(loss / k if k > 1 else loss)
                trainer._hook("on_after_backward")
                trainer._window_has_loss = True
    if boundary and trainer._window_nonfinite:
        _skip_nonfinite_step(trainer)
    elif boundary and trainer._window_has_loss:
        p.nonfinite_in_a_row = 0
        optimizer = trainer.optimizers[0]
        trainer._hook("on_before_optimizer_step", optimizer)
        strategy.clip_gradients(optimizer, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)
        if strategy.optimizer_step(optimizer):
            _step_schedulers(trainer, "step", steps_done=p.global_step + 1)
        else:
            p.skipped_steps += 1
        trainer._hook("on_before_zero_grad", optimizer)
        optimizer.zero_grad(set_to_none=True)
        p.global_step += 1
        trainer._window_has_loss = False
    return out


def _loss_is_finite(trainer: Trainer, loss: torch.Tensor, batch_idx: int) -> bool:
    """Check the loss on the host (a sync, hence opt-in); every rank takes the same decision."""
    bad = (~torch.isfinite(loss.detach())).any().to(torch.int64).reshape(1)
    if trainer.strategy.world_size > 1:
        bad = trainer.strategy.reduce(bad, "max")
    if not bad.item():
        return True
    p = trainer.progress
    where = f"epoch {p.epoch}, global step {p.global_step}, batch {batch_idx}"
    if trainer.on_nonfinite == "raise":
        raise FloatingPointError(
            f"Non-finite training loss ({loss.detach().float().item()}) at {where}. "
            "Trainer(on_nonfinite='skip') drops such steps instead."
        )
    if trainer.on_nonfinite == "warn":
        warnings.warn(f"Non-finite training loss at {where}; training goes on", stacklevel=2)
        return True
    return False


def _skip_nonfinite_step(trainer: Trainer) -> None:
    """Drop the optimizer step of a window that had a non-finite loss: no update, no scheduler move."""
    p = trainer.progress
    for optimizer in trainer.optimizers:
        optimizer.zero_grad(set_to_none=True)
    trainer._window_nonfinite = trainer._window_has_loss = False
    p.nonfinite_skipped += 1
    p.nonfinite_in_a_row += 1
    trainer._log(
        "train/nonfinite_skipped",
        float(p.nonfinite_skipped),
        on_step=True,
        on_epoch=False,
        prog_bar=False,
        sync_dist=False,
        reduce_fx="max",
        batch_size=1,
    )
    if p.nonfinite_in_a_row >= trainer.max_nonfinite_in_a_row:
        raise FloatingPointError(
            f"{p.nonfinite_in_a_row} optimizer steps in a row had a non-finite loss "
            f"(epoch {p.epoch}, global step {p.global_step}); stopping. "
            "Raise Trainer(max_nonfinite_in_a_row=...) to tolerate more."
        )


def eval_loop(trainer: Trainer, stage: str, max_batches: float | None = None) -> dict[str, torch.Tensor]:
    """One pass over ``stage``'s data (``"validate"`` or ``"test"``) without gradients.

    Hook order (``X`` is ``validation`` or ``test``)::

        on_X_start, on_X_epoch_start
        for each batch: on_X_batch_start(batch, i); X_step(batch, i) under forward_context;
                        on_X_batch_end(out, batch, i)
        module.on_X_epoch_end; epoch values computed and logged; callbacks' on_X_epoch_end
        on_X_end

    Returns the epoch-level values (tensors). Python's, NumPy's and torch's random states are the
    same after the loop as before it.
    """
    prefix = "validation" if stage == "validate" else "test"
    module, strategy = trainer.module, trainer.strategy
    assert module is not None
    if not hasattr(module, f"{prefix}_step"):
        raise NotImplementedError(f"{type(module).__name__} does not define {prefix}_step(self, batch, batch_idx)")
    loader = trainer._loaders[stage]
    assert loader is not None
    num = trainer._num_batches(stage, loader)
    if max_batches is not None:
        num = min(num, max_batches)
    trainer.num_val_batches = num
    was_training = module.training
    module.eval()
    store = MetricStore(strategy.reduce)
    # Evaluation leaves the random state as it found it (creating a DataLoader iterator draws from it),
    # so a run resumed from a checkpoint taken before a validation continues exactly.
    rng_before = rng_state()
    try:
        with _logging(trainer, store, _EPOCH_DEFAULTS), torch.no_grad(), strategy.evaluation_context():
            trainer._hook(f"on_{prefix}_start")
            trainer._hook(f"on_{prefix}_epoch_start")
            run_batch = _eval_batch_fn(trainer, prefix)
            for batch_idx, batch, _ in _iterate(loader, num):
                run_batch(batch, batch_idx)
            trainer._call_module(f"on_{prefix}_epoch_end")
            values = store.epoch_values()
            trainer._remember(values, store)
            trainer._emit(values, max(trainer.progress.global_step - 1, 0))
            trainer._call_callbacks(f"on_{prefix}_epoch_end")
            trainer._hook(f"on_{prefix}_end")
    finally:
        store.reset()
        module.train(was_training)
        set_rng_state(rng_before)
    return values


def _eval_batch_fn(trainer: Trainer, prefix: str) -> Callable[[Any, int], None]:
    """One evaluation batch (``prefix`` is ``validation`` or ``test``), as a function made once per loop.

    Where the strategy's and precision's seams are the do-nothing defaults, the batch goes straight to
    the module's step (no context, no method hops), and hooks nobody overrides are not called: the
    loop then costs what a hand-written one does. Otherwise every seam is called, in the same order.
    """
    strategy, hook = trainer.strategy, trainer._hook
    step_name, start_name, end_name = f"{prefix}_step", f"on_{prefix}_batch_start", f"on_{prefix}_batch_end"
    has_start, has_end = trainer._overridden(start_name), trainer._overridden(end_name)

    if _default_seams(strategy, _EVAL_SEAMS):
        device, step = strategy.root_device, getattr(strategy.module, step_name)

        def plain_batch(batch: Any, batch_idx: int) -> None:
            trainer._current_batch = batch
            if has_start:
                hook(start_name, batch, batch_idx)
            trainer._current_batch = batch = move_to_device(batch, device)
            out = step(batch, batch_idx)
            if has_end:
                hook(end_name, out, batch, batch_idx)

        return plain_batch

    def eval_batch(batch: Any, batch_idx: int) -> None:
        trainer._current_batch = batch
        hook(start_name, batch, batch_idx)
        batch = strategy.batch_to_device(batch)
        trainer._current_batch = batch
        with strategy.forward_context():
            out = strategy.step(step_name, batch, batch_idx)
        hook(end_name, out, batch, batch_idx)

    return eval_batch


def predict_loop(trainer: Trainer) -> list[Any]:
    """``predict_step`` over the predict data; returns the outputs in order.

    Hook order: on_predict_start, on_predict_epoch_start, per batch on_predict_batch_start /
    predict_step / on_predict_batch_end, on_predict_epoch_end, on_predict_end.
    """
    module, strategy = trainer.module, trainer.strategy
    assert module is not None
    loader = trainer._loaders["predict"]
    assert loader is not None
    num = trainer._num_batches("predict", loader)
    outputs: list[Any] = []
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad(), strategy.evaluation_context():
            trainer._hook("on_predict_start")
            trainer._hook("on_predict_epoch_start")
            for batch_idx, batch, _ in _iterate(loader, num):
                trainer._hook("on_predict_batch_start", batch, batch_idx)
                batch = strategy.batch_to_device(batch)
                with strategy.forward_context():
                    out = strategy.step("predict_step", batch, batch_idx)
                outputs.append(out)
                trainer._hook("on_predict_batch_end", out, batch, batch_idx)
            trainer._hook("on_predict_epoch_end")
            trainer._hook("on_predict_end")
    finally:
        module.train(was_training)
    return outputs


class ManualOptimizer:
    """What ``self.optimizers()`` returns under manual optimisation.

    ``step()`` goes through the strategy (GradScaler under fp16) and counts a global step;
    everything else is the wrapped ``optimizer``'s.
    """

    def __init__(self, trainer: Trainer, optimizer: torch.optim.Optimizer) -> None:
        self._trainer = trainer
        self.optimizer = optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups."""
        return self.optimizer.param_groups

    def step(self, closure: Any = None) -> bool:
        """Run ``closure`` if given, then step; returns False if the precision skipped the step."""
        if closure is not None:
            closure()
        trainer = self._trainer
        trainer._hook("on_before_optimizer_step", self.optimizer)
        stepped = trainer.strategy.optimizer_step(self.optimizer)
        trainer.progress.global_step += 1
        if not stepped:
            trainer.progress.skipped_steps += 1
        return stepped

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of the wrapped optimizer."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state."""
        return self.optimizer.state_dict()


# ----------------------------------------------------------------- helpers
def _loss_of(out: Any) -> torch.Tensor | None:
    if out is None or isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping):
        if "loss" not in out:
            raise KeyError(f"training_step returned a dict without a 'loss' entry (keys: {sorted(out)})")
        loss = out["loss"]
        if loss is None or isinstance(loss, torch.Tensor):
            return loss
    raise TypeError(f"training_step must return a loss tensor, a dict with 'loss', or None; got {type(out).__name__}")


def _step_schedulers(trainer: Trainer, interval: str, steps_done: int | None = None, metrics_due: bool = True) -> None:
    """Advance the schedulers of ``interval`` whose ``frequency`` divides the count just reached.

    A monitoring scheduler at the ``"epoch"`` interval steps only on a value logged in this epoch:
    stepping ReduceLROnPlateau again on the last validation's value (an epoch that skipped
    validation) would count a plateau epoch that never happened. ``metrics_due`` says whether a
    missing metric is an error now (True) or may still come from a later validation (False).
    """
    if not trainer.lr_scheduler_configs:
        return  # the common case, checked first: this runs every step
    count = steps_done if steps_done is not None else trainer.progress.epoch + 1
    assert trainer.module is not None
    if not trainer.module.automatic_optimization:
        return  # under manual optimisation the user steps schedulers
    for cfg in trainer.lr_scheduler_configs:
        if cfg.interval != interval or count % cfg.frequency:
            continue
        if cfg.monitor is None:
            cfg.scheduler.step()
            continue
        value = trainer.callback_metrics.get(cfg.monitor)
        if interval == "epoch" and cfg.monitor not in trainer._epoch_keys:
            value = None
        if value is None:
            if cfg.strict and metrics_due:
                logged = ", ".join(sorted(trainer.callback_metrics)) or "nothing"
                raise KeyError(
                    f"{type(cfg.scheduler).__name__} monitors {cfg.monitor!r}, which was not logged "
                    f"(logged: {logged}); log it with self.log({cfg.monitor!r}, value)"
                )
            continue
        cfg.scheduler.step(float(value))  # a sync, once per interval


def _validation_enabled(trainer: Trainer) -> bool:
    return (
        trainer._loaders.get("validate") is not None
        and hasattr(trainer.module, "validation_step")
        and trainer.limits["validate"] not in (0, 0.0)
    )


def _val_every(trainer: Trainer, num_batches: float) -> int | None:
    """Training batches between validation runs within an epoch (None: only at the epoch's end)."""
    interval = trainer.val_check_interval
    if isinstance(interval, int):
        return interval
    if math.isinf(num_batches):
        return None
    if interval is None:
        return int(num_batches) or None
    return max(1, int(num_batches * interval))


def _validate_during_fit(trainer: Trainer) -> None:
    eval_loop(trainer, "validate")


def _sanity_check(trainer: Trainer) -> None:
    """Run a few validation batches before training to surface bugs early; their values are dropped."""
    snapshot = (
        dict(trainer.callback_metrics),
        dict(trainer.progress_bar_metrics),
        dict(trainer.logged_metrics),
    )
    trainer.sanity_checking = True
    try:
        trainer._call_callbacks("on_sanity_check_start")
        steps = trainer.num_sanity_val_steps
        eval_loop(trainer, "validate", max_batches=math.inf if steps < 0 else steps)
        trainer._call_callbacks("on_sanity_check_end")
    finally:
        trainer.sanity_checking = False
        trainer.callback_metrics, trainer.progress_bar_metrics, trainer.logged_metrics = snapshot


def _should_stop_training(trainer: Trainer) -> bool:
    p = trainer.progress
    if p.should_stop:
        return True
    if trainer.max_steps != -1 and p.global_step >= trainer.max_steps:
        return True
    max_epochs = trainer.max_epochs
    if max_epochs is not None and max_epochs != -1:
        return p.epoch + (1 if p.epoch_finished else 0) >= max_epochs
    return False


@contextlib.contextmanager
def _logging(trainer: Trainer, store: MetricStore, defaults: tuple[bool, bool]) -> Iterator[None]:
    """Route ``self.log`` to ``store`` with ``defaults`` for (on_step, on_epoch) inside the block."""
    previous = trainer._store, trainer._log_defaults
    trainer._store, trainer._log_defaults = store, defaults
    try:
        yield
    finally:
        trainer._store, trainer._log_defaults = previous


def _iterate(
    loader: Iterable[Any], num: float, start: int = 0, epoch_rng: dict[str, Any] | None = None
) -> Iterator[tuple[int, Any, bool]]:
    """Yield ``(index, batch, is_last)`` for the first ``num`` batches, from index ``start``.

    ``is_last`` comes from the length when known, else from looking one batch ahead. Starting at
    ``start > 0`` (a mid-epoch resume) skips index batches in the sampler, with the epoch's order
    replayed from ``epoch_rng``, where the loader allows it; otherwise it fetches and drops them.
    With a known length the result is a ``zip`` of C iterators, so a batch costs no Python frame.
    """
    if num <= start:
        return iter(())
    sampler = getattr(loader, "batch_sampler", None)
    if start and isinstance(sampler, ResumableBatchSampler):
        sampler.resume(start, epoch_rng)
        rng_now = rng_state()
        iterator = iter(loader)
        set_rng_state(rng_now)  # creating the iterator drew a worker seed; the run had drawn it earlier
    else:
        iterator = iter(loader)
        for _ in itertools.islice(iterator, start):
            pass
    if not math.isinf(num):
        count = int(num) - start
        flags = itertools.chain(itertools.repeat(False, count - 1), (True,))
        return zip(range(start, int(num)), iterator, flags)
    return _look_ahead(iterator, start)


def _look_ahead(iterator: Iterator[Any], start: int) -> Iterator[tuple[int, Any, bool]]:
    """``(index, batch, is_last)`` of a loader without a length: one batch fetched ahead."""
    sentinel = object()
    current = next(iterator, sentinel)
    idx = start
    while current is not sentinel:
        following = next(iterator, sentinel)
        yield idx, current, following is sentinel
        current, idx = following, idx + 1


def _set_sampler_epoch(loader: Iterable[Any], epoch: int) -> None:
    """Tell a distributed (or any epoch-aware) sampler and dataset which epoch it is."""
    for target in (
        getattr(loader, "dataset", None),
        getattr(loader, "sampler", None),
        getattr(getattr(loader, "batch_sampler", None), "sampler", None),
    ):
        set_epoch = getattr(target, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
