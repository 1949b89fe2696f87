"""The training step: one function for every strategy, precision and option (DESIGN.md, "The step").

:func:`make_train_batch` is called once per epoch. It binds every seam of the step (the strategy's and
precision's methods, the hooks, the options) to a local, and returns the function that trains one
batch. A seam the strategy or precision keeps at the base class's do-nothing version is bound to the
plain operation it stands for (``loss.backward``, ``optimizer.step``, ``move_to_device``), a context
that does nothing is not entered, and a hook nobody overrides is bound to None and not called: on
one device in float32 the step costs what the hand-written loop costs, without a second copy of it.
Manual optimisation (``automatic_optimization = False``) has its own short path: ``training_step``
does backward and step itself, through :class:`ManualOptimizer` and ``manual_backward``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from strategies.base import Strategy
from strategies.precision import Precision
from trainer.common.errors import MetricNotLoggedError
from trainer.common.tree import move_to_device
from trainer.dataloaders import check_takes_dataloader_idx, with_last_arg
from trainer.microbatch import micro_batches

if TYPE_CHECKING:
    from trainer.trainer import Trainer

__all__ = [
    "ManualOptimizer",
    "NonFinite",
    "Window",
    "loss_of",
    "make_eval_batch",
    "make_train_batch",
    "manual_backward",
    "step_schedulers",
]

TrainBatch = Callable[[Any, int, bool], Any]
EvalBatch = Callable[[Any, int], Any]


@dataclass
class Window:
    """The accumulation window in progress (kept for a whole ``fit``, as a window may span a resume point)."""

    #: A micro-batch of the window had a loss (so the window ends with an optimizer step).
    has_loss: bool = False
    #: ... had a non-finite loss under ``on_nonfinite="skip"`` (so the window's step is dropped).
    nonfinite: bool = False


def make_train_batch(trainer: Trainer, window: Window) -> TrainBatch:
    """``train_batch(batch, batch_idx, is_last) -> output`` for this epoch (see the module docstring).

    Around the step, in both optimisation modes::

        on_train_batch_start(batch, i)                (the module returning -1 ends the epoch)
        batch = strategy.batch_to_device(batch)
        out = the step (automatic: make_automatic_step; manual: training_step under forward_context)
        on_train_batch_end(out, batch, i)
    """
    strategy, progress, router, hooks = trainer.strategy, trainer.progress, trainer.metric_router, trainer.hooks
    module = trainer.module
    assert module is not None
    to_device = _batch_to_device(strategy)
    batch_start, batch_end = hooks.bound("on_train_batch_start"), hooks.bound("on_train_batch_end")
    if module.automatic_optimization:
        step = make_automatic_step(trainer, window)
    else:
        training_step, forward_context = _step_call(strategy, "training_step"), strategy.forward_context

        def step(batch: Any, batch_idx: int, is_last: bool) -> Any:
            with forward_context():
                return training_step(batch, batch_idx)

    def train_batch(batch: Any, batch_idx: int, is_last: bool) -> Any:
        router.current_batch = batch
        if batch_start is not None and batch_start(batch, batch_idx) == -1:
            return -1
        router.current_batch = batch = to_device(batch)
        out = step(batch, batch_idx, is_last)
        progress.batch_in_epoch = batch_idx + 1  # before the hook: a checkpoint saved there resumes after it
        if batch_end is not None:
            batch_end(out, batch, batch_idx)
        return out

    return train_batch


def make_automatic_step(trainer: Trainer, window: Window) -> TrainBatch:
    """The automatic-optimisation step with its seams bound: ``step(batch, batch_idx, is_last)``.

    For every strategy, precision, accumulation (``k`` batches a step), clipping and micro-batching::

        for piece, share in micro-batches of batch:       (the batch itself, share 1, unless micro_batch_size)
            with strategy.no_backward_sync(unless the window's last piece):
                with strategy.forward_context(): out = training_step(piece, i)
                loss = the loss of out, through the non-finite policy
                on_before_backward(loss); strategy.backward(loss * share / k); on_after_backward()
        if the window is complete (k batches, or the epoch's last):
            on_before_optimizer_step(optimizer)
            strategy.clip_gradients(optimizer, ...)      (unscales exactly once first)
            if strategy.optimizer_step(optimizer): step-interval schedulers advance
            on_before_zero_grad(optimizer); optimizer.zero_grad(set_to_none=True); global_step += 1
    """
    strategy, progress, hooks = trainer.strategy, trainer.progress, trainer.hooks
    precision = strategy.precision
    k = trainer.accumulate_grad_batches
    optimizer = trainer.optimizers[0]
    clip_val, clip_algorithm = trainer.gradient_clip_val, trainer.gradient_clip_algorithm
    training_step = _step_call(strategy, "training_step")
    # Contexts that do nothing are not entered (a ``with`` costs as much as a small kernel launch).
    no_backward_sync = None if _keeps(strategy, Strategy, "no_backward_sync") else strategy.no_backward_sync
    forward_context = _forward_context(strategy)
    plain_backward = _keeps(strategy, Strategy, "backward") and _keeps(precision, Precision, "backward")
    backward = torch.Tensor.backward if plain_backward else strategy.backward
    plain_step = _keeps(strategy, Strategy, "optimizer_step") and _keeps(precision, Precision, "optimizer_step")
    # Called without arguments: the optimizer's own (instance-bound: schedulers patch it) ``step``, whose
    # None counts as a step taken, or the strategy's, which returns False for a skipped step (fp16).
    optimizer_step = optimizer.step if plain_step else functools.partial(strategy.optimizer_step, optimizer)
    clip = strategy.clip_gradients if clip_val is not None else None
    nonfinite = NonFinite(trainer) if trainer.on_nonfinite is not None else None
    schedulers = any(cfg.interval == "step" for cfg in trainer.lr_scheduler_configs)
    before_backward, after_backward, before_optimizer_step, before_zero_grad = (
        hooks.bound(name)
        for name in ("on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad")
    )

    def forward_backward(piece: Any, batch_idx: int, sync: bool, share: float = 1.0) -> Any:
        """Forward and backward of one piece: the loss times ``share / k`` is accumulated into the gradients."""
        if forward_context is None:
            out = training_step(piece, batch_idx)
        else:
            with forward_context():
                out = training_step(piece, batch_idx)
        loss = loss_of(out)
        if loss is not None and nonfinite is not None and not nonfinite.check(loss, batch_idx):
            loss, window.nonfinite = None, True
        if loss is not None:
            if before_backward is not None:
                before_backward(loss)
            if share != 1.0:
                loss = loss * share / k
            elif k != 1:
                loss = loss / k
            backward(loss)
            if after_backward is not None:
                after_backward()
            window.has_loss = True
        return out

    def synced(piece: Any, batch_idx: int, sync: bool, share: float = 1.0) -> Any:
        assert no_backward_sync is not None
        with no_backward_sync(not sync):  # DDP/FSDP: gradients are synced on the window's last piece only
            return forward_backward(piece, batch_idx, sync, share)

    accumulate = forward_backward if no_backward_sync is None else synced
    # Trainer(micro_batch_size=...): the batch in pieces, each through accumulate (trainer/microbatch.py).
    micro = trainer.micro_batcher
    run_pieces = accumulate if micro is None else functools.partial(micro_batches, trainer, window, accumulate)

    def step(batch: Any, batch_idx: int, is_last: bool) -> Any:
        window_ends = is_last or (batch_idx + 1) % k == 0
        out = run_pieces(batch, batch_idx, window_ends)
        if not window_ends or not (window.has_loss or window.nonfinite):
            return out
        if window.nonfinite:
            assert nonfinite is not None
            nonfinite.skip_step(window)
            return out
        progress.nonfinite_in_a_row = 0
        if before_optimizer_step is not None:
            before_optimizer_step(optimizer)
        if clip is not None:
            clip(optimizer, clip_val, clip_algorithm)
        if optimizer_step() is not False:
            if schedulers:
                step_schedulers(trainer, "step", steps_done=progress.global_step + 1)
        else:
            progress.skipped_steps += 1
        if before_zero_grad is not None:
            before_zero_grad(optimizer)
        optimizer.zero_grad(set_to_none=True)
        progress.global_step += 1
        window.has_loss = False
        return out

    return step


def make_eval_batch(trainer: Trainer, step_name: str, prefix: str, dataloader_idx: int | None = None) -> EvalBatch:
    """``eval_batch(batch, batch_idx) -> output`` for ``validation``/``test``/``predict`` (seams bound once).

    Hook order: ``on_<prefix>_batch_start(batch, i)``; ``<step_name>(batch, i)`` under forward_context;
    ``on_<prefix>_batch_end(out, batch, i)``. With ``dataloader_idx`` (one of several loaders) the step
    and both hooks get it as their last argument, as in Lightning.
    """
    strategy, router, hooks = trainer.strategy, trainer.metric_router, trainer.hooks
    to_device, step = _batch_to_device(strategy), _step_call(strategy, step_name)
    start, end = hooks.bound(f"on_{prefix}_batch_start"), hooks.bound(f"on_{prefix}_batch_end")
    forward_context = _forward_context(strategy)
    if dataloader_idx is not None:
        check_takes_dataloader_idx(trainer.module, step_name)
        step, start, end = (with_last_arg(fn, dataloader_idx) for fn in (step, start, end))

    def eval_batch(batch: Any, batch_idx: int) -> Any:
        router.current_batch = batch
        if start is not None:
            start(batch, batch_idx)
        router.current_batch = batch = to_device(batch)
        if forward_context is None:
            out = step(batch, batch_idx)
        else:
            with forward_context():
                out = step(batch, batch_idx)
        if end is not None:
            end(out, batch, batch_idx)
        return out

    return eval_batch


class NonFinite:
    """``Trainer(on_nonfinite=...)``: what a NaN/inf training loss does (raise, skip the step, warn)."""

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer
        self.policy = trainer.on_nonfinite

    def check(self, loss: torch.Tensor, batch_idx: int) -> bool:
        """Whether to backpropagate ``loss``; a host read (a sync, hence opt-in); every rank decides alike."""
        t = self._trainer
        bad = (~torch.isfinite(loss.detach())).any().to(torch.int64).reshape(1)
        if t.strategy.world_size > 1:
            bad = t.strategy.reduce(bad, "max")
        if not bad.item():
            return True
        p = t.progress
        where = f"epoch {p.epoch}, global step {p.global_step}, batch {batch_idx}"
        if self.policy == "raise":
            raise FloatingPointError(
                f"Non-finite training loss ({loss.detach().float().item()}) at {where}. "
                "Trainer(on_nonfinite='skip') drops such steps instead."
            )
        if self.policy == "warn":
            warnings.warn(f"Non-finite training loss at {where}; training goes on", stacklevel=2)
            return True
        return False

    def skip_step(self, window: Window) -> None:
        """Drop the optimizer step of a window that had a non-finite loss: no update, no scheduler move."""
        t = self._trainer
        p = t.progress
        for optimizer in t.optimizers:
            optimizer.zero_grad(set_to_none=True)
        window.nonfinite = window.has_loss = False
        p.nonfinite_skipped += 1
        p.nonfinite_in_a_row += 1
        t.metric_router.log("train/nonfinite_skipped", float(p.nonfinite_skipped), True, False, False, False, "max", 1)
        if p.nonfinite_in_a_row >= t.max_nonfinite_in_a_row:
            raise FloatingPointError(
                f"{p.nonfinite_in_a_row} optimizer steps in a row had a non-finite loss "
                f"(epoch {p.epoch}, global step {p.global_step}); stopping. "
                "Raise Trainer(max_nonfinite_in_a_row=...) to tolerate more."
            )


class ManualOptimizer:
    """What ``self.optimizers()`` returns under manual optimisation.

    ``step()`` goes through the strategy (GradScaler under fp16) and counts a global step; under
    ``on_nonfinite="skip"`` a step after a non-finite ``manual_backward`` is dropped instead (gradients
    zeroed, no update). Everything else is the wrapped ``optimizer``'s.
    """

    def __init__(self, trainer: Trainer, optimizer: torch.optim.Optimizer, window: Window) -> None:
        self._trainer = trainer
        self._window = window
        self.optimizer = optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups."""
        return self.optimizer.param_groups

    def step(self, closure: Any = None) -> bool:
        """Run ``closure`` if given, then step; returns False if the step was skipped (fp16 overflow, NaN)."""
        if closure is not None:
            closure()
        trainer = self._trainer
        if self._window.nonfinite:
            NonFinite(trainer).skip_step(self._window)
            return False
        trainer.hooks("on_before_optimizer_step", self.optimizer)
        stepped = trainer.strategy.optimizer_step(self.optimizer)
        trainer.progress.global_step += 1
        trainer.progress.nonfinite_in_a_row = 0
        if not stepped:
            trainer.progress.skipped_steps += 1
        return stepped

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of the wrapped optimizer."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state."""
        return self.optimizer.state_dict()


def manual_backward(trainer: Trainer, loss: torch.Tensor) -> None:
    """``TrainModule.manual_backward``: the non-finite policy, then the strategy's backward."""
    if trainer.on_nonfinite is not None and not NonFinite(trainer).check(loss, trainer.progress.batch_in_epoch):
        trainer.window.nonfinite = True
        return
    trainer.strategy.backward(loss)


def loss_of(out: Any) -> torch.Tensor | None:
    """The loss in what ``training_step`` returned: a tensor, a dict's ``"loss"``, or None (skip)."""
    if out is None or isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping):
        if "loss" not in out:
            raise KeyError(f"training_step returned a dict without a 'loss' entry (keys: {sorted(out)})")
        loss = out["loss"]
        if loss is None or isinstance(loss, torch.Tensor):
            return loss
    raise TypeError(f"training_step must return a loss tensor, a dict with 'loss', or None; got {type(out).__name__}")


def step_schedulers(trainer: Trainer, interval: str, steps_done: int | None = None, metrics_due: bool = True) -> None:
    """Advance the schedulers of ``interval`` whose ``frequency`` divides the count just reached.

    A monitoring scheduler at the ``"epoch"`` interval steps only on a value logged in this epoch:
    stepping ReduceLROnPlateau again on the last validation's value (an epoch that skipped
    validation) would count a plateau epoch that never happened. ``metrics_due`` says whether a
    missing metric is an error now (True) or may still come from a later validation (False).
    """
    if not trainer.lr_scheduler_configs:
        return  # the common case, checked first
    count = steps_done if steps_done is not None else trainer.progress.epoch + 1
    assert trainer.module is not None
    if not trainer.module.automatic_optimization:
        return  # under manual optimisation the user steps schedulers
    metrics = trainer.callback_metrics
    for cfg in trainer.lr_scheduler_configs:
        if cfg.interval != interval or count % cfg.frequency:
            continue
        if cfg.monitor is None:
            cfg.scheduler.step()
            continue
        value = metrics.get(cfg.monitor)
        if interval == "epoch" and cfg.monitor not in trainer.metric_router.epoch_keys:
            value = None
        if value is None:
            if cfg.strict and metrics_due:
                logged = ", ".join(sorted(metrics)) or "nothing"
                raise MetricNotLoggedError(  # a KeyError too
                    f"{type(cfg.scheduler).__name__} monitors {cfg.monitor!r}, which was not logged "
                    f"(logged: {logged}); log it with self.log({cfg.monitor!r}, value)"
                )
            continue
        cfg.scheduler.step(float(value))  # a sync, once per interval


def _keeps(obj: object, base: type, name: str) -> bool:
    """Whether ``obj``'s class keeps ``base``'s version of ``name`` (compared on the types, so a subclass
    overriding it is seen even if it calls ``super()``)."""
    return getattr(type(obj), name) is getattr(base, name)


def _forward_context(strategy: Strategy) -> Callable[[], Any] | None:
    """``strategy.forward_context``, or None where neither the strategy nor its precision has one (autocast)."""
    if _keeps(strategy, Strategy, "forward_context") and _keeps(strategy.precision, Precision, "forward_context"):
        return None
    return strategy.forward_context


def _batch_to_device(strategy: Strategy) -> Callable[[Any], Any]:
    """``strategy.batch_to_device``, or the plain move where neither the strategy nor its precision changes it."""
    if _keeps(strategy, Strategy, "batch_to_device") and _keeps(strategy.precision, Precision, "convert_input"):
        return functools.partial(move_to_device, device=strategy.root_device)
    return strategy.batch_to_device


def _step_call(strategy: Strategy, name: str) -> Callable[..., Any]:
    """The user's step ``name`` as the strategy calls it (through its wrapper where it routes steps)."""
    if _keeps(strategy, Strategy, "step"):
        assert strategy.module is not None
        return getattr(strategy.module, name)
    return functools.partial(strategy.step, name)
