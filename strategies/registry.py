"""Strategy names (``Trainer(strategy="ddp")``, ``geartrain strategy=ddp``) and how they are built.

Ours are ``single``, ``dp``, ``ddp``, ``amp``, ``fsdp``, ``model_parallel``. Lightning's names that mean one of ours are
aliases: ``ddp_spawn`` (DDP, workers spawned), ``ddp_fork`` and ``ddp_notebook`` (DDP, workers forked,
so a module class defined in ``__main__`` of a notebook or ``python -`` trains),
``ddp_find_unused_parameters_true``, ``single_device`` and ``fsdp_cpu_offload`` (FSDP2 with parameters kept on the
CPU). Lightning's other names (DeepSpeed, XLA, HPU, ...) are refused with a message naming what we have.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
from types import ModuleType
from typing import Any

from strategies.accelerators import (
    Accelerator,
    AcceleratorRegistry,
    AcceleratorUnavailable,
    CUDAAccelerator,
    MPSAccelerator,
    accelerator_kind,
)
from strategies.base import Strategy

__all__ = [
    "StrategyRegistry",
    "build_strategy",
    "find_strategy",
    "own_aliases",
    "resolve_accelerator",
    "resolve_strategy",
    "strategy_classes",
]

#: ``Trainer(accelerator=...)`` values we run on.
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")


def find_strategy(name: str) -> tuple[type[Strategy], dict[str, Any]] | None:
    """The class registered under ``name`` and the arguments the name implies, or None.

    A name given to :data:`StrategyRegistry` by ``StrategyRegistry.register`` comes first. Each
    strategy registers its own names (:attr:`Strategy.name`, :attr:`Strategy.aliases`) in the
    module named after it: ``"ddp_spawn"`` is looked up in ``strategies.ddp_spawn``, then
    ``strategies.ddp``. Only that module is imported, so naming a strategy costs no other's imports.
    """
    if name in StrategyRegistry.registered:
        entry = StrategyRegistry.registered[name]
        return entry["strategy"], dict(entry["init_params"])
    parts = name.split("_")
    for end in range(len(parts), 0, -1):
        module_name = f"{__package__}.{'_'.join(parts[:end])}"
        if importlib.util.find_spec(module_name) is None:
            continue
        for cls in _classes_in(importlib.import_module(module_name)):
            if cls.name == name:
                return cls, {}
            aliases = own_aliases(cls)
            if name in aliases:
                return cls, dict(aliases[name])
    return None


def strategy_classes() -> dict[str, type[Strategy]]:
    """Every strategy class by its :attr:`~Strategy.name`, from every module of ``strategies`` (all imported)."""
    package = importlib.import_module(__package__ or "strategies")
    found: dict[str, type[Strategy]] = {}
    for info in pkgutil.iter_modules(package.__path__):
        for cls in _classes_in(importlib.import_module(f"{package.__name__}.{info.name}")):
            found[cls.name] = cls
    return dict(sorted(found.items()))


def own_aliases(cls: type[Strategy]) -> dict[str, dict[str, Any]]:
    """The names a class registers besides its own (not its base class's: ``amp`` is not ``single_device``)."""
    aliases: dict[str, dict[str, Any]] = vars(cls).get("aliases", {})
    return aliases


def _classes_in(module: ModuleType) -> list[type[Strategy]]:
    """The strategy classes a module defines (not those it imports), each with a name of its own."""
    return [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, Strategy)
        and obj.__module__ == module.__name__
        and "name" in vars(obj)
        and not vars(obj).get("base_only", False)
    ]


def _valid_names() -> str:
    classes = strategy_classes()
    aliases = ", ".join(alias for cls in classes.values() for alias in own_aliases(cls))
    return f"valid names: {', '.join(['auto', *classes])}; Lightning's names: {aliases}"


