"""One process, one device: the strategy every other one is measured against."""

from __future__ import annotations

from typing import Any, ClassVar

from strategies.base import Strategy

__all__ = ["SingleDeviceStrategy"]


class SingleDeviceStrategy(Strategy):
    """Train in this process on one device: CUDA if present, else MPS, else CPU (or ``device=``).

    >>> SingleDeviceStrategy(device="cpu")
    SingleDeviceStrategy(device=cpu, precision='32-true')
    """

    name = "single"
    aliases: ClassVar[dict[str, dict[str, Any]]] = {"single_device": {}}
