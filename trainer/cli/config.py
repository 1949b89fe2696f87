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
from typing import Any, Dict, List, Optional  # noqa: UP035

__all__ = ["OptimConfig", "SGDOptimConfig", "TrainerConfig", "register_configs", "strategy_schema"]


# OmegaConf reads these annotations at run time: they must be typing forms it knows (Optional, Any),
# not PEP 604 unions.
@dataclass
class TrainerConfig:
    """Every ``Trainer`` option that a config can set (``strategy`` and ``callbacks`` come from their groups)."""

    accelerator: str = "auto"
    devices: Any = "auto"
    num_nodes: int = 1
    #: A name ("16-mixed") or Lightning's short spellings (16, "bf16", 64).
    precision: Any = None
    max_epochs: Optional[int] = None  # noqa: UP045
    min_epochs: Optional[int] = None  # noqa: UP045
    max_steps: int = -1
    min_steps: Optional[int] = None  # noqa: UP045
    #: "DD:HH:MM:SS" or a dict such as {hours: 5}.
    max_time: Any = None
    overfit_batches: Any = 0.0
    accumulate_grad_batches: int = 1
    gradient_clip_val: Optional[float] = None  # noqa: UP045
    gradient_clip_algorithm: str = "norm"
    val_check_interval: Any = None
    check_val_every_n_epoch: Optional[int] = 1  # noqa: UP045
    limit_train_batches: Any = None
    limit_val_batches: Any = None
    limit_test_batches: Any = None
    limit_predict_batches: Any = None
    num_sanity_val_steps: int = 2
    fast_dev_run: Any = False
    log_every_n_steps: int = 50
    #: true, false or "warn".
    deterministic: Any = False
    enable_progress_bar: bool = True
    enable_checkpointing: bool = True
    enable_model_summary: Optional[bool] = None  # noqa: UP045
    logger: bool = True
    benchmark: Optional[bool] = None  # noqa: UP045
    inference_mode: bool = True
    use_distributed_sampler: bool = True
    detect_anomaly: bool = False
    barebones: bool = False
    sync_batchnorm: bool = False
    reload_dataloaders_every_n_epochs: int = 0
    #: A name ("simple", "advanced", "pytorch") or null.
    profiler: Any = None
    #: Lightning's; refused unless left at these values (the Trainer's message names the alternative).
    plugins: Any = None
    enable_autolog_hparams: bool = True
    model_registry: Optional[str] = None  # noqa: UP045
    on_nonfinite: Optional[str] = None  # noqa: UP045
    max_nonfinite_in_a_row: int = 3
    preemption_exit_code: Optional[int] = 0  # noqa: UP045
    slurm_requeue: bool = True
    compile: bool = False
    compile_kwargs: Optional[Dict[str, Any]] = None  # noqa: UP006, UP045
    #: "auto", a positive int, or null (no micro-batching).
    micro_batch_size: Any = None
    #: Dotted class paths of blocks whose activations are recomputed in backward.
    activation_checkpointing: Optional[List[str]] = None  # noqa: UP006, UP045

    def __post_init__(self) -> None:
        mbs = self.micro_batch_size
        if mbs is not None and mbs != "auto" and not (isinstance(mbs, int) and not isinstance(mbs, bool) and mbs > 0):
            raise ValueError(f"trainer.micro_batch_size must be 'auto', a positive int or null, got {mbs!r}")
        if self.gradient_clip_algorithm not in ("norm", "value"):
            raise ValueError(
                f"trainer.gradient_clip_algorithm must be 'norm' or 'value', got {self.gradient_clip_algorithm!r}"
            )


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
    ]
    for param in list(inspect.signature(cls).parameters.values()):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        kind, default = _config_type(str(param.annotation)), _config_value(param.default)
        if kind is not Any and default is not None and not isinstance(default, kind):
            kind = Any  # ``int | Literal["auto"] = "auto"``: the value itself says the type is wider
        if implied and param.name in implied:
            default = None
        fields.append((param.name, Optional[kind] if kind is not Any else Any, field(default=default)))  # noqa: UP045
    return make_dataclass(f"{cls.__name__}Config_{name}", fields)


_CONFIG_TYPES: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}


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


def register_configs() -> None:
    """Put the schemas into Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    from strategies.registry import own_aliases, strategy_classes

    cs = ConfigStore.instance()
    cs.store(group="schema/trainer", name="trainer", node=TrainerConfig)
    for cls in strategy_classes().values():
        for name, implied in {cls.name: {}, **own_aliases(cls)}.items():
            cs.store(group="schema/strategy", name=name, node=strategy_schema(cls, name, implied))
    cs.store(group="schema/optim", name="adamw", node=OptimConfig)
    cs.store(group="schema/optim", name="sgd", node=SGDOptimConfig)
