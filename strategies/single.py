"""One process, one device: the strategy every other one is measured against."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from strategies.accelerators import Accelerator
from strategies.base import Strategy
from strategies.precision import Precision

__all__ = ["SingleDeviceStrategy"]


class SingleDeviceStrategy(Strategy):
    """Train in this process on one device: CUDA if present, else MPS, else CPU (or ``device=``).

    Lightning's signature: ``device`` first, then ``accelerator`` (its kind decides the device when
    ``device`` is not given), ``checkpoint_io`` and ``precision_plugin`` (or ``precision`` by name).

    >>> SingleDeviceStrategy(device="cpu")
    SingleDeviceStrategy(device=cpu, precision='32-true')
    """

    name = "single"
    aliases: ClassVar[dict[str, dict[str, Any]]] = {"single_device": {}}

    def __init__(
        self,
        device: str | torch.device | int | None = None,
        accelerator: Accelerator | None = None,
        checkpoint_io: Any = None,
        precision_plugin: Precision | None = None,
        precision: str | Precision | None = None,
    ) -> None:
        if isinstance(device, bool):
            raise TypeError(f"device must be a device, its name or a GPU index, got {device!r}")
        super().__init__(
            precision=precision,
            device=torch.device("cuda", device) if isinstance(device, int) else device,  # Lightning's device=0
            accelerator=accelerator,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
