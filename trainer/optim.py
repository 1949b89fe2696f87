"""Turn what ``configure_optimizers`` returned into optimizers and scheduler configs, or say why not."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.common.errors import MisconfigurationException, UserError

__all__ = ["NoOptimizer", "OptimizerConfigError", "SchedulerConfig", "check_optimization_mode", "parse_optimizers"]

_ACCEPTED = (
    "Unknown configuration for model optimizers. configure_optimizers() must return an optimizer, a list/tuple "
    "of optimizers, a (optimizers, schedulers) pair of lists, a dict {'optimizer': ..., 'lr_scheduler': ...}, "
    "or a list of such dicts"
)


class OptimizerConfigError(MisconfigurationException, TypeError):
    """What ``configure_optimizers`` returned has a shape the trainer cannot use.

    Lightning's type (``MisconfigurationException``), and a ``TypeError`` as it was before it had its own.
    """


@dataclass
class SchedulerConfig:
    """One learning-rate scheduler and when to step it.

    ``interval``: ``"step"`` (after every optimizer step that was taken) or ``"epoch"`` (after each
    training epoch, validation included); ``frequency``: every n intervals; ``monitor``: the logged
    metric passed to ``ReduceLROnPlateau.step``; ``strict``: raise if that metric is missing.
    """

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None
    strict: bool = True
    name: str | None = None
    #: Whether the scheduler steps on a metric (``ReduceLROnPlateau``); set from the scheduler, as Lightning's.
    reduce_on_plateau: bool = False
    #: The keys the user's scheduler dict gave (empty for a bare scheduler).
    given_keys: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.interval not in ("step", "epoch"):
            raise UserError(
                f'The "interval" key in lr scheduler dict must be "step" or "epoch" but is "{self.interval}" '
                f"(scheduler {type(self.scheduler).__name__})"
            )
        if not isinstance(self.frequency, int) or self.frequency < 1:
            raise UserError(f"lr_scheduler 'frequency' must be a positive int, got {self.frequency!r}")
        self.reduce_on_plateau = self.reduce_on_plateau or isinstance(
            self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau
        )

    @property
    def needs_metric(self) -> bool:
        """True for ReduceLROnPlateau, whose ``step`` takes the monitored value."""
        return self.reduce_on_plateau


_SCHEDULER_KEYS = {"scheduler", "interval", "frequency", "monitor", "strict", "name"}
#: The keys of a scheduler dict that only the trainer's own stepping reads (ignored under manual optimisation).
_TRAINER_STEPPING_KEYS = frozenset({"monitor", "strict"})


def _scheduler_config(value: Any, monitor: str | None = None) -> SchedulerConfig:
    if isinstance(value, Mapping):
        unknown = set(value) - _SCHEDULER_KEYS
        if unknown:  # as Lightning: said, and left out
            warnings.warn(
                f"Found unsupported keys in the lr scheduler dict: {unknown}. They are ignored; the keys are "
                f"{sorted(_SCHEDULER_KEYS)}",
                RuntimeWarning,
                stacklevel=5,
            )
        if "scheduler" not in value:
            raise UserError(
                'The lr scheduler dict must have the key "scheduler" with its item being an lr scheduler '
                "({'scheduler': StepLR(...), 'interval': 'epoch'})"
            )
        options = {k: v for k, v in value.items() if k in _SCHEDULER_KEYS}
        options.setdefault("monitor", monitor)
        return SchedulerConfig(**options, given_keys=frozenset(value) & _SCHEDULER_KEYS)
    return SchedulerConfig(scheduler=value, monitor=monitor)


class NoOptimizer(torch.optim.Optimizer):
    """What a fit trains with when ``configure_optimizers()`` returned None (Lightning's rule): no updates.

    Its ``step`` runs the closure it is given (the forward and backward still happen, hooks and
    callbacks still run, ``global_step`` still counts) and changes no weight; ``zero_grad`` does
    nothing, as Lightning's stand-in optimizer.
    """

    def __init__(self) -> None:
        super().__init__([torch.zeros(1)], {})

    def step(self, closure: Any = None) -> Any:
        """Run ``closure`` (when given) and update nothing."""
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to clear."""


def _is_optimizer(value: Any) -> bool:
    return isinstance(value, torch.optim.Optimizer)


def parse_optimizers(
    returned: Any, automatic: bool = True, steps_schedulers: bool = False
) -> tuple[list[torch.optim.Optimizer], list[SchedulerConfig]]:
    """Accept every form Lightning's ``configure_optimizers`` may return; otherwise raise naming what was returned.

    Under automatic optimisation (the trainer steps the schedulers) a scheduler needs ``step()``,
    unless the module overrides ``lr_scheduler_step`` (``steps_schedulers``: it steps them its own way),
    and a ``ReduceLROnPlateau`` a ``monitor``; under manual optimisation the user steps them, so they
    do not, and the keys that only matter to the trainer's stepping are said to be ignored (as in
    Lightning). Every scheduler needs ``state_dict``/``load_state_dict``, as Lightning requires.
    """
    optimizers, schedulers = _parse(returned)
    for cfg in schedulers:
        if automatic and not steps_schedulers and not callable(getattr(cfg.scheduler, "step", None)):
            name = type(cfg.scheduler).__name__
            raise OptimizerConfigError(  # Lightning's words first
                f"The provided lr scheduler `{name}` doesn't follow PyTorch's LRScheduler API. You should override "
                "the `LightningModule.lr_scheduler_step` hook with your own logic if you are using a custom LR "
                f"scheduler: lr_scheduler 'scheduler' must be a learning-rate scheduler with .step(), got {name}"
            )
        if not automatic and cfg.given_keys & _TRAINER_STEPPING_KEYS:
            warnings.warn(  # Lightning's words
                f"The lr scheduler dict contains the key(s) {sorted(cfg.given_keys & _TRAINER_STEPPING_KEYS)}, but "
                "the keys will be ignored. You need to call `lr_scheduler.step()` manually in manual optimization.",
                RuntimeWarning,
                stacklevel=4,
            )
        if not all(callable(getattr(cfg.scheduler, m, None)) for m in ("state_dict", "load_state_dict")):
            raise OptimizerConfigError(
                f"lr_scheduler 'scheduler' must have state_dict() and load_state_dict() (checkpoints hold its "
                f"state), got {type(cfg.scheduler).__name__}"
            )
        if automatic and cfg.needs_metric and cfg.monitor is None:
            raise UserError(
                "`configure_optimizers` must include a monitor when a `ReduceLROnPlateau` scheduler is used: "
                f"{type(cfg.scheduler).__name__} steps on a metric: give it one with "
                "{'scheduler': ..., 'monitor': 'val/loss'} in configure_optimizers()"
            )
    attached = {id(opt) for opt in optimizers}
    strays = [cfg for cfg in schedulers if getattr(cfg.scheduler, "optimizer", None) is not None]
    if any(id(cfg.scheduler.optimizer) not in attached for cfg in strays):
        raise UserError(
            "Some schedulers are attached with an optimizer that wasn't returned from `configure_optimizers`: "
            "build each scheduler on one of the optimizers you return"
        )
    return optimizers, schedulers


def check_optimization_mode(
    module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer], gradient_clip_val: float | None, k: int
) -> None:
    """Lightning's refusals of what the module's optimisation mode cannot do, before a fit trains.

    Automatic optimisation steps one optimizer and has no ``optimizer_idx``; manual optimisation leaves
    clipping and accumulation to ``training_step``, so ``Trainer(gradient_clip_val=...)`` and
    ``Trainer(accumulate_grad_batches=k)`` (``k``) would do nothing there: refused instead of ignored.
    """
    name = type(module).__name__
    if "optimizer_idx" in _parameters(getattr(module, "training_step", None)):
        raise RuntimeError(  # Lightning's words first
            "Training with multiple optimizers is only supported with manual optimization. Remove the `optimizer_idx`"
            " argument from `training_step`, set `self.automatic_optimization = False` and access your optimizers"
            f" in `training_step` with `opt1, opt2, ... = self.optimizers()` ({name}.training_step takes "
            "optimizer_idx, which Lightning 2.x no longer passes)."
        )
    if getattr(module, "automatic_optimization", True):
        if len(optimizers) > 1:
            raise RuntimeError(
                "Training with multiple optimizers is only supported with manual optimization. Set"
                " `self.automatic_optimization = False`, then access your optimizers in `training_step` with"
                f" `opt1, opt2, ... = self.optimizers()` (configure_optimizers() returned {len(optimizers)} "
                "optimizers; automatic optimisation steps one)."
            )
        return
    if gradient_clip_val is not None and gradient_clip_val > 0:
        raise MisconfigurationException(
            "Automatic gradient clipping is not supported for manual optimization."
            f" Remove `Trainer(gradient_clip_val={gradient_clip_val})` or switch to automatic optimization"
            f" ({name} sets automatic_optimization = False: clip in training_step with self.clip_gradients)."
        )
    if k != 1:
        raise MisconfigurationException(
            "Automatic gradient accumulation is not supported for manual optimization."
            f" Remove `Trainer(accumulate_grad_batches={k})` or switch to automatic optimization"
            f" ({name} sets automatic_optimization = False: step its optimizers every k batches itself)."
        )


