"""Lightning's strategy attributes over ours: ``accelerator``, ``parallel_devices``, ``launcher``, ``on_exception``,
``tensor_init_context``, ``lightning_module``, ``optimizers`` and the checkpoint hooks ``load_optimizer_state_dict``
and ``lightning_restore_optimizer``.

Mixins of :class:`~strategies.base.Strategy` and :class:`~strategies.parallel.ParallelStrategy`, kept
apart so the interface files hold only what the trainer calls. Each name reads or sets what the
strategy already has (its device, its precision): nothing here is a second source of truth.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode

from strategies.accelerators import Accelerator, accelerator_for, accelerator_kind
from strategies.precision import Precision

if TYPE_CHECKING:
    from trainer.module import TrainModule

__all__ = ["LightningParallelNames", "LightningStrategyNames", "StrategyLauncher", "one_precision"]


class LightningStrategyNames:
    """``accelerator``, ``launcher`` and ``on_exception`` of every strategy, as Lightning's users read and set them."""

    _device: torch.device | None
    _accelerator_object: Accelerator | None = None
    checkpoint_io: Any
    precision: Precision
    #: What ``connect`` was given (a class default: a subclass that skips ``__init__`` still reads None).
    _lightning_module: TrainModule | None = None

    if TYPE_CHECKING:

        @property
        def root_device(self) -> torch.device: ...

        def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None: ...

    @property
    def lightning_module(self) -> TrainModule | None:
        """The user's module that ``connect`` was given (None before), unwrapped.

        ``trainer.lightning_module`` reads it before a run has set its own module, so code that drives a strategy
        by hand (``trainer.strategy.connect(model)``, as Lightning's users do) sees its module.
        """
        return self._lightning_module

    #: Optimizers assigned to a strategy that no trainer's module is connected to (Lightning's tests do).
    _unattached_optimizers: tuple[torch.optim.Optimizer, ...] = ()

    def _connected_trainer(self) -> Any:
        """The trainer of the connected module (its own attribute, so a stand-in module has none), else None."""
        return vars(self._lightning_module).get("_trainer") if self._lightning_module is not None else None

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The run's optimizers: ``trainer.optimizers``, which holds them, once a module connected to a trainer is
        (before: those assigned here, else ``[]``). Assigning sets ``trainer.optimizers`` then, as in Lightning."""
        trainer = self._connected_trainer()
        return list(trainer.optimizers) if trainer is not None else list(self._unattached_optimizers)

    @optimizers.setter
    def optimizers(self, optimizers: list[torch.optim.Optimizer]) -> None:
        trainer = self._connected_trainer()
        if trainer is not None:
            trainer.optimizers = list(optimizers)
        else:
            self._unattached_optimizers = tuple(optimizers)

    @property
    def lightning_restore_optimizer(self) -> bool:
        """Whether the trainer restores the optimizers from a checkpoint (through :meth:`load_optimizer_state_dict`).

        A strategy that restores them itself overrides this to return False; the schedulers are restored either way.
        """
        return True

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Restore the run's optimizers from a whole checkpoint's ``"optimizer_states"`` (Lightning's hook: the
        trainer calls it with the checkpoint it read when resuming). Each optimizer is loaded by
        ``load_optimizer_state``, which a sharded strategy overrides."""
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
            self.load_optimizer_state(optimizer, state)

    def _take_lightning_arguments(self, accelerator: Accelerator | None, checkpoint_io: Any) -> None:
        """Lightning's constructor arguments: an accelerator sets the device kind; a checkpoint IO is kept for
        the Trainer (which refuses a second one given as a plugin)."""
        if accelerator is not None:
            self.accelerator = accelerator
        if checkpoint_io is not None:
            self.checkpoint_io = checkpoint_io

    @property
    def accelerator(self) -> Accelerator:
        """Lightning's accelerator object for :attr:`root_device`'s kind (the one given, when one was)."""
        kind = self.root_device.type
        if self._accelerator_object is None or self._accelerator_object.name() != kind:
            self._accelerator_object = accelerator_for(kind)
        return self._accelerator_object

    @accelerator.setter
    def accelerator(self, accelerator: Accelerator) -> None:
        """Take ``accelerator`` (Lightning's ``strategy.accelerator = ...``): it decides the device kind."""
        self._set_device_kind(accelerator_kind(accelerator))
        self._accelerator_object = accelerator

    def _set_device_kind(self, kind: str) -> None:
        """Train on a device of ``kind`` (an accelerator's); a device of another kind already chosen is refused."""
        if self._device is not None and self._device.type != kind:
            raise ValueError(
                f"{type(self).__name__} is on {self._device}, but the accelerator given is for {kind!r}: give one "
                f"device kind (device={kind!r}, or an accelerator for {self._device.type!r})"
            )
        if self._device is None:
            self._device = torch.device(kind)

    def on_exception(self, exception: BaseException) -> None:
        """Lightning's hook: called in every process whose run an exception ends, after the callbacks' and
        the data module's ``on_exception`` and before tear-down. Nothing to release by default."""

    @property
    def launcher(self) -> StrategyLauncher | None:
        """Lightning's ``strategy.launcher``: None where the run stays in this process (Lightning's too)."""
        return None

    @contextlib.contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        """Lightning's context for building modules: tensors made inside are on :attr:`root_device` with the
        precision's dtype (``"16-true"``: float16). ``empty_init=True`` skips the weights' initialisation
        (``torch.nn.init`` and the tensors' in-place random fills), for weights a checkpoint will overwrite;
        ``None`` and ``False`` initialise them as anywhere else (``trainer.init_module`` uses it)."""
        skip = SkipInit() if empty_init else contextlib.nullcontext()
        with skip, torch.device(self.root_device), self.precision.tensor_init_context():
            yield


