"""The ``Callback`` base class: one do-nothing method per moment of a run.

Subclasses override only the hooks they need; the trainer precomputes which callbacks override which
hook and calls only those (see :func:`overridden_hooks`), so an unused hook costs nothing per step.
Every hook receives the trainer and the user's module first; names and defaults are Lightning's
(``pl_module``, ``dataloader_idx=0``), so a Lightning callback overrides them unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = [
    "DISPATCHED_HOOKS",
    "HOOKS",
    "LOG_METRICS_HOOK",
    "REMOVED_HOOKS",
    "Callback",
    "Checkpoint",
    "callback_states",
    "check_hooks",
    "logs_at",
    "overridden_hooks",
    "user_defines",
]


class Callback:
    """Base class for callbacks. Order of the hooks: see ``trainer/loops/fit.py`` and ``trainer/hook_order.py``.

    As in Lightning 2.6, ``self.log``/``self.log_dict`` inside a hook are the module's, attached to each
    callback when a run binds its module (the class defines neither).
    """

    #: False for the loggers: ``fast_dev_run`` leaves them out (a ``DummyLogger`` takes their place).
    runs_in_fast_dev_run: bool = True
    #: Where this callback's settings live in the ``geartrain`` config (``"callbacks.model_checkpoint"``),
    #: set by the command so that messages name the override that changes a setting; ``None`` in Python.
    config_key: str | None = None

    @property
    def state_key(self) -> str:
        """Key of this callback's state in checkpoints; make it unique if several may coexist."""
        return type(self).__qualname__

    def state_dict(self) -> dict[str, Any]:
        """State to save in checkpoints (plain data and tensors only)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        """Called when ``fit``/``validate``/``test``/``predict`` begins, before anything else."""

    def teardown(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        """Called when the stage ends, also after an exception. Flush and close files here."""

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_fit_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_sanity_check_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_sanity_check_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_train_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int) -> None: ...
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None: ...
    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_validation_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None: ...
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...
    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_test_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_test_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_test_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_test_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None: ...
    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...
    def on_predict_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_predict_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_predict_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_predict_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_predict_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None: ...
    def on_predict_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...
    def on_before_backward(self, trainer: Trainer, pl_module: TrainModule, loss: torch.Tensor) -> None: ...
    def on_after_backward(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: TrainModule, optimizer: torch.optim.Optimizer
    ) -> None: ...
    def on_before_zero_grad(
        self, trainer: Trainer, pl_module: TrainModule, optimizer: torch.optim.Optimizer
    ) -> None: ...
    def on_exception(self, trainer: Trainer, pl_module: TrainModule, exception: BaseException) -> None: ...
    def on_save_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None: ...


#: Lightning's callback hooks: the methods of :class:`Callback`, exactly Lightning's set.
HOOKS: tuple[str, ...] = tuple(
    name for name in vars(Callback) if name.startswith("on_") or name in ("setup", "teardown")
)
#: geartrain's one hook more, not a method of :class:`Callback` (so code listing its methods, or
#: ``LambdaCallback``'s arguments, sees Lightning's set): ``on_log_metrics(trainer, pl_module, metrics,
#: step)``, called when metrics are due to be written (every ``log_every_n_steps`` steps, and at epoch
#: ends) on the callbacks that define it. Loggers do (``Logger`` turns it into ``log_metrics``); the
#: values are tensors, so converting them (``float(v)``) syncs with the device there and nowhere else.
LOG_METRICS_HOOK = "on_log_metrics"
#: Every hook the trainer calls on the callbacks that define it.
DISPATCHED_HOOKS: tuple[str, ...] = (*HOOKS, LOG_METRICS_HOOK)


#: Hooks of Lightning 1.x that Lightning 2 no longer calls, and what to override instead. A callback
#: still defining one would silently do nothing, so :func:`check_hooks` refuses it.
REMOVED_HOOKS: dict[str, str] = {
    "on_init_start": "__init__ of the callback",
    "on_init_end": "setup(trainer, pl_module, stage)",
    "on_configure_sharded_model": "TrainModule.configure_model",
    "on_before_accelerator_backend_setup": "setup(trainer, pl_module, stage)",
    "on_pretrain_routine_start": "on_fit_start",
    "on_pretrain_routine_end": "on_fit_start",
    "on_batch_start": "on_train_batch_start",
    "on_batch_end": "on_train_batch_end",
    "on_epoch_start": "on_train_epoch_start / on_validation_epoch_start / on_test_epoch_start",
    "on_epoch_end": "on_train_epoch_end / on_validation_epoch_end / on_test_epoch_end",
    "on_keyboard_interrupt": "on_exception (the exception is a KeyboardInterrupt)",
}


def check_hooks(callbacks: list[Callback]) -> None:
    """Refuse callbacks defining a hook that is never called (Lightning 1.x names removed in 2.0), and
    two stateful callbacks under one ``state_key`` (a checkpoint would keep only one's state).

    Raises:
        TypeError: naming the callback, the hook and the hook to override instead.
        RuntimeError: naming the callbacks' type and the key, in Lightning's words.
    """
    seen: set[str] = set()
    for cb in (
        cb for cb in callbacks if getattr(type(cb), "state_dict", Callback.state_dict) is not Callback.state_dict
    ):
        if cb.state_key in seen:
            raise RuntimeError(
                f"Found more than one stateful callback of type `{type(cb).__name__}`. In the current configuration, "
                "this callback does not support being saved alongside other instances of the same type. HINT: The "
                f"`callback.state_key` must be unique among all callbacks in the Trainer (two are {cb.state_key!r}): "
                "give them different arguments or a state_key property of their own."
            )
        seen.add(cb.state_key)
    for cb in callbacks:
        for name, instead in REMOVED_HOOKS.items():
            if callable(getattr(type(cb), name, None)) or name in getattr(cb, "__dict__", {}):
                raise TypeError(
                    f"{type(cb).__name__}.{name} is never called: Lightning 2 removed that hook and geartrain "
                    f"follows it. Override {instead} instead."
                )


def _overrides(cb: Callback, hook: str) -> bool:
    # A function set on the instance (LambdaCallback) counts like a method of its class.
    if hook in getattr(cb, "__dict__", {}):
        return True
    own = getattr(type(cb), hook, None)
    if own is None:  # a stand-in whose class is not a Callback (``Mock(spec=Callback)``): its own attributes
        return callable(getattr(cb, hook, None))
    return own is not getattr(Callback, hook, None)


def overridden_hooks(callbacks: list[Callback]) -> dict[str, list[Callback]]:
    """Map every hook name to the callbacks, in order, whose class (or instance) overrides it."""
    return {hook: [cb for cb in callbacks if _overrides(cb, hook)] for hook in DISPATCHED_HOOKS}


def logs_at(trainer: Any, count: int) -> bool:
    """Whether the trainer logs at the ``count``-th step or evaluation batch (Lightning's
    ``should_update_logs``: every ``log_every_n_steps``, and when training stops; 0: never), for the
    monitors that log where the trainer does."""
    every = trainer.log_every_n_steps
    return bool(every) and (count % every == 0 or trainer.should_stop)


def user_defines(module: Any, name: str) -> bool:
    """Whether the user's module class defines ``name`` itself (not one of geartrain's base classes)."""
    for cls in type(module).__mro__:
        if name in vars(cls):
            return cls.__module__.split(".")[0] != "trainer"
    return False


class Checkpoint(Callback):
    """Base class of callbacks that save checkpoints (Lightning's ``Checkpoint``; ``ModelCheckpoint`` is one)."""

    @staticmethod
    def check_enabled(callbacks: list[Any], enabled: bool) -> None:
        """A checkpoint callback in ``callbacks`` beside ``enable_checkpointing=False`` is refused, as in Lightning."""
        from trainer.common.errors import MisconfigurationException

        if not enabled and any(isinstance(cb, Checkpoint) for cb in callbacks):
            raise MisconfigurationException(
                "Trainer was configured with `enable_checkpointing=False` but found `ModelCheckpoint` in callbacks "
                "list: remove it, or leave enable_checkpointing at True"
            )


def callback_states(callbacks: Iterable[Any]) -> dict[str, Any]:
    """Each callback's ``state_dict()`` under its ``state_key``: what a checkpoint keeps of them.

    Only geartrain callbacks (loggers among them) have a state there. An object given as a logger
    that is not one (a ``MagicMock`` standing in for a logger, as Lightning's tests give) keeps none,
    as Lightning checkpoints no logger. As Lightning's, a callback whose ``state_dict()`` is empty (or None, from an
    override that returns nothing) has no entry, so nothing is loaded back into it.
    """
    states = {cb.state_key: cb.state_dict() for cb in callbacks if isinstance(cb, Callback)}
    return {key: state for key, state in states.items() if state}