def _parameters(fn: Any) -> Mapping[str, Any]:
    """The parameters of ``fn``'s signature by name (none when it has no readable signature)."""
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}


def _parse(returned: Any) -> tuple[list[torch.optim.Optimizer], list[SchedulerConfig]]:
    if returned is None:
        warnings.warn(
            "configure_optimizers() returned None: this fit will run with no optimizer (the weights do not "
            "change), as in Lightning. Return an optimizer to train.",
            UserWarning,
            stacklevel=4,
        )
        return [NoOptimizer()], []
    if _is_optimizer(returned):
        return [returned], []
    if isinstance(returned, Mapping):
        returned = [returned]
    if isinstance(returned, Sequence) and not isinstance(returned, str) and len(returned) > 0:
        items = list(returned)
        if all(_is_optimizer(o) for o in items):
            return items, []
        if all(isinstance(d, Mapping) for d in items):
            optimizers, schedulers = [], []
            for d in items:
                unknown = set(d) - {"optimizer", "lr_scheduler", "monitor"}
                if "optimizer" not in d:
                    raise OptimizerConfigError(
                        f"{_ACCEPTED}; got a dict with keys {sorted(d)} "
                        "(expected 'optimizer' and optionally 'lr_scheduler', 'monitor')"
                    )
                if unknown:  # as Lightning: said, and left out
                    warnings.warn(
                        f"Found unsupported keys in the optimizer configuration: {unknown}. They are ignored; "
                        "the keys are 'optimizer', 'lr_scheduler' and 'monitor'",
                        RuntimeWarning,
                        stacklevel=4,
                    )
                if not _is_optimizer(d["optimizer"]):
                    raise OptimizerConfigError(f"{_ACCEPTED}; 'optimizer' is a {type(d['optimizer']).__name__}")
                optimizers.append(d["optimizer"])
                if d.get("lr_scheduler") is not None:
                    schedulers.append(_scheduler_config(d["lr_scheduler"], d.get("monitor")))
            return optimizers, schedulers
        if len(items) == 2 and isinstance(items[0], (list, tuple)):
            opts, scheds = items
            opts = list(opts)
            scheds = list(scheds) if isinstance(scheds, (list, tuple)) else [scheds]
            if opts and all(_is_optimizer(o) for o in opts):
                return opts, [_scheduler_config(s) for s in scheds]
    description = type(returned).__name__
    if isinstance(returned, (list, tuple)):
        description += f" of [{', '.join(type(x).__name__ for x in returned)}]"
    raise OptimizerConfigError(f"{_ACCEPTED}; got {description}")
