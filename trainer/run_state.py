"""The state of a run: everything that changes while an entry point runs, in one object.

The ``Trainer`` holds one :class:`RunState` (``trainer.run_state``) and hands it to the loops, which
read and write it explicitly (torchtnt's ``State``); code outside the loops reads it through the
``Trainer``'s public attributes (``trainer.optimizers``, ``trainer.global_step``,
``trainer.sanity_checking`` ...), which are :class:`Reads` descriptors over its fields: nothing is
stored twice. A trial of the finders and the ``Tuner`` save it with :meth:`RunState.state_dict` and
put it back with :meth:`RunState.load_state_dict`.

What is not here belongs to a room of its own: the options as the user gave them (the
``Trainer``), logged values (:mod:`trainer.metrics.routing`), checkpoint files
(:mod:`trainer.checkpoint`), signals (:mod:`trainer.preemption`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from trainer.options import LoopOptions
from trainer.progress import Progress
from trainer.state import TrainerStatus

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from trainer.hooks import HookDispatch
    from trainer.loops.step import ManualOptimizer
    from trainer.module import DataModule, TrainModule
    from trainer.optim import SchedulerConfig

__all__ = ["Reads", "RunState"]

T = TypeVar("T")


@dataclass
class Window:
    """The accumulation window in progress (kept for a whole ``fit``, as a window may span a resume point)."""

    #: A micro-batch of the window had a loss (so the window ends with an optimizer step).
    has_loss: bool = False
    #: ... had a non-finite loss under ``on_nonfinite="skip"`` (so the window's step is dropped).
    nonfinite: bool = False


@dataclass(eq=False)
class RunState:
    """Everything an entry point changes as it runs (see the module docstring).

    Attributes:
        loop: the loop options in force (``max_epochs``, ``max_steps``, ``limits``, ...): the
            ``Trainer``'s, narrowed for a trial (a few steps, no validation) and put back after it.
        hooks: calls the module's and the callbacks' hooks (rebuilt when the callbacks change).
        progress: every counter of the run (checkpointed whole).
        window: the accumulation window in progress (the training step's state between batches).
        fn: the entry point running (``"fit"``, ``"validate"``, ``"test"``, ``"predict"``), else None.
        last_fn: the entry point running or last run (Lightning's ``trainer.state.fn``).
        status: whether it runs, finished or was interrupted (Lightning's ``trainer.state.status``).
        running_stage: the loop running now (``"train"``, ``"sanity_check"``, ``"validate"`` ...).
        sanity_checking: True during the sanity check.
        in_train_epoch_end: True while callbacks' ``on_train_epoch_end`` runs.
        is_last_batch: True while the fit loop trains the last batch of an epoch.
        module / datamodule: what the entry point runs.
        optimizers / lr_scheduler_configs: from ``configure_optimizers``, prepared by the strategy.
        optimizer_handles: what ``self.optimizers()`` returns under manual optimisation.
        loaders: the dataloaders by stage, prepared for the strategy (sharded, resumable).
        given_loaders: the dataloaders passed to the entry point, before preparing.
        val_loaders_epoch: the epoch the fit's validation loaders were last requested in (reloads count from it).
        num_training_batches / num_*_batches: batch counts of the loops (Lightning's attributes).
        val_check_batch: training batches between validations in this epoch (inf: at its end only).
        ckpt_path: the checkpoint the entry point loaded (``"last"``/``"best"`` resolved).
        told: the info lines said already (each is said once a Trainer, as Lightning's ``WarningCache`` does).
    """

    loop: LoopOptions
    hooks: HookDispatch
    progress: Progress = field(default_factory=Progress)
    window: Window = field(default_factory=Window)
    fn: str | None = None
    last_fn: str | None = None
    status: TrainerStatus = TrainerStatus.INITIALIZING
    running_stage: str | None = None
    sanity_checking: bool = False
    in_train_epoch_end: bool = False
    is_last_batch: bool = False
    module: TrainModule | None = None
    datamodule: DataModule | None = None
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    lr_scheduler_configs: list[SchedulerConfig] = field(default_factory=list)
    optimizer_handles: list[ManualOptimizer] = field(default_factory=list)
    #: ``TrainModule.manual_backward`` of this run (the loops' non-finite policy, then the strategy's
    #: backward), set with the optimizers: the module calls it without importing the loops.
    manual_backward: Callable[..., None] | None = None
    loaders: dict[str, Any] = field(default_factory=dict)
    given_loaders: dict[str, Any] = field(default_factory=dict)
    val_loaders_epoch: float = -math.inf
    num_training_batches: float = math.inf
    num_val_batches: list[float] = field(default_factory=list)
    num_test_batches: list[float] = field(default_factory=list)
    num_predict_batches: list[float] = field(default_factory=list)
    num_sanity_val_batches: list[float] = field(default_factory=list)
    val_check_batch: float | None = None
    ckpt_path: str | None = None
    told: set[str] = field(default_factory=set)

    def state_dict(self, weights: bool = False) -> dict[str, Any]:
        """A copy of what a trial or the ``Tuner`` changes, for :meth:`load_state_dict`.

        The loop options, the hook dispatch, the counters, the optimizers and schedulers (the objects
        and their state), the training batch count, and with ``weights`` the module's weights. Held
        in memory only: checkpoints are :mod:`trainer.checkpoint.connector`'s.
        """
        return {
            "loop": dataclasses.replace(self.loop, limits=dict(self.loop.limits)),
            "hooks": self.hooks,
            "progress": self.progress.state_dict(),
            "optimizers": list(self.optimizers),
            "optimizer_states": [copy.deepcopy(opt.state_dict()) for opt in self.optimizers],
            "lr_scheduler_configs": list(self.lr_scheduler_configs),
            "scheduler_states": [copy.deepcopy(cfg.scheduler.state_dict()) for cfg in self.lr_scheduler_configs],
            "num_training_batches": self.num_training_batches,
            "weights": copy.deepcopy(self.module.state_dict()) if weights and self.module is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`state_dict` copied; objects the loops hold (progress, window) change in place."""
        self.loop, self.hooks = state["loop"], state["hooks"]
        self.progress.load_state_dict(state["progress"])
        self.optimizers = state["optimizers"]
        for opt, opt_state in zip(self.optimizers, state["optimizer_states"], strict=True):
            opt.load_state_dict(opt_state)
            opt.zero_grad(set_to_none=True)
        self.lr_scheduler_configs = state["lr_scheduler_configs"]
        for cfg, sched_state in zip(self.lr_scheduler_configs, state["scheduler_states"], strict=True):
            cfg.scheduler.load_state_dict(sched_state)
        self.num_training_batches = state["num_training_batches"]
        if state["weights"] is not None and self.module is not None:
            self.module.load_state_dict(state["weights"])


class Reads(Generic[T]):
    """A ``Trainer`` attribute that is a field of its :class:`RunState` (or of the loop options in force).

    ``Reads[int]("progress", "global_step")`` reads ``trainer.run_state.progress.global_step``. Only
    attributes Lightning lets users and callbacks assign (``should_stop``, ``optimizers``, ...) are
    made ``settable``; assigning any other raises an ``AttributeError`` that names it.
    """

    def __init__(self, *path: str, settable: bool = False, doc: str = "") -> None:
        self._path, self._settable = path, settable
        self.__doc__ = doc
        self._name = path[-1]

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> Reads[T]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> T: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> T | Reads[T]:
        if obj is None:
            return self
        value: Any = obj.run_state  # type: ignore[attr-defined]
        for part in self._path:
            value = getattr(value, part)
        return value

    def __set__(self, obj: object, value: T) -> None:
        if not self._settable:
            raise AttributeError(f"Trainer.{self._name} is read-only: the trainer sets it as the run goes")
        target: Any = obj.run_state  # type: ignore[attr-defined]
        for part in self._path[:-1]:
            target = getattr(target, part)
        setattr(target, self._path[-1], value)
