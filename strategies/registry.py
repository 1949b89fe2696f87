"""Strategy names (``Trainer(strategy="ddp")``, ``geartrain strategy=ddp``) and how they are built.

Ours are ``single``, ``dp``, ``ddp``, ``amp``, ``fsdp``, ``model_parallel``. Lightning's names that mean one of ours are
aliases: ``ddp_spawn`` (DDP, workers spawned), ``ddp_fork`` and ``ddp_notebook`` (DDP, workers forked,
so a module class defined in ``__main__`` of a notebook or ``python -`` trains),
``ddp_find_unused_parameters_true``, ``single_device`` and ``fsdp_cpu_offload``. Lightning's other names (DeepSpeed, XLA,
FSDP with CPU offload, ...) are refused with a message naming what we have.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch

from strategies.base import Strategy

__all__ = ["ALIASES", "STRATEGIES", "build_strategy", "resolve_accelerator", "resolve_strategy"]

#: name -> "module:Class", imported only when used so ``import strategies`` stays cheap.
STRATEGIES: dict[str, str] = {
    "single": "strategies.single:SingleDeviceStrategy",
    "dp": "strategies.dp:DataParallelStrategy",
    "ddp": "strategies.ddp:DDPStrategy",
    "amp": "strategies.amp:AMPStrategy",
    "fsdp": "strategies.fsdp:FSDPStrategy",
    "model_parallel": "strategies.model_parallel:ModelParallelStrategy",
}

#: Lightning's strategy names that are one of ours with some arguments: name -> (ours, kwargs).
ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "ddp_spawn": ("ddp", {"start_method": "spawn"}),
    "ddp_fork": ("ddp", {"start_method": "fork"}),
    "ddp_notebook": ("ddp", {"start_method": "fork"}),
    "ddp_find_unused_parameters_true": ("ddp", {"find_unused_parameters": True}),
    "ddp_find_unused_parameters_false": ("ddp", {"find_unused_parameters": False}),
    "ddp_spawn_find_unused_parameters_true": ("ddp", {"start_method": "spawn", "find_unused_parameters": True}),
    "ddp_spawn_find_unused_parameters_false": ("ddp", {"start_method": "spawn", "find_unused_parameters": False}),
    "ddp_fork_find_unused_parameters_true": ("ddp", {"start_method": "fork", "find_unused_parameters": True}),
    "ddp_fork_find_unused_parameters_false": ("ddp", {"start_method": "fork", "find_unused_parameters": False}),
    "ddp_notebook_find_unused_parameters_true": ("ddp", {"start_method": "fork", "find_unused_parameters": True}),
    "ddp_notebook_find_unused_parameters_false": ("ddp", {"start_method": "fork", "find_unused_parameters": False}),
    "single_device": ("single", {}),
    "fsdp_cpu_offload": ("fsdp", {"cpu_offload": True}),
}

#: ``Trainer(accelerator=...)`` values we run on.
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")


def _valid_names() -> str:
    lightning = (
        "ddp_spawn, ddp_fork, ddp_notebook, ddp_find_unused_parameters_true/false, single_device, fsdp_cpu_offload"
    )
    return f"valid names: {', '.join(['auto', *STRATEGIES])}; Lightning's names: {lightning}"


def strategy_class(name: str) -> type[Strategy]:
    """The class registered under ``name``; an unknown name lists the valid ones."""
    if name not in STRATEGIES:
        lightning_only = ("deepspeed", "xla", "fsdp_", "single_xla", "hpu", "ipu", "tpu", "bagua", "colossal")
        if name.startswith(lightning_only):
            raise ValueError(
                f"strategy={name!r} is a Lightning strategy geartrain does not support (DeepSpeed, XLA/TPU, HPU "
                f"and FSDP variants such as CPU offload are not implemented); {_valid_names()}. "
                "For sharded training use strategy='fsdp' (FSDP2)."
            )
        raise ValueError(f"Unknown strategy {name!r}; {_valid_names()}")
    module_name, cls_name = STRATEGIES[name].split(":")
    cls: type[Strategy] = getattr(importlib.import_module(module_name), cls_name)
    return cls


def build_strategy(name: str, **kwargs: Any) -> Strategy:
    """The strategy registered under ``name`` (ours or a Lightning alias), built with ``kwargs``.

    ``kwargs`` set to ``None`` are left to the alias or the class (the Hydra configs of the aliases,
    ``conf/strategy/ddp_fork.yaml`` etc., build through this). The instance's ``name`` is ``name``.

    >>> build_strategy("ddp_fork", device="cpu").start_method
    'fork'
    """
    base, extra = ALIASES.get(name, (name, {}))
    given = {key: value for key, value in kwargs.items() if value is not None}
    strategy = strategy_class(base)(**{**extra, **given})
    strategy.name = name
    return strategy


def resolve_accelerator(accelerator: str | None) -> str | None:
    """The device kind for ``Trainer(accelerator=...)``: ``"cpu"``, ``"cuda"``, ``"mps"``, or None (auto).

    ``"gpu"`` is CUDA where present, else Apple's MPS. A kind this machine lacks, or one geartrain does
    not run on (``"tpu"``, ``"hpu"``, ``"xla"``), is refused naming the supported ones.
    """
    if accelerator is None:
        return None
    if not isinstance(accelerator, str):
        raise TypeError(
            f"accelerator must be one of {', '.join(ACCELERATORS)}, got {type(accelerator).__name__}; "
            "Lightning Accelerator instances are not supported"
        )
    kind = accelerator.lower()
    if kind not in ACCELERATORS:
        raise ValueError(f"accelerator={accelerator!r} is not supported; geartrain runs on {', '.join(ACCELERATORS)}")
    mps = getattr(torch.backends, "mps", None)
    has_mps = mps is not None and mps.is_available()
    if kind == "auto":
        return None
    if kind == "gpu":
        if torch.cuda.is_available():
            return "cuda"
        if has_mps:
            return "mps"
        raise RuntimeError(f"accelerator={accelerator!r}, but this machine has no GPU (CUDA or MPS); use 'cpu'")
    if kind == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"accelerator={accelerator!r}, but CUDA is not available here; use 'cpu' (or 'auto')")
    if kind == "mps" and not has_mps:
        raise RuntimeError(f"accelerator={accelerator!r}, but Apple's MPS is not available here; use 'cpu'")
    return kind


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
    extra: dict[str, Any] = {}
    if name in ALIASES:
        name, extra = ALIASES[name][0], dict(ALIASES[name][1])
    if name == "auto":
        many = (isinstance(devices, int) and devices > 1) or num_nodes > 1
        name = "ddp" if many else "single"
    cls = strategy_class(name)
    params = inspect.signature(cls.__init__).parameters
    kwargs: dict[str, Any] = dict(extra)
    if precision is not None:
        kwargs["precision"] = precision
    if accelerator is not None:
        if "device" in params:
            kwargs["device"] = accelerator
        elif accelerator != "cuda":
            raise ValueError(f"strategy={name!r} runs on CUDA GPUs only; got accelerator={accelerator!r}")
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
    if strategy.lower() in ALIASES:
        built.name = strategy.lower()
    return built