#: The tensors' in-place random fills that module constructors initialise weights with.
_RANDOM_FILLS = frozenset(
    getattr(torch.Tensor, name)
    for name in ("uniform_", "normal_", "bernoulli_", "exponential_", "geometric_", "log_normal_", "cauchy_", "random_")
)


class SkipInit(TorchFunctionMode):
    """Inside it, ``torch.nn.init``'s functions and the tensors' in-place random fills leave the tensor as it
    is (uninitialised memory): what ``tensor_init_context(empty_init=True)`` builds modules under."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init" or func in _RANDOM_FILLS:
            return kwargs.get("tensor", args[0] if args else None)
        return func(*args, **kwargs)


class LightningParallelNames:
    """``parallel_devices`` of the multi-process strategies; an accelerator sets their device kind."""

    _device_type: str | None

    if TYPE_CHECKING:

        @property
        def num_processes(self) -> int: ...

        def _accelerator(self) -> str: ...

    def _set_device_kind(self, kind: str) -> None:
        """The kind of every process's device; one already given of another kind is refused."""
        if self._device_type not in (None, kind):
            raise ValueError(
                f"{type(self).__name__} was given device={self._device_type!r}, but the accelerator given is for "
                f"{kind!r}: give one device kind"
            )
        self._device_type = kind

    @property
    def launcher(self) -> StrategyLauncher:
        """What starts this strategy's processes (Lightning's ``strategy.launcher``); see :class:`StrategyLauncher`."""
        return StrategyLauncher(self)

    @property
    def parallel_devices(self) -> list[torch.device]:
        """The device of each local process (Lightning's name): process ``i`` computes on device ``i``."""
        kind = self._accelerator()
        if kind == "cuda":
            return [torch.device("cuda", index) for index in range(self.num_processes)]
        return [torch.device(kind)] * self.num_processes


class StrategyLauncher:
    """Lightning's launcher of a multi-process strategy, over the strategy's own :meth:`launch`.

    ``launch(fn, *args, **kwargs)`` runs ``fn`` in every process the strategy needs and returns rank 0's
    result; ``is_interactive_compatible`` is whether it works in a notebook (``ddp_fork``/``ddp_notebook``).
    """

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    @property
    def is_interactive_compatible(self) -> bool:
        """Forked processes share the notebook's definitions; spawned and re-run ones cannot."""
        return bool(self.strategy.start_method == "fork")

    def launch(self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` in every process; rank 0's result (``trainer`` is Lightning's)."""
        return self.strategy.launch(functools.partial(function, **kwargs), *args)


def one_precision(precision: str | Precision | None, plugin: Precision | None) -> str | Precision | None:
    """``precision`` or Lightning's ``precision_plugin``: giving both (and different) is refused."""
    if plugin is None:
        return precision
    if precision is not None and precision is not plugin:
        raise ValueError(
            f"precision={precision!r} and precision_plugin={plugin!r} were both given: give one (precision_plugin "
            "is Lightning's name for the same argument)"
        )
    return plugin
