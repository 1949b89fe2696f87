"""Maps over nested batches: apply a function to every tensor, move them, count samples.

A batch is whatever the user's dataloader yields: tensors nested in tuples, lists, dicts,
namedtuples and dataclasses. The trainer, the strategies (moving batches, merging replica outputs)
and the callbacks (counting samples) all walk it the same way, with these functions.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = ["apply_to_tensors", "batch_size_of", "device_mover", "is_metric", "move_to_device"]

_Tensor = torch.Tensor


def apply_to_tensors(data: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Return ``data`` with ``fn`` applied to every tensor nested in it.

    Dicts (and other mappings), lists, tuples, namedtuples and dataclass instances are rebuilt with the
    same type; anything else (strings, numbers, custom objects) is returned unchanged.

    >>> apply_to_tensors({"x": torch.zeros(2), "n": 3}, lambda t: t + 1)
    {'x': tensor([1., 1.]), 'n': 3}
    """
    if isinstance(data, torch.Tensor):
        return fn(data)
    kind = type(data)
    if kind is tuple or kind is list:  # the usual batch, checked before the slower ABC checks below
        return kind([apply_to_tensors(v, fn) for v in data])
    if isinstance(data, Mapping):
        items = {k: apply_to_tensors(v, fn) for k, v in data.items()}
        if isinstance(data, defaultdict):  # its constructor takes the default factory first
            return type(data)(data.default_factory, items)
        try:
            return type(data)(items)  # type: ignore[call-arg]
        except TypeError:  # a mapping type without a dict constructor
            return items
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(apply_to_tensors(v, fn) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(apply_to_tensors(v, fn) for v in data)
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        changes = {f.name: apply_to_tensors(getattr(data, f.name), fn) for f in dataclasses.fields(data) if f.init}
        return dataclasses.replace(data, **changes)
    return data


def move_to_device(data: Any, device: torch.device) -> Any:
    """Move every tensor nested in ``data`` to ``device`` (non-blocking where that is safe).

    >>> move_to_device((torch.ones(1), "id-7"), torch.device("meta"))
    (tensor(..., device='meta', size=(1,)), 'id-7')
    """
    kind = type(data)
    if kind is tuple or kind is list:  # the usual (inputs, targets) batch: if already in place, keep it
        for t in data:
            if type(t) is not torch.Tensor or t.device != device:
                break
        else:
            return data
    non_blocking = device.type == "cuda"

    def move(t: torch.Tensor) -> torch.Tensor:
        # ``to`` would return ``t`` itself too, but comparing devices first is several times cheaper.
        return t if t.device == device else t.to(device, non_blocking=non_blocking)

    return apply_to_tensors(data, move)


def device_mover(device: torch.device) -> Callable[[Any], Any]:
    """:func:`move_to_device` to ``device`` as one callable, for a loop that moves every batch.

    The usual batch, a tuple or list of tensors already on a CPU ``device``, is returned as it is
    after a test per tensor that costs half of comparing devices (``is_cpu``: no device object made).
    """
    if device.type != "cpu":
        return lambda data: move_to_device(data, device)

    def move(data: Any) -> Any:
        kind = type(data)
        if kind is tuple or kind is list:
            for t in data:
                if type(t) is not _Tensor or not t.is_cpu:
                    break
            else:
                return data
        return move_to_device(data, device)

    return move


def batch_size_of(batch: Any) -> int:
    """Guess the number of samples in ``batch``: the length of the first tensor found in it.

    Used to weight epoch-level means when ``self.log`` is not given ``batch_size``. Returns 1 when the
    batch holds no tensor with a batch dimension.

    >>> batch_size_of({"text": ["a", "b"], "ids": torch.zeros(3, 7)})
    3
    """
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim > 0 else 1
    if (type(batch) is tuple or type(batch) is list) and batch and isinstance(batch[0], torch.Tensor):
        return int(batch[0].shape[0]) if batch[0].ndim > 0 else 1  # the usual batch: (inputs, targets)
    if isinstance(batch, str):
        return 1
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        batch = [getattr(batch, f.name) for f in dataclasses.fields(batch)]
    if isinstance(batch, Sequence):
        for item in batch:
            size = batch_size_of(item)
            if size != 1 or isinstance(item, torch.Tensor):
                return size
    return 1


def is_metric(value: Any) -> bool:
    """True for a torchmetrics ``Metric`` (duck-typed, so torchmetrics is imported only by users)."""
    return callable(getattr(value, "compute", None)) and callable(getattr(value, "reset", None))
