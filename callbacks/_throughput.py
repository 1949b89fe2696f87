"""The windowed throughput behind :class:`~callbacks.ThroughputMonitor`: Lightning's ``Throughput`` and FLOPs table.

:class:`Throughput` keeps the last ``window_size`` running totals (time, batches, samples, items, FLOPs)
and turns the window's first and last into rates; :func:`get_available_flops` is a device's peak
FLOPs for a dtype (the denominator of ``device/mfu``), ``None`` where it is not known.
"""

from __future__ import annotations

import warnings
from collections import deque
from typing import Any

import torch

__all__ = ["Throughput", "compute_dtype", "get_available_flops"]


class _Increasing(list[Any]):
    """The last ``maxlen`` values appended, each above the one before (a clock or counter that went back is an error)."""

    def __init__(self, maxlen: int) -> None:
        super().__init__()
        self.maxlen = maxlen

    def append(self, value: Any) -> None:
        if self and self[-1] >= value:
            raise ValueError(f"Expected the value to increase, last: {self[-1]}, current: {value}")
        super().append(value)
        if len(self) > self.maxlen:
            del self[0]

    @property
    def full(self) -> bool:
        return len(self) == self.maxlen


class Throughput:
    """Rates over the last ``window_size`` updates of running totals (Lightning's ``Throughput``).

    :meth:`compute` gives the totals (``time``, ``batches``, ``samples``, ``lengths``) at once, and once
    the window is full ``device/batches_per_sec``, ``device/samples_per_sec``, ``device/items_per_sec``,
    ``device/flops_per_sec`` and ``device/mfu`` (with ``available_flops``); with ``world_size > 1`` also
    the totals over all devices (``batches_per_sec``, ...: one device's rate times ``world_size``).

    Args:
        available_flops: one device's peak FLOPs per second (``device/mfu`` is measured over it).
        world_size: devices; above 1 the all-device rates are added.
        window_size: updates the rates are measured over (at least 2).
        separator: between the parts of a key (``device/mfu``).
    """

    def __init__(
        self, available_flops: float | None = None, world_size: int = 1, window_size: int = 100, separator: str = "/"
    ) -> None:
        if world_size < 1:
            raise ValueError(f"Throughput(world_size={world_size}): it must be at least 1")
        if window_size < 2:
            raise ValueError(f"Throughput(window_size={window_size}): a rate needs at least 2 updates")
        self.available_flops = available_flops
        self.world_size = world_size
        self.separator = separator
        self._time: _Increasing = _Increasing(window_size)
        self._batches: _Increasing = _Increasing(window_size)
        self._samples: _Increasing = _Increasing(window_size)
        self._lengths: _Increasing = _Increasing(window_size)
        self._flops: deque[float] = deque(maxlen=window_size)

    def update(
        self, *, time: float, batches: int, samples: int, lengths: int | None = None, flops: float | None = None
    ) -> None:
        """Record the running totals: seconds, batches, samples and items so far; ``flops`` of the latest batch."""
        if samples < batches:
            raise ValueError(f"Expected samples ({samples}) to be greater or equal than batches ({batches})")
        self._time.append(time)
        self._batches.append(batches)
        self._samples.append(samples)
        if lengths is not None:
            if lengths < samples:
                raise ValueError(f"Expected lengths ({lengths}) to be greater or equal than samples ({samples})")
            self._lengths.append(lengths)
            if len(self._lengths) != len(self._samples):
                raise RuntimeError(
                    f"If lengths are passed ({len(self._lengths)}), there needs to be the same number of samples"
                    f" ({len(self._samples)})"
                )
        if flops is not None:
            self._flops.append(flops * self.world_size)  # every device's

    def compute(self) -> dict[str, int | float]:
        """The totals, and the rates over the window once it is full."""
        sep, world = self.separator, self.world_size
        metrics: dict[str, int | float] = {
            "time": self._time[-1],
            "batches": self._batches[-1],
            "samples": self._samples[-1],
        }
        if self._lengths:
            metrics["lengths"] = self._lengths[-1]
        if self._time.full:
            seconds = self._time[-1] - self._time[0]
            rates = {
                "batches_per_sec": (self._batches[-1] - self._batches[0]) / seconds,
                "samples_per_sec": (self._samples[-1] - self._samples[0]) / seconds,
            }
            if self._lengths.full:
                rates["items_per_sec"] = (self._lengths[-1] - self._lengths[0]) / seconds
            for name, rate in rates.items():
                metrics[f"device{sep}{name}"] = rate
                if world > 1:
                    metrics[name] = rate * world
        if self._flops.maxlen is not None and len(self._flops) == self._flops.maxlen:
            # the first entry's FLOPs were done before the window's first time
            flops_per_sec = (sum(self._flops) - self._flops[0]) / (self._time[-1] - self._time[0])
            if world > 1:
                metrics["flops_per_sec"] = flops_per_sec
            metrics[f"device{sep}flops_per_sec"] = flops_per_sec / world
            if self.available_flops:
                metrics[f"device{sep}mfu"] = flops_per_sec / world / self.available_flops
        return metrics

    def reset(self) -> None:
        """Forget every update."""
        for window in (self._time, self._batches, self._samples, self._lengths, self._flops):
            window.clear()


