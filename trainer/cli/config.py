"""Dataclass schemas behind the Hydra config groups, registered in Hydra's ConfigStore.

A YAML file in ``conf/trainer/``, ``conf/strategy/`` or ``conf/optim/`` names its schema first in its defaults list
(``- /schema/strategy@_here_: single``),
so a typo'd key (``trainer.max_epoch=3``) or a value of the wrong type (``trainer.max_epochs=abc``)
fails while the config is composed, before anything runs, with a message naming the key.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, make_dataclass
from datetime import timedelta
from typing import Any, Optional

__all__ = [
    "NOT_IN_TRAINER_GROUP",
    "OptimConfig",
    "SGDOptimConfig",
    "register_configs",
    "strategy_schema",
    "trainer_schema",
]


#: ``Trainer`` arguments that come from elsewhere than the ``trainer`` group (their own groups, the run).
NOT_IN_TRAINER_GROUP = ("strategy", "callbacks", "default_root_dir", "config")


def trainer_schema() -> type:
    """The schema of the ``trainer`` group, derived from ``Trainer.__init__`` (its one declaration).

    Every argument but :data:`NOT_IN_TRAINER_GROUP`, typed as :func:`strategy_schema` types a
    strategy's and with the signature's default (``None`` keeps Lightning's "the default" meaning), so
    a typo'd key (``trainer.max_epoch=3``) or a value of the wrong type fails while the config is
    composed. The values themselves are checked by the ``Trainer``, before anything runs.
    """
    from trainer.trainer import Trainer

    fields = _fields(Trainer, exclude=NOT_IN_TRAINER_GROUP)
    return _named(make_dataclass("TrainerConfig", fields, namespace={"__post_init__": _check_trainer_values}))


def _check_trainer_values(cfg: Any) -> None:
    """The Trainer's own checks of the step's options, run as the config is checked (before anything is built)."""
    from trainer import options
    from trainer.data.microbatch import MicroBatcher

    try:
        options.check_step_options(
            cfg.accumulate_grad_batches,
            cfg.gradient_clip_val,
            cfg.gradient_clip_algorithm or "norm",
            cfg.on_nonfinite,
            cfg.max_nonfinite_in_a_row,
        )
        if cfg.micro_batch_size is not None:
            MicroBatcher(cfg.micro_batch_size)
    except ValueError as err:
        # The message starts with the argument's name (Lightning's wording quotes it: `name`).
        raise ValueError(f"trainer.{str(err).replace('`', '', 2)}") from None


def strategy_schema(cls: type, name: str, implied: dict[str, Any] | None = None) -> type:
    """The schema of ``strategy=<name>``, derived from the strategy class's constructor (its one declaration).

    One field per constructor argument, typed as OmegaConf can check it (a union of a config type with
    others, ``float | timedelta``, is the config type; anything else is ``Any``), with the signature's
    default; arguments the name implies (``ddp_fork``: ``start_method="fork"``) default to ``null``, so
    the name decides unless the config says otherwise. Built through
    :func:`strategies.registry.build_strategy`, which leaves ``null`` arguments to the class.
    """
    fields: list[tuple[str, Any, Any]] = [
        ("_target_", str, field(default="strategies.registry.build_strategy")),
        ("name", str, field(default=name)),
        *_fields(cls, implied=implied or {}),
    ]
    return _named(make_dataclass(f"{cls.__name__}Config_{name}", fields))


#: The derived schemas by class name: a config composed from one carries its class, and pickling that
#: config (``ddp_spawn`` hands the run's config to its processes) looks the class up in this module.
_DERIVED: dict[str, type] = {}


def _named(schema: type) -> type:
    """Make a derived schema findable as ``trainer.cli.config.<name>``, as pickle looks a class up."""
    schema.__module__ = __name__
    schema.__qualname__ = schema.__name__
    _DERIVED[schema.__name__] = schema
    return schema


def __getattr__(name: str) -> type:
    """A derived schema by name, derived first if this process has not yet (an unpickling process)."""
    if name.startswith("__"):
        raise AttributeError(name)
    if name not in _DERIVED:
        _derive_all()
    try:
        return _DERIVED[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def _fields(
    fn: Any, exclude: tuple[str, ...] = (), implied: dict[str, Any] | None = None
) -> list[tuple[str, Any, Any]]:
    """One schema field per parameter of ``fn`` (a class: its constructor), with its default."""
    fields: list[tuple[str, Any, Any]] = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or param.name in exclude:
            continue
        kind, default = _config_type(str(param.annotation)), _config_value(param.default)
        if kind is not Any and default is not None and not isinstance(default, kind):
            kind = Any  # ``int | Literal["auto"] = "auto"``: the value itself says the type is wider
        if implied and param.name in implied:
            default = None
        fields.append((param.name, Optional[kind] if kind is not Any else Any, field(default=default)))  # noqa: UP045
    return fields


_CONFIG_TYPES: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}
_CONTAINERS = ("dict", "list", "tuple", "Mapping", "Sequence", "Iterable")


def _config_type(annotation: str) -> Any:
    """``"float | timedelta"`` -> float, ``"int | str"`` -> Any: the one config type in the union, if one."""
    parts, depth, current = [], 0, ""
    for char in annotation:
        depth += (char in "[(" and 1) or ((char in "])" and -1) or 0)
        if char == "|" and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    if any(part.split("[")[0] in _CONTAINERS for part in parts):
        return Any  # a config can hold a list or a dict too: ``max_time={hours: 5}``
    simple = [_CONFIG_TYPES[part] for part in parts if part in _CONFIG_TYPES]
    return simple[0] if len(simple) == 1 else Any


def _config_value(default: Any) -> Any:
    """A signature default as a config value: ``timedelta`` as seconds, objects as ``null`` (the class decides)."""
    if isinstance(default, timedelta):
        return default.total_seconds()
    if default is inspect.Parameter.empty or not isinstance(default, (bool, int, float, str, type(None))):
        return None
    return default


@dataclass
class OptimConfig:
    """``optim=adamw``: the values its ``optimizer`` and ``scheduler`` entries interpolate.

    ``optimizer`` and ``scheduler`` are ``_partial_`` objects for ``hydra.utils.instantiate``, handed
    to the model, which calls them with its parameters and its optimizer.
    """

    lr: float = 1e-3
    weight_decay: float = 0.0
    optimizer: Any = None
    scheduler: Any = None

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"optim.lr must be a positive learning rate, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")


@dataclass
class SGDOptimConfig(OptimConfig):
    """``optim=sgd``: also the momentum."""

    momentum: float = 0.9

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.momentum < 0:
            raise ValueError(f"optim.momentum must be >= 0, got {self.momentum}")


def _derive_all() -> tuple[type, dict[str, type]]:
    """The trainer group's schema and each strategy name's, derived from their constructors."""
    from strategies.registry import own_aliases, strategy_classes

    strategies = {
        name: strategy_schema(cls, name, implied)
        for cls in strategy_classes().values()
        for name, implied in {cls.name: {}, **own_aliases(cls)}.items()
    }
    return trainer_schema(), strategies


def register_configs() -> None:
    """Put the schemas into Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    trainer, strategies = _derive_all()
    cs.store(group="schema/trainer", name="trainer", node=trainer)
    for name, schema in strategies.items():
        cs.store(group="schema/strategy", name=name, node=schema)
    cs.store(group="schema/optim", name="adamw", node=OptimConfig)
    cs.store(group="schema/optim", name="sgd", node=SGDOptimConfig)