def strategy_class(name: str) -> type[Strategy]:
    """The class registered under ``name``; an unknown name lists the valid ones."""
    found = find_strategy(name)
    if found is None:
        lightning_only = ("deepspeed", "xla", "fsdp_", "single_xla", "hpu", "ipu", "tpu", "bagua", "colossal")
        if name.startswith(lightning_only):
            raise ValueError(
                f"strategy={name!r} is a Lightning strategy geartrain does not support (DeepSpeed, XLA/TPU, HPU "
                f"and FSDP variants other than fsdp_cpu_offload are not implemented); {_valid_names()}. "
                "For sharded training use strategy='fsdp' (FSDP2)."
            )
        raise ValueError(f"Unknown strategy {name!r}; {_valid_names()}")
    return found[0]


def build_strategy(name: str, **kwargs: Any) -> Strategy:
    """The strategy registered under ``name`` (ours or a Lightning alias), built with ``kwargs``.

    ``kwargs`` set to ``None`` are left to the alias or the class (the Hydra configs of the aliases,
    ``conf/strategy/ddp_fork.yaml`` etc., build through this). The instance's ``name`` is ``name``.

    >>> build_strategy("ddp_fork", device="cpu").start_method
    'fork'
    """
    cls = strategy_class(name)
    _, extra = find_strategy(name) or (cls, {})
    given = {key: value for key, value in kwargs.items() if value is not None}
    strategy = cls(**{**extra, **given})
    strategy.name = name
    return strategy


class _StrategyRegistry(dict[str, dict[str, Any]]):
    """Lightning's ``StrategyRegistry``: every strategy name, each entry ``{"strategy", "strategy_name",
    "description", "init_params"}``.

    Filled from the strategy files (each class's ``name`` and ``aliases``) when first read, so importing
    it costs nothing. ``register`` adds a name (a class and the arguments it is built with) that
    ``Trainer(strategy=name)`` then builds, before any name of ours.
    """

    def __init__(self) -> None:
        super().__init__()
        #: The names given by :meth:`register` (``Trainer(strategy=...)`` looks these up first).
        self.registered: dict[str, dict[str, Any]] = {}
        self._filled = False

    def _fill(self) -> None:
        if self._filled:
            return
        self._filled = True
        for name, cls in strategy_classes().items():
            dict.setdefault(self, name, _entry(name, cls, cls.__name__, {}))
            for alias, implied in own_aliases(cls).items():
                dict.setdefault(self, alias, _entry(alias, cls, f"{cls.__name__} ({alias})", dict(implied)))

    def register(
        self,
        name: str,
        strategy: type[Strategy] | None = None,
        description: str | None = None,
        override: bool = False,
        **init_params: Any,
    ) -> Any:
        """Register ``strategy`` under ``name``, built with ``init_params`` (or return a class decorator)."""
        if not isinstance(name, str):
            raise TypeError(f"`name` for {strategy} must be a str, found {name}")
        self._fill()
        if name in self and not override:
            raise ValueError(f"'{name}' is already present in the registry. HINT: Use `override=True`.")

        def do_register(cls: type[Strategy]) -> type[Strategy]:
            if not (isinstance(cls, type) and issubclass(cls, Strategy)):
                raise TypeError(f"StrategyRegistry.register({name!r}, ...): expected a Strategy subclass, got {cls!r}")
            entry = _entry(name, cls, description or cls.__name__, init_params)
            self[name] = entry
            self.registered[name] = entry
            return cls

        return do_register(strategy) if strategy is not None else do_register

    def get(self, name: str, default: Any = None) -> Any:
        """A strategy built as registered under ``name`` (Lightning's ``get``), else ``default``."""
        self._fill()
        if name in self:
            entry = self[name]
            built = entry["strategy"](**entry["init_params"])
            built.name = name
            return built
        if default is not None:
            return default
        raise KeyError(f"Invalid strategy name {name!r}; {_valid_names()}")

    def remove(self, name: str) -> None:
        """Drop the entry registered under ``name``."""
        self._fill()
        self.pop(name)
        self.registered.pop(name, None)

    def available_strategies(self) -> list[str]:
        """Every registered name."""
        self._fill()
        return list(self.keys())

    def __contains__(self, name: object) -> bool:
        self._fill()
        return dict.__contains__(self, name)

    def __getitem__(self, name: str) -> dict[str, Any]:
        self._fill()
        entry: dict[str, Any] = dict.__getitem__(self, name)
        return entry

    def __iter__(self) -> Any:
        self._fill()
        return dict.__iter__(self)

    def __len__(self) -> int:
        self._fill()
        return dict.__len__(self)

    def keys(self) -> Any:
        self._fill()
        return dict.keys(self)

    def items(self) -> Any:
        self._fill()
        return dict.items(self)

    def values(self) -> Any:
        self._fill()
        return dict.values(self)

    def __str__(self) -> str:
        return "Registered Strategies: {}".format(", ".join(self.available_strategies()))

    def __repr__(self) -> str:
        self._fill()
        return dict.__repr__(self)