#: Peak dense FLOPs per second of data-centre GPUs, from their makers' data sheets ("tfloat32": float32
#: matmuls run as TF32). Lightning's table has more chips; one not here has no ``device/mfu``.
_CUDA_FLOPS: dict[str, dict[torch.dtype | str, float]] = {
    "h200": {
        torch.float64: 3.4e13,
        torch.float32: 6.7e13,
        "tfloat32": 9.9e14,
        torch.bfloat16: 2.0e15,
        torch.float16: 2.0e15,
        torch.int8: 4.0e15,
    },
    "h100 sxm": {
        torch.float64: 33.5e12,
        torch.float32: 66.9e12,
        "tfloat32": 494.7e12,
        torch.bfloat16: 989.4e12,
        torch.float16: 989.4e12,
        torch.int8: 1978.9e12,
    },
    "h100 pcie": {
        torch.float64: 25.6e12,
        torch.float32: 51.2e12,
        "tfloat32": 378e12,
        torch.bfloat16: 756e12,
        torch.float16: 756e12,
        torch.int8: 1513e12,
    },
    "a100": {
        torch.float64: 9.7e12,
        torch.float32: 19.5e12,
        "tfloat32": 156e12,
        torch.bfloat16: 312e12,
        torch.float16: 312e12,
        torch.int8: 624e12,
    },
    "l4": {
        torch.float32: 30.3e12,
        "tfloat32": 60e12,
        torch.bfloat16: 121e12,
        torch.float16: 121e12,
        torch.int8: 242e12,
    },
}


def _chip(name: str) -> str | None:
    name = name.lower()
    if "h200" in name:
        return "h200"
    if "h100" in name:
        return "h100 pcie" if "pcie" in name or "hbm2e" in name else "h100 sxm"
    return next((chip for chip in ("a100", "l4") if chip in name.split() or chip in name.split("-")), None)


def get_available_flops(device: torch.device, dtype: torch.dtype | str) -> int | None:
    """A device's peak FLOPs per second for ``dtype``; None on the CPU and for a GPU or dtype not in the table."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    chip = _chip(name)
    if chip is None:
        warnings.warn(f"FLOPs not found for {name!r}", UserWarning, stacklevel=2)
        return None
    if dtype is torch.float32 and torch.get_float32_matmul_precision() != "highest":
        dtype = "tfloat32"
    flops = _CUDA_FLOPS[chip].get(dtype)
    if flops is None:
        warnings.warn(f"{name!r} does not support {dtype}", UserWarning, stacklevel=2)
        return None
    return int(flops)


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype matmuls run in under a ``Trainer(precision=...)`` value (``"bf16-mixed"`` -> bfloat16)."""
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    if precision.startswith("64"):
        return torch.float64
    return torch.float32
