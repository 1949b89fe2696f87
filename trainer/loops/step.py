"""The training step: one function for every strategy, precision and option (docs/architecture.md, "The step").

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
import inspect
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from strategies.base import Strategy
from strategies.precision import Precision
from trainer.common.errors import ClosureNotRunError
from trainer.common.tree import device_mover
from trainer.data.microbatch import micro_batches
from trainer.loops.dataloader_iter import make_fetching_eval_batch, make_iter_train_batch, takes_dataloader_iter
from trainer.loops.optimizer_step import (
    ManualOptimizer,
    NonFinite,
    StepOptimizer,
    Window,
    batch_outputs,
    loss_of,
    manual_backward,
    manual_output,
    needs_closure,
    step_schedulers,
    zero_grad_hook,
)
from trainer.loops.signatures import check_takes_dataloader_idx, with_last_arg
from trainer.module import TrainModule
from trainer.profilers.base import profiled, strategy_action

if TYPE_CHECKING:
    from trainer.run_state import RunState
    from trainer.trainer import Trainer

__all__ = [
    "ManualOptimizer",
    "NonFinite",
    "StepOptimizer",
    "Window",
    "loss_of",
    "make_eval_batch",
    "make_train_batch",
    "manual_backward",
    "step_schedulers",
]

_Tensor = torch.Tensor
TrainBatch = Callable[[Any, int, bool], Any]
EvalBatch = Callable[[Any, int], Any]


def make_train_batch(trainer: Trainer, state: RunState, last_share: float | None = None) -> TrainBatch:
    """``train_batch(batch, batch_idx, is_last) -> output`` for this epoch (see the module docstring).

    Around the step, in both optimisation modes::

        batch = on_before_batch_transfer(batch, 0)        (the data module's hook if it overrides it, else the module's)
        batch = transfer_batch_to_device(batch, device, 0) (default: strategy.batch_to_device)
        batch = on_after_batch_transfer(batch, 0)
        on_train_batch_start(batch, i)                (the module returning -1 ends the epoch)
        out = the step (automatic: make_automatic_step; manual: training_step under forward_context)
        on_train_batch_end(out, batch, i)

    ``last_share``: the factor of the epoch's last batch's loss under DDP when that global batch was
    split unevenly (:func:`~trainer.loops.iteration.last_batch_share`); automatic optimisation only.
    """
    strategy, progress, router, hooks = trainer.strategy, state.progress, trainer.metric_router, state.hooks
    module = state.module
    assert module is not None
    profiler = trainer.profiler  # seams are wrapped in its actions only when it profiles (else unchanged)
    to_device = profiled(profiler, strategy_action(strategy, "batch_to_device"), _batch_to_device(strategy, trainer))
    batch_start, batch_end = hooks.bound("on_train_batch_start"), hooks.bound("on_train_batch_end")
    if module.automatic_optimization:
        step = make_automatic_step(trainer, state, last_share)
    else:
        training_step = profiled(
            profiler, strategy_action(strategy, "training_step"), _step_call(strategy, "training_step")
        )
        forward_context = strategy.forward_context

        def step(batch: Any, batch_idx: int, is_last: bool) -> Any:
            with forward_context():
                return manual_output(training_step(batch, batch_idx), module)

    if takes_dataloader_iter(module.training_step):  # the step fetches its batches (trainer/loops/dataloader_iter.py)
        return profiled(
            profiler, "run_training_batch", make_iter_train_batch(state, step, batch_start, batch_end, router)
        )

    # Lightning's outputs for on_train_batch_end (a dict, the loss detached), shaped only where user code reads them.
    shape = hooks.reaches_user_code("on_train_batch_end")
    automatic, k = module.automatic_optimization, trainer.accumulate_grad_batches

    def train_batch(batch: Any, batch_idx: int, is_last: bool) -> Any:
        if batch is None:  # Lightning's rule: no step for it, on_train_batch_end still told (outputs None)
            return _none_batch(batch_end, progress, batch_idx)
        router.current_batch = batch = to_device(batch)
        if batch_start is not None and batch_start(batch, batch_idx) == -1:
            return -1
        out = step(batch, batch_idx, is_last)
        progress.batch_in_epoch = batch_idx + 1  # before the hook: a checkpoint saved there resumes after it
        if batch_end is not None:
            batch_end(batch_outputs(out, automatic, k) if shape else out, batch, batch_idx)
        return out

    return profiled(profiler, "run_training_batch", train_batch)


def _none_batch(batch_end: Callable[..., Any] | None, progress: Any, batch_idx: int) -> None:
    """A batch the training loader yielded as None: said, then skipped (no transfer, no step, no
    ``on_train_batch_start``); ``on_train_batch_end`` receives None for its outputs and its batch."""
    warnings.warn(
        "train_dataloader yielded None. If this was on purpose, ignore this warning... (batch "
        f"{batch_idx} is skipped: no training_step, no optimizer step)",
        UserWarning,
        stacklevel=3,
    )
    progress.batch_in_epoch = batch_idx + 1
    if batch_end is not None:
        batch_end(None, None, batch_idx)


def make_automatic_step(trainer: Trainer, state: RunState, last_share: float | None = None) -> TrainBatch:
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
    strategy, progress, hooks, window = trainer.strategy, state.progress, state.hooks, state.window
    precision = strategy.precision
    k = trainer.accumulate_grad_batches
    optimizer = state.optimizers[0]
    clip_val, given_algorithm = trainer.gradient_clip_val, trainer.gradient_clip_algorithm  # None: not given
    clip_algorithm = given_algorithm or "norm"
    training_step = _step_call(strategy, "training_step")
    # Contexts that do nothing are not entered (a ``with`` costs as much as a small kernel launch).
    no_backward_sync = None if _keeps(strategy, Strategy, "no_backward_sync") else strategy.no_backward_sync
    forward_context = _forward_context(strategy)
    plain_backward = _keeps(strategy, Strategy, "backward") and all(
        _keeps(precision, Precision, name) for name in ("pre_backward", "backward", "post_backward")
    )
    backward: Callable[[torch.Tensor], Any] = torch.Tensor.backward if plain_backward else strategy.backward
    plain_step = _keeps(strategy, Strategy, "optimizer_step") and all(
        _keeps(precision, Precision, name) for name in ("optimizer_step", "step_taken")
    )
    # Called without arguments: the optimizer's own (instance-bound: schedulers patch it) ``step``, whose
    # None counts as a step taken, or the strategy's, which returns False for a skipped step (fp16).
    optimizer_step = optimizer.step if plain_step else functools.partial(strategy.optimizer_step, optimizer)
    # The module's optimisation hooks, bound once; each keeps the plain path above when not overridden.
    module = state.module
    assert module is not None
    clip: Callable[[torch.optim.Optimizer, Any, str], Any] | None = (
        strategy.clip_gradients if clip_val else None  # 0 clips nothing, as in Lightning
    )
    if clip is not None and type(precision).clip_gradients.__module__.split(".")[0] != "strategies":
        clip = precision.clip_gradients  # a precision plugin of the user's clips itself, as in Lightning
    if not _keeps(module, TrainModule, "configure_gradient_clipping"):  # every step, with Lightning's arguments
        clip = functools.partial(_configure_clipping, module.configure_gradient_clipping, algorithm=given_algorithm)
    user_optimizer_step = None if _keeps(module, TrainModule, "optimizer_step") else module.optimizer_step
    zero_grad = (
        _zero_grad_to_none(optimizer)
        if _keeps(module, TrainModule, "optimizer_zero_grad")
        else functools.partial(zero_grad_hook, module.optimizer_zero_grad, progress, optimizer)
    )
    if not _keeps(module, TrainModule, "backward"):
        if plain_backward:
            backward = module.backward
        elif _keeps(strategy, Strategy, "backward"):  # the precision scales, then calls it (Lightning's order)
            backward = functools.partial(_backward_through, precision, module)
        else:
            raise ValueError(
                f"{type(module).__name__} overrides backward(), which {type(strategy).__name__} "
                "cannot call (it runs backward itself); remove the override"
            )
    nonfinite = NonFinite(trainer) if trainer.on_nonfinite is not None else None
    distributed = strategy.world_size > 1
    schedulers = any(cfg.interval == "step" for cfg in state.lr_scheduler_configs)
    before_backward, after_backward, before_optimizer_step, before_zero_grad = (
        hooks.bound(name)
        for name in ("on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad")
    )
    # With a profiler each seam is wrapped in its action, once, here; without one it is the seam itself.
    profiler = trainer.profiler
    training_step = profiled(profiler, strategy_action(strategy, "training_step"), training_step)
    backward = profiled(profiler, strategy_action(strategy, "backward"), backward)
    optimizer_step = profiled(profiler, "optimizer_step", optimizer_step)
    zero_grad = profiled(profiler, f"[LightningModule]{type(module).__name__}.optimizer_zero_grad", zero_grad)
    clip = profiled(profiler, "clip_gradients", clip)
    user_optimizer_step = profiled(
        profiler, f"[LightningModule]{type(module).__name__}.optimizer_step", user_optimizer_step
    )

    def forward_backward(piece: Any, batch_idx: int, sync: bool, share: float = 1.0) -> Any:
        """Forward and backward of one piece: the loss times ``share / k`` is accumulated into the gradients."""
        if forward_context is None:
            out = training_step(piece, batch_idx)
        else:
            with forward_context():
                out = training_step(piece, batch_idx)
        loss = out if type(out) is _Tensor else loss_of(out)
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
        elif distributed and not window.nonfinite:
            raise RuntimeError(  # Lightning's words: the other processes would wait for this one's gradients
                "Skipping the `training_step` by returning None in distributed training is not supported. It is "
                "recommended that you rewrite your training logic to avoid having to skip the step in the first "
                f"place. ({type(module).__name__}.training_step returned None for batch {batch_idx} on rank "
                f"{strategy.global_rank} of {strategy.world_size}.)"
            )
        return out

    def synced(piece: Any, batch_idx: int, sync: bool, share: float = 1.0) -> Any:
        assert no_backward_sync is not None
        with no_backward_sync(not sync):  # DDP/FSDP: gradients are synced on the window's last piece only
            return forward_backward(piece, batch_idx, sync, share)

    accumulate = forward_backward if no_backward_sync is None else synced
    # Trainer(micro_batch_size=...): the batch in pieces, each through accumulate (trainer/data/microbatch.py).
    micro = trainer.micro_batcher
    run_pieces: Callable[[Any, int, bool], Any] = (
        accumulate if micro is None else functools.partial(micro_batches, trainer, window, accumulate)
    )

    def finish_window() -> bool:
        """After the window's backward: the optimizer step; whether a step counts (not skipped for NaN).

        A window whose every ``training_step`` returned None counts as a step, as in Lightning (which
        hands the optimizer a closure giving None): ``on_before_optimizer_step``, the step-interval
        schedulers and ``global_step`` move; the optimizer's own step is left out, as no gradient
        exists for it to apply (and a ``GradScaler`` refuses a step without one).
        """
        if window.nonfinite:
            assert nonfinite is not None
            nonfinite.skip_step(window)
            return False
        progress.nonfinite_in_a_row = 0
        if before_optimizer_step is not None:
            before_optimizer_step(optimizer)
        if not window.has_loss:
            if schedulers:
                step_schedulers(trainer, "step", steps_done=progress.global_step + 1)
            return True
        if clip is not None:
            clip(optimizer, clip_val, clip_algorithm)
        if optimizer_step() is not False:
            if schedulers:
                step_schedulers(trainer, "step", steps_done=progress.global_step + 1)
        else:
            progress.skipped_steps += 1
        return True

    def end_window() -> None:
        if before_zero_grad is not None:
            before_zero_grad(optimizer)
        zero_grad()
        progress.global_step += 1
        window.has_loss = False

    def step(batch: Any, batch_idx: int, is_last: bool) -> Any:
        window_ends = is_last or (batch_idx + 1) % k == 0
        if window_ends and user_optimizer_step is not None:
            return stepped_by_module(batch, batch_idx)
        out = run_pieces(batch, batch_idx, window_ends)
        if window_ends and finish_window():
            # end_window() written out: this runs every step, a call less
            if before_zero_grad is not None:
                before_zero_grad(optimizer)
            zero_grad()
            progress.global_step += 1
            window.has_loss = False
        return out

    def stepped_by_module(batch: Any, batch_idx: int) -> Any:
        """The window's end through the module's ``optimizer_step``: its closure runs forward and backward."""
        outputs: list[Any] = []

        def optimizer_closure() -> torch.Tensor | None:
            outputs.append(run_pieces(batch, batch_idx, True))
            return loss_of(outputs[-1])

        handle = StepOptimizer(optimizer, finish_window)
        assert user_optimizer_step is not None
        user_optimizer_step(progress.epoch, batch_idx, handle, optimizer_closure)
        if not outputs:
            raise ClosureNotRunError(  # Lightning's words first
                "The closure hasn't been executed. HINT: did you call `optimizer_closure()` in your "
                f"`optimizer_step` hook? {type(module).__name__}.optimizer_step did not run optimizer_closure "
                "(forward and backward); call optimizer.step(closure=optimizer_closure)"
            )
        if handle.counted:
            end_window()
        return outputs[-1]

    chosen: TrainBatch = step
    if needs_closure(optimizer):  # read once: LBFGS and the like
        chosen = _closure_step(
            trainer,
            state,
            optimizer,
            lambda *a: run_pieces(*a),
            (clip, clip_val, clip_algorithm),
            zero_grad,
            user_optimizer_step,
            profiler,
        )
    if last_share is None:
        return chosen
    # The epoch ends on an unevenly split global batch: its loss is scaled by this rank's share, bound
    # here so that every other step, and every epoch without such a batch, runs the plain step.
    share_of_last = last_share

    def weighted(piece: Any, batch_idx: int, sync: bool, share: float = 1.0) -> Any:
        return accumulate(piece, batch_idx, sync, share * share_of_last)

    last_pieces = weighted if micro is None else functools.partial(micro_batches, trainer, window, weighted)
    even_step = chosen

    def step_ending_uneven(batch: Any, batch_idx: int, is_last: bool) -> Any:
        nonlocal run_pieces
        if is_last:
            run_pieces = last_pieces
        return even_step(batch, batch_idx, is_last)

    return step_ending_uneven


def _closure_step(
    trainer: Trainer,
    state: RunState,
    optimizer: torch.optim.Optimizer,
    run_pieces: Callable[[Any, int, bool], Any],
    clipping: tuple[Callable[[torch.optim.Optimizer, Any, str], Any] | None, Any, str],
    zero_grad: Callable[[], Any],
    user_optimizer_step: Callable[..., Any] | None,
    profiler: Any,
) -> TrainBatch:
    """The automatic step for an optimizer whose ``step(closure)`` needs the closure (LBFGS), as Lightning runs it.

    The window's last batch is run by the optimizer through a closure it may call several times, under
    grad mode (an optimizer's ``step`` may run under ``no_grad``): ``on_before_zero_grad`` and
    ``zero_grad`` first where the batch opens its window, then forward and backward, then
    ``on_before_optimizer_step`` and clipping; it returns the loss (divided by the accumulation ``k``).
    A window's other batches zero the gradients when they open it, then accumulate. Gradients are not
    zeroed after the step: each closure call zeroes them, as in Lightning (so ``zero_grad`` runs as
    often as the optimizer evaluates the closure). A module's ``optimizer_step`` gets that closure as its
    ``optimizer_closure``, and its ``optimizer.step(closure=...)`` hands it to the optimizer the same way.
    """
    strategy, progress, window, hooks = trainer.strategy, state.progress, state.window, state.hooks
    clip, clip_val, clip_algorithm = clipping
    if trainer.on_nonfinite is not None:
        raise ValueError(
            f"Trainer(on_nonfinite={trainer.on_nonfinite!r}) cannot drop a step of {type(optimizer).__name__}, whose "
            "step(closure) runs forward and backward itself; leave on_nonfinite=None with this optimizer"
        )
    k = trainer.accumulate_grad_batches
    schedulers = any(cfg.interval == "step" for cfg in state.lr_scheduler_configs)
    before_optimizer_step, before_zero_grad = (
        hooks.bound("on_before_optimizer_step"),
        hooks.bound("on_before_zero_grad"),
    )
    plain = _keeps(strategy, Strategy, "optimizer_step") and all(
        _keeps(strategy.precision, Precision, name) for name in ("optimizer_step", "step_taken")
    )
    optimizer_step: Callable[..., Any] = profiled(
        profiler, "optimizer_step", optimizer.step if plain else functools.partial(strategy.optimizer_step, optimizer)
    )

    def zero_window() -> None:
        if before_zero_grad is not None:
            before_zero_grad(optimizer)
        zero_grad()

    def take_step(forward_backward: Callable[[], Any] | None) -> bool:
        """The optimizer's step, handed the closure: ``forward_backward``, then the hook and clipping."""

        def closure() -> Any:
            with torch.enable_grad():
                loss = None if forward_backward is None else forward_backward()
                if before_optimizer_step is not None:
                    before_optimizer_step(optimizer)
                if clip is not None and window.has_loss:
                    clip(optimizer, clip_val, clip_algorithm)
            return loss

        if optimizer_step(closure=closure) is not False:
            if schedulers:
                step_schedulers(trainer, "step", steps_done=progress.global_step + 1)
        else:
            progress.skipped_steps += 1
        return True

    def step(batch: Any, batch_idx: int, is_last: bool) -> Any:
        opens = batch_idx % k == 0
        if not (is_last or (batch_idx + 1) % k == 0):
            if opens:
                zero_window()
            return run_pieces(batch, batch_idx, False)
        outputs: list[Any] = []

        def forward_backward() -> torch.Tensor | None:
            if opens:
                zero_window()
            outputs.append(run_pieces(batch, batch_idx, True))
            loss = loss_of(outputs[-1])
            return None if loss is None else (loss.detach() if k == 1 else loss.detach() / k)

        if user_optimizer_step is None:
            counted = take_step(forward_backward)
        else:  # the module's optimizer_step: its optimizer.step(closure=...) reaches take_step
            handle = StepOptimizer(optimizer, bool, step_with=take_step)
            user_optimizer_step(progress.epoch, batch_idx, handle, forward_backward)
            counted = handle.counted
        if not outputs:
            raise ClosureNotRunError(  # Lightning's words first
                "The closure hasn't been executed. HINT: did you call `optimizer_closure()` in your `optimizer_step` "
                f"hook? Neither {type(optimizer).__name__}.step nor the module's optimizer_step ran the closure "
                "(forward and backward)"
            )
        if counted:
            progress.global_step += 1
            window.has_loss = False
        return outputs[-1]

    return step


def make_eval_batch(
    trainer: Trainer, state: RunState, step_name: str, prefix: str, dataloader_idx: int | None = None
) -> EvalBatch:
    """``eval_batch(batch, batch_idx) -> output`` for ``validation``/``test``/``predict`` (seams bound once).

    Hook order: the batch-transfer hooks (as in :func:`make_train_batch`); ``on_<prefix>_batch_start(batch, i)``;
    ``<step_name>(batch, i)`` under forward_context; ``on_<prefix>_batch_end(out, batch, i)``. With
    ``dataloader_idx`` (one of several loaders) the step and both hooks get it as their last argument,
    as in Lightning. A step that takes ``dataloader_iter`` gets ``eval_batch(dataloader_iter, 0)``
    (:func:`~trainer.loops.dataloader_iter.make_fetching_eval_batch`).
    """
    strategy, router, hooks = trainer.strategy, trainer.metric_router, state.hooks
    to_device, step = _batch_to_device(strategy, trainer, dataloader_idx or 0), _step_call(strategy, step_name)
    to_device = profiled(trainer.profiler, strategy_action(strategy, "batch_to_device"), to_device)
    step = profiled(trainer.profiler, strategy_action(strategy, step_name), step)
    start, end = hooks.bound(f"on_{prefix}_batch_start"), hooks.bound(f"on_{prefix}_batch_end")
    forward_context = _forward_context(strategy)
    check_takes_dataloader_idx(state.module, prefix, several=dataloader_idx is not None)
    if takes_dataloader_iter(getattr(state.module, step_name)):  # trainer/loops/dataloader_iter.py
        return make_fetching_eval_batch(step, forward_context, start, end, several=dataloader_idx is not None)
    if dataloader_idx is not None:
        step, start, end = (with_last_arg(fn, dataloader_idx) for fn in (step, start, end))

    def eval_batch(batch: Any, batch_idx: int) -> Any:
        router.current_batch = batch = to_device(batch)
        if start is not None:
            start(batch, batch_idx)
        if forward_context is None:
            out = step(batch, batch_idx)
        else:
            with forward_context():
                out = step(batch, batch_idx)
        if end is not None:
            end(out, batch, batch_idx)
        return out

    return eval_batch


def _zero_grad_to_none(optimizer: torch.optim.Optimizer) -> Callable[[], Any]:
    """``optimizer.zero_grad(set_to_none=True)`` as a call without arguments: the method itself where that
    is already its default (torch's optimizers), sparing a keyword argument every step."""
    try:
        default = inspect.signature(optimizer.zero_grad).parameters["set_to_none"].default
    except (KeyError, TypeError, ValueError):
        default = None
    return optimizer.zero_grad if default is True else functools.partial(optimizer.zero_grad, set_to_none=True)


def _configure_clipping(hook: Callable[..., Any], optimizer: Any, clip_val: Any, _: Any, algorithm: Any) -> Any:
    """The module's ``configure_gradient_clipping``, called with Lightning's keywords and values."""
    return hook(optimizer, gradient_clip_val=clip_val, gradient_clip_algorithm=algorithm)


def _backward_through(precision: Precision, module: TrainModule, loss: torch.Tensor) -> None:
    """The strategy's backward with the module's own ``backward`` at its heart, as Lightning runs it:
    the precision prepares the loss (scales it under fp16) and calls ``module.backward`` with it."""
    loss = precision.pre_backward(loss, module)
    precision.backward(loss, module, None)
    precision.post_backward(loss, module)


def _keeps(obj: object, base: type, name: str) -> bool:
    """Whether ``obj.name`` is ``base``'s own method, so the plain path may stand in for it.

    Anything else is called: a subclass's override (even one calling ``super()``), and a callable set
    on the instance (a wrapper or ``Mock`` around the default, as Lightning's hook tests set), which a
    comparison of the types alone would miss.
    """
    return getattr(getattr(obj, name), "__func__", None) is getattr(base, name)


def _forward_context(strategy: Strategy) -> Callable[[], Any] | None:
    """``strategy.forward_context``, or None where neither the strategy nor its precision has one (autocast)."""
    if _keeps(strategy, Strategy, "forward_context") and _keeps(strategy.precision, Precision, "forward_context"):
        return None
    return strategy.forward_context


def _batch_to_device(
    strategy: Strategy, trainer: Trainer | None = None, dataloader_idx: int = 0
) -> Callable[[Any], Any]:
    """The batch transfer: the user's hooks where overridden around ``strategy.batch_to_device``, or the
    plain move where neither the strategy nor its precision changes it (bound once; no cost when unused).

    ``on_before_batch_transfer``/``transfer_batch_to_device``/``on_after_batch_transfer`` are the data
    module's when it overrides them, else the module's (Lightning's rule); they get ``dataloader_idx``
    (0 in training, the loader's index in evaluation), as in Lightning.
    """
    if _keeps(strategy, Strategy, "batch_to_device") and _keeps(strategy.precision, Precision, "convert_input"):
        move = device_mover(strategy.root_device)
    else:
        move = strategy.batch_to_device
    if trainer is None:
        return move
    before, transfer, after = (
        _user_data_hook(trainer, name)
        for name in ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")
    )
    if before is None and transfer is None and after is None:
        return move
    device = strategy.root_device

    def to_device(batch: Any) -> Any:
        if before is not None:
            batch = before(batch, dataloader_idx)
        batch = move(batch) if transfer is None else transfer(batch, device, dataloader_idx)
        if after is not None:
            batch = after(batch, dataloader_idx)
        return batch

    return to_device


def _user_data_hook(trainer: Trainer, name: str) -> Callable[..., Any] | None:
    """The data module's ``name`` if it overrides it, else the module's (Lightning's choice, by ``is_overridden``),
    called where ``self.log`` is refused; None where that is the default itself, which the plain path stands in for."""
    from trainer.hooks import is_overridden
    from trainer.module_hooks import DataHooks

    state = trainer.run_state
    datamodule, module = state.datamodule, state.module
    owner = datamodule if datamodule is not None and is_overridden(name, datamodule) else module
    if owner is None or _keeps(owner, DataHooks, name):
        return None
    return trainer.metric_router.no_log(name, getattr(owner, name))  # self.log there: refused, as in Lightning


def _step_call(strategy: Strategy, name: str) -> Callable[..., Any]:
    """The user's step ``name`` as the strategy calls it (through its wrapper where it routes steps).

    A step defined without ``batch_idx`` (``def training_step(self, batch)``, or Lightning's
    ``def training_step(self, dataloader_iter)``) is called without it; the signature is read once,
    here, not per batch.
    """
    assert strategy.module is not None
    takes_index = _takes_batch_idx(getattr(strategy.module, name))
    fn: Callable[..., Any]
    if _keeps(strategy, Strategy, "step"):
        fn = getattr(strategy.module, name)
    else:
        fn = functools.partial(strategy.step, name)
    if takes_index:
        return fn
    return lambda batch, batch_idx: fn(batch)


def _takes_batch_idx(fn: Callable[..., Any]) -> bool:
    """Whether a bound step method accepts a second positional argument (``batch_idx``)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)