def _entry(name: str, cls: type[Strategy], description: str, init_params: dict[str, Any]) -> dict[str, Any]:
    return {"strategy": cls, "strategy_name": name, "description": description, "init_params": init_params}


#: Every strategy name and what it builds (Lightning's ``lightning.pytorch.strategies.StrategyRegistry``).
StrategyRegistry = _StrategyRegistry()


def resolve_accelerator(accelerator: str | Accelerator | None) -> str | None:
    """The device kind for ``Trainer(accelerator=...)``: ``"cpu"``, ``"cuda"``, ``"mps"``, or None (auto).

    A name or an accelerator object (:mod:`strategies.accelerators`; ``CPUAccelerator()`` is ``"cpu"``).
    ``"gpu"`` is CUDA where present, else Apple's MPS. A kind this machine lacks, or one geartrain does
    not run on (``"tpu"``, ``"hpu"``, ``"xla"``), is refused naming the supported ones, in Lightning's words.
    """
    if accelerator is None:
        return None
    if isinstance(accelerator, Accelerator):
        kind = accelerator_kind(accelerator)
        if not type(accelerator).is_available():
            raise AcceleratorUnavailable(f"{_unavailable(type(accelerator))} ({type(accelerator).__name__}())")
        return kind
    if not isinstance(accelerator, str):
        raise TypeError(
            f"accelerator must be one of {', '.join(ACCELERATORS)} or an Accelerator object "
            f"(CPUAccelerator(), ...), got {type(accelerator).__name__}"
        )
    kind = accelerator.lower()
    if kind not in ACCELERATORS:
        lightning = f"You selected an invalid accelerator name: `accelerator={accelerator!r}`. "
        if kind in ("tpu", "hpu", "xla", "ipu"):
            lightning = ""  # Lightning's names, not ours: say only that geartrain does not run there
        raise ValueError(
            f"{lightning}accelerator={accelerator!r} is not supported; geartrain runs on {', '.join(ACCELERATORS)}"
        )
    if kind == "auto":
        return None
    if kind == "gpu":
        if CUDAAccelerator.is_available():
            return "cuda"
        if MPSAccelerator.is_available():
            return "mps"
        raise AcceleratorUnavailable(
            f"No supported gpu backend found! accelerator={accelerator!r}, but this machine has no GPU (CUDA or MPS); "
            "use 'cpu'"
        )
    cls = AcceleratorRegistry[kind]["accelerator"]
    if not cls.is_available():
        where = "CUDA is not available here" if kind == "cuda" else "Apple's MPS is not available here"
        raise AcceleratorUnavailable(f"{_unavailable(cls)} (accelerator={accelerator!r}, but {where}; use 'cpu')")
    return kind


