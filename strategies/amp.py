"""Single device with automatic mixed precision on by default."""

from __future__ import annotations

import torch

from strategies.base import default_device
from strategies.precision import Precision
from strategies.single import SingleDeviceStrategy

__all__ = ["AMPStrategy"]


class AMPStrategy(SingleDeviceStrategy):
    """The single-device strategy with mixed precision: fp16 + GradScaler on CUDA, bf16 elsewhere.

    CPUs and MPS have no fast float16 matmuls and bf16 needs no loss scaling, so bf16 is the
    default there. Pass ``precision=`` to choose explicitly.

    >>> AMPStrategy(device="cpu").precision.name
    'bf16-mixed'
    """

    name = "amp"

    def __init__(self, precision: str | Precision | None = None, device: str | torch.device | None = None) -> None:
        if precision is None:
            resolved = torch.device(device) if device is not None else default_device()
            precision = "16-mixed" if resolved.type == "cuda" else "bf16-mixed"
        super().__init__(precision=precision, device=device)
