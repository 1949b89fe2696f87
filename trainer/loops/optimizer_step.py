"""The optimizer's side of the step: the accumulation window, the non-finite policy, the optimizer
objects handed to the module (``self.optimizers()`` and an overridden ``optimizer_step``'s), the loss of a
step's output and the schedulers' stepping. :mod:`trainer.loops.step` binds them into the one step.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from trainer.common.errors import MetricNotLoggedError, MissingLossError, StepOutputError
from trainer.run_state import Window

if TYPE_CHECKING:
    from trainer.trainer import Trainer

__all__ = [
    "ManualOptimizer",
    "NonFinite",
    "StepOptimizer",
    "Window",
    "batch_outputs",
    "loss_of",
    "manual_backward",
    "manual_output",
    "needs_closure",
    "step_schedulers",
    "zero_grad_hook",
]


class StepOptimizer:
    """The optimizer an overridden ``optimizer_step`` receives (Lightning's ``LightningOptimizer``).

    ``step(closure)`` runs the closure (forward, backward), then what the trainer does before and at
    the optimizer step (``on_before_optimizer_step``, clipping, the strategy's step with fp16 scaling,
    the non-finite policy). Everything else (``param_groups``, ``state``) is the wrapped optimizer's.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        finish: Callable[[], bool],
        step_with: Callable[[Callable[[], Any] | None], bool] | None = None,
    ) -> None:
        self.optimizer = optimizer
        self._finish = finish
        #: For an optimizer whose ``step`` requires its closure: hands the closure to that step instead.
        self._step_with = step_with
        #: Whether ``step`` made (or deliberately skipped, fp16) a step that counts as a global step.
        self.counted = False

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups (change ``lr`` here for warm-up)."""
        return self.optimizer.param_groups

    def step(self, closure: Callable[[], Any] | None = None) -> None:
        """Run ``closure`` (forward and backward), then step; or hand it to a ``step`` that requires it (LBFGS)."""
        if self._step_with is not None:
            self.counted = self._step_with(closure)
            return
        if closure is not None:
            closure()
        self.counted = self._finish()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the wrapped optimizer's gradients."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


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
        p = t.run_state.progress
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
        p = t.run_state.progress
        for optimizer in t.run_state.optimizers:
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

    def step(self, closure: Any = None, **kwargs: Any) -> bool:
        """Step, the optimizer running ``closure`` if given; returns False if the step was skipped (fp16
        overflow, NaN).

        As Lightning's ``LightningOptimizer.step``: ``closure`` and ``kwargs`` reach the optimizer's own
        ``step`` (an optimizer that evaluates its closure several times, LBFGS, gets it), and
        ``on_before_optimizer_step`` runs after the closure, inside that step. Under
        ``Trainer(on_nonfinite=...)`` the closure runs first instead, so a non-finite loss can drop the step.
        """
        trainer, state = self._trainer, self._trainer.run_state
        if closure is not None and trainer.on_nonfinite is None:
            optimizer, hooks = self.optimizer, state.hooks

            def closure_then_hook() -> Any:
                out = closure()
                hooks("on_before_optimizer_step", optimizer)
                return out

            return self._count(trainer.strategy.optimizer_step(optimizer, closure=closure_then_hook, **kwargs))
        if closure is not None:
            closure()
        if self._window.nonfinite:
            NonFinite(trainer).skip_step(self._window)
            return False
        state.hooks("on_before_optimizer_step", self.optimizer)
        return self._count(trainer.strategy.optimizer_step(self.optimizer, **kwargs))

    def _count(self, stepped: bool) -> bool:
        """Count the step just made (a global step; a skipped one too, as fp16 overflow skips count)."""
        state = self._trainer.run_state
        state.progress.global_step += 1
        state.progress.nonfinite_in_a_row = 0
        if not stepped:
            state.progress.skipped_steps += 1
        return stepped

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of the wrapped optimizer."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state."""
        return self.optimizer.state_dict()

    def __repr__(self) -> str:
        """The wrapped optimizer's, named as Lightning names its wrapper (``LightningSGD (...)``)."""
        return f"Lightning{self.optimizer!r}"


def needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` requires its ``closure`` (LBFGS, an optimizer that re-evaluates the loss):
    a ``closure`` parameter without a default. Read once per run; an unreadable signature counts as no."""
    try:
        param = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return (
        param is not None
        and param.default is param.empty
        and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY, param.POSITIONAL_ONLY)
    )


def manual_backward(trainer: Trainer, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    """``TrainModule.manual_backward``: the non-finite policy, then ``on_before_backward(loss)``, the strategy's
    backward (``args``/``kwargs``, e.g. ``retain_graph=True``, reach ``loss.backward``) and ``on_after_backward``,
    as Lightning's manual backward calls them."""
    state = trainer.run_state
    if trainer.on_nonfinite is not None and not NonFinite(trainer).check(loss, state.progress.batch_in_epoch):
        state.window.nonfinite = True
        return
    state.hooks("on_before_backward", loss)
    trainer.strategy.manual_backward(loss, *args, **kwargs)
    state.hooks("on_after_backward")


def loss_of(out: Any) -> torch.Tensor | None:
    """The loss in what ``training_step`` returned: a tensor, a dict's ``"loss"``, or None (skip)."""
    if out is None or isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping):
        if "loss" not in out:  # Lightning's words first, then which keys there were
            raise MissingLossError(
                "In automatic_optimization, when `training_step` returns a dict, the 'loss' key needs to be "
                f"present: training_step returned a dict without a 'loss' entry (keys: {sorted(out)})"
            )
        loss = out["loss"]
        if loss is None or isinstance(loss, torch.Tensor):
            return loss
    raise StepOutputError(
        "In automatic optimization, `training_step` must return a Tensor, a dict, or None (where the step will be "
        f"skipped): training_step must return a loss tensor, a dict with 'loss', or None; got {type(out).__name__}"
    )


def manual_output(out: Any, module: Any) -> Any:
    """What a manual-optimisation ``training_step`` returned, checked as Lightning does: a tensor, a dict
    (handed to ``on_train_batch_end``) or None; anything else is refused instead of passed on unread."""
    if out is None or isinstance(out, (torch.Tensor, Mapping)):
        return out
    raise StepOutputError(  # Lightning's words first
        "In manual optimization, `training_step` must either return a Tensor or have no return "
        f"({type(module).__name__}.training_step returned {type(out).__name__}: its optimizers are stepped inside it, "
        "so return None, the loss tensor, or a dict of values for on_train_batch_end)."
    )


def batch_outputs(out: Any, automatic: bool, k: int) -> Any:
    """What ``training_step`` returned as Lightning's ``on_train_batch_end`` receives it: a dict whose ``"loss"``
    is detached (automatic optimisation: divided by the accumulation ``k``, as the loss backpropagated),
    the other keys as returned; ``{}`` for None. Anything else (manual optimisation's other returns) as it is.
    """
    if out is None:
        return {}
    if isinstance(out, torch.Tensor):
        return {"loss": (out / k if automatic and k != 1 else out).detach()}
    if isinstance(out, Mapping):
        shaped = dict(out)
        loss = shaped.get("loss")
        if isinstance(loss, torch.Tensor):
            shaped["loss"] = (loss / k if automatic and k != 1 else loss).detach()
            if automatic:
                return {"loss": shaped.pop("loss"), **shaped}
        elif automatic:
            return {}  # a step that skipped (loss None): Lightning hands an empty dict
        return shaped
    return out


def step_schedulers(trainer: Trainer, interval: str, steps_done: int | None = None, metrics_due: bool = True) -> None:
    """Advance the schedulers of ``interval`` whose ``frequency`` divides the count just reached.

    A monitoring scheduler at the ``"epoch"`` interval steps only on a value logged in this epoch:
    stepping ReduceLROnPlateau again on the last validation's value (an epoch that skipped
    validation) would count a plateau epoch that never happened. ``metrics_due`` says whether a
    missing metric is an error now (True) or may still come from a later validation (False).
    """
    state = trainer.run_state
    if not state.lr_scheduler_configs:
        return  # the common case, checked first
    count = steps_done if steps_done is not None else state.progress.epoch + 1
    assert state.module is not None
    if not state.module.automatic_optimization:
        return  # under manual optimisation the user steps schedulers
    metrics = trainer.callback_metrics
    # The module's lr_scheduler_step(scheduler, metric) where overridden, else the scheduler's own step.
    lr_scheduler_step = trainer.metric_router.no_log("lr_scheduler_step", state.module.lr_scheduler_step)
    for cfg in state.lr_scheduler_configs:
        if cfg.interval != interval or count % cfg.frequency:
            continue
        if cfg.monitor is None:
            lr_scheduler_step(cfg.scheduler, None)
            continue
        value = metrics.get(cfg.monitor)
        if interval == "epoch" and cfg.monitor not in trainer.metric_router.epoch_keys:
            value = None
        if value is None:
            name = type(cfg.scheduler).__name__
            if cfg.strict and metrics_due:
                logged = ", ".join(sorted(metrics)) or "nothing"
                raise MetricNotLoggedError(  # a KeyError too; Lightning's words first
                    f"ReduceLROnPlateau conditioned on metric {cfg.monitor} which is not available. Available "
                    f"metrics are: {logged}. ({name} monitors {cfg.monitor!r}, which was not logged; log it "
                    f"with self.log({cfg.monitor!r}, value), or set the `monitor` key in the lr scheduler dict)"
                )
            if metrics_due:  # strict=False: skipped, and said, as in Lightning
                warnings.warn(
                    f"ReduceLROnPlateau conditioned on metric {cfg.monitor} which is not available but strict is "
                    f"set to `False`. Skipping learning rate update ({name}).",
                    RuntimeWarning,
                    stacklevel=2,
                )
            continue
        lr_scheduler_step(cfg.scheduler, float(value))  # a sync, once per interval


def zero_grad_hook(hook: Callable[..., Any], progress: Any, optimizer: torch.optim.Optimizer) -> None:
    """The module's ``optimizer_zero_grad(epoch, batch_idx, optimizer)`` (batch_idx: the last of the window)."""
    hook(progress.epoch, progress.batch_in_epoch, optimizer)
