"""Strategy names (``Trainer(strategy="ddp")``, ``geartrain strategy=ddp``) and how they are built."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from strategies.base import Strategy

__all__ = ["STRATEGIES", "resolve_strategy"]

#: name -> "module:Class", imported only when used so ``import strategies`` stays cheap.
STRATEGIES: dict[str, str] = {
    "single": "strategies.single:SingleDeviceStrategy",
    "dp": "strategies.dp:DataParallelStrategy",
    "ddp": "strategies.ddp:DDPStrategy",
    "amp": "strategies.amp:AMPStrategy",
    "fsdp": "strategies.fsdp:FSDPStrategy",
}


def strategy_class(name: str) -> type[Strategy]:
    """The class registered under ``name``; an unknown name lists the valid ones."""
    if name not in STRATEGIES:
        valid = ", ".join(["auto", *STRATEGIES])
        raise ValueError(f"Unknown strategy {name!r}; valid names: {valid}")
    module_name, cls_name = STRATEGIES[name].split(":")
    cls: type[Strategy] = getattr(importlib.import_module(module_name), cls_name)
    return cls


def resolve_strategy(
    strategy: str | Strategy,
    *,
    devices: int | str = "auto",
    num_nodes: int = 1,
    precision: str | None = None,
) -> Strategy:
    """Build the strategy for ``Trainer(strategy=..., devices=..., num_nodes=..., precision=...)``.

    ``"auto"`` is ``"ddp"`` when more than one device or node is asked for, else ``"single"``. An
    instance learns ``devices``/``num_nodes`` through :meth:`Strategy.configure` (so one built by Hydra
    with its defaults follows ``trainer.devices``); giving ``precision`` replaces its precision plugin.
    """
    if isinstance(strategy, Strategy):
        strategy.configure(devices=devices, num_nodes=num_nodes)
        if precision is not None:
            from strategies.precision import make_precision

            strategy.precision = make_precision(precision, strategy.root_device.type)
        return strategy
    if not isinstance(strategy, str):
        raise TypeError(f"strategy must be a name or a Strategy instance, got {type(strategy).__name__}")
    name = strategy.lower()
    if name == "auto":
        many = (isinstance(devices, int) and devices > 1) or num_nodes > 1
        name = "ddp" if many else "single"
    cls = strategy_class(name)
    params = inspect.signature(cls.__init__).parameters
    kwargs: dict[str, Any] = {}
    if precision is not None:
        kwargs["precision"] = precision
    if "devices" in params:
        kwargs["devices"] = devices
    elif devices not in ("auto", 1, "1"):
        raise ValueError(f"strategy={name!r} runs on one device; got devices={devices!r}")
    if "num_nodes" in params:
        kwargs["num_nodes"] = num_nodes
    elif num_nodes != 1:
        raise ValueError(f"strategy={name!r} runs on one node; got num_nodes={num_nodes}")
    return cls(**kwargs)
