"""Hyperparameters as the loggers' ``hparams.yaml`` holds them: nested, as Lightning's, and safe to read back."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping
from enum import Enum
from typing import Any

import torch

__all__ = ["yaml_params"]


def yaml_params(params: Mapping[str, Any] | Namespace) -> dict[str, Any]:
    """Hyperparameters as ``hparams.yaml`` holds them, nested as Lightning's; an ``Enum`` by its name, any other
    object (a class, a module) as its ``str`` (Lightning writes a Python tag ``yaml.safe_load`` refuses).

    >>> yaml_params({"opt": {"lr": 0.1}, "sizes": (1, 2), "act": torch.nn.ReLU})
    {'opt': {'lr': 0.1}, 'sizes': [1, 2], 'act': "<class 'torch.nn.modules.activation.ReLU'>"}
    """
    return _yaml_value(vars(params) if isinstance(params, Namespace) else dict(params))


def _yaml_value(value: Any) -> Any:
    value = vars(value) if isinstance(value, Namespace) else value.name if isinstance(value, Enum) else value
    if isinstance(value, Mapping):
        return {str(key): _yaml_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_yaml_value(item) for item in value]
    numpy_scalar = type(value).__module__ == "numpy" and value.ndim == 0
    if numpy_scalar or (isinstance(value, torch.Tensor) and value.numel() == 1):
        return value.item()
    plain = next((t for t in (bool, int, float, str) if isinstance(value, t)), None)  # a subclass: its plain value
    return value if value is None else plain(value) if plain is not None else str(value)