def _unavailable(cls: type[Accelerator]) -> str:
    """Lightning's sentence for an accelerator this machine lacks, naming the kinds it has."""
    available = [
        name for name in ("cpu", "cuda", "mps", "tpu") if AcceleratorRegistry[name]["accelerator"].is_available()
    ]
    return (
        f"`{cls.__qualname__}` can not run on your system since the accelerator is not available. The following "
        f"accelerator(s) is available and can be passed into `accelerator` argument of `Trainer`: {available}."
    )


def resolve_strategy(
    strategy: str | Strategy,
    *,
    devices: int | str = "auto",
    num_nodes: int = 1,
    precision: str | int | None = None,
    accelerator: str | None = None,
) -> Strategy:
    """Build the strategy for ``Trainer(strategy=..., devices=..., num_nodes=..., precision=...)``.

    ``"auto"`` is ``"ddp"`` when more than one device or node is asked for, else ``"single"``. An
    instance learns ``devices``/``num_nodes`` through :meth:`Strategy.configure` (so one built by Hydra
    with its defaults follows ``trainer.devices``); giving ``precision`` replaces its precision plugin.
    ``accelerator`` (a device kind from :func:`resolve_accelerator`, None for auto) chooses the device
    of a named strategy; an instance already on another kind of device is refused.
    """
    if isinstance(strategy, Strategy):
        _check_device_kind(type(strategy), strategy.name, accelerator)
        strategy.configure(devices=devices, num_nodes=num_nodes)
        if accelerator is not None and strategy.root_device.type != accelerator:
            raise ValueError(
                f"accelerator={accelerator!r}, but the strategy instance {type(strategy).__name__} is on "
                f"{strategy.root_device.type!r}; build it with device={accelerator!r} or leave accelerator='auto'"
            )
        if precision is not None:
            from strategies.precision import make_precision

            strategy.precision = make_precision(precision, strategy.root_device.type)
        return strategy
    if not isinstance(strategy, str):
        raise TypeError(
            f"strategy must be a name or a Strategy instance, got {type(strategy).__name__}; {_valid_names()}"
        )
    name = strategy.lower()
    if name == "auto":
        many = (isinstance(devices, int) and devices > 1) or num_nodes > 1
        name = "ddp" if many else "single"
    cls = strategy_class(name)
    _, implied = find_strategy(name) or (cls, {})
    extra: dict[str, Any] = dict(implied)
    params = inspect.signature(cls.__init__).parameters
    kwargs: dict[str, Any] = dict(extra)
    if precision is not None:
        kwargs["precision"] = precision
    _check_device_kind(cls, name, accelerator)
    if accelerator is not None and "device" in params:
        kwargs["device"] = accelerator
    if "devices" in params:
        kwargs["devices"] = devices
    elif devices not in ("auto", 1, "1"):
        raise ValueError(
            f"strategy={name!r} runs on one device; got devices={devices!r}: leave devices out, "
            f"or use strategy='ddp' for one process per device"
        )
    if "num_nodes" in params:
        kwargs["num_nodes"] = num_nodes
    elif num_nodes != 1:
        raise ValueError(f"strategy={name!r} runs on one node; got num_nodes={num_nodes}")
    built = cls(**kwargs)
    built.name = name
    return built


def _check_device_kind(cls: type[Strategy], name: str, accelerator: str | None) -> None:
    """A strategy without a ``device`` argument (``dp``) runs on CUDA GPUs: another kind asked for is refused.

    The one rule for a name (``Trainer(strategy="dp")``) and an instance (``geartrain strategy=dp``).
    """
    params = inspect.signature(cls.__init__).parameters
    if accelerator is None or accelerator == "cuda" or "device" in params:
        return
    if any(param.kind is param.VAR_KEYWORD for param in params.values()):
        return  # a subclass passing its arguments on (``def __init__(self, **kwargs)``): its base decides
    raise ValueError(
        f"strategy={name!r} runs on CUDA GPUs only; got accelerator={accelerator!r}: leave accelerator out "
        f"(without GPUs it trains on one device), or use strategy='single' or 'ddp' on the {accelerator}"
    )
