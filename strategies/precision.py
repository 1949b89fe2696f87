"""Precision plugins: how the forward runs (autocast), how backward and the optimizer step are done.

Each plugin is an object that does nothing where its feature is off, so the trainer never branches on
precision. ``"32-true"`` is plain PyTorch; ``"16-mixed"`` is autocast float16 with a GradScaler;
``"bf16-mixed"`` is autocast bfloat16 (no scaler needed: bf16 has float32's exponent range);
``"bf16-true"``, ``"16-true"`` and ``"64-true"`` cast the module's floating point parameters and inputs
to bfloat16, float16 or float64. Every Lightning spelling is accepted (``32``, ``"16"``, ``"bf16"``, ...);
Lightning's plugin precisions (Transformer Engine, bitsandbytes, DeepSpeed) are refused by name.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from trainer.common.tree import apply_to_tensors

__all__ = [
    "NULL_CONTEXT",
    "PRECISIONS",
    "HalfPrecision",
    "MixedPrecision",
    "Precision",
    "make_precision",
    "normalize_precision",
]

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true", "64-true")

#: Lightning's other spellings of the names in :data:`PRECISIONS`.
ALIASES: dict[str | int, str] = {
    32: "32-true",
    "32": "32-true",
    16: "16-mixed",
    "16": "16-mixed",
    "bf16": "bf16-mixed",
    64: "64-true",
    "64": "64-true",
}

_TRUE_DTYPES = {"bf16-true": torch.bfloat16, "16-true": torch.float16, "64-true": torch.float64}

#: The context of every precision without autocast. ``nullcontext`` keeps no state, so one shared
#: instance serves every step and nesting; a generator-based context would cost microseconds per step.
NULL_CONTEXT: contextlib.nullcontext[None] = contextlib.nullcontext()


class Precision:
    """Full float32 precision: autocast off, plain ``backward`` and ``optimizer.step``."""

    name = "32-true"

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast the module's parameters if this precision trains in a lower dtype (default: no-op)."""
        return module

    def convert_input(self, batch: Any) -> Any:
        """Cast floating point inputs if this precision needs it (default: unchanged)."""
        return batch

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        """Context for forward passes (autocast in mixed precision; here a shared do-nothing one)."""
        return NULL_CONTEXT

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backpropagate ``loss`` (``args``/``kwargs``, e.g. ``retain_graph=True``, go to ``loss.backward``)."""
        loss.backward(*args, **kwargs)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients to their true scale before clipping (default: they already are)."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        """Step ``optimizer``; return False when the step was skipped (e.g. fp16 overflow)."""
        optimizer.step(**kwargs)
        return True

    def state_dict(self) -> dict[str, Any]:
        """State to checkpoint (the GradScaler's, when there is one)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class MixedPrecision(Precision):
    """Autocast to ``float16`` or ``bfloat16``; float16 gets a ``torch.amp.GradScaler``.

    The scaler multiplies the loss before backward so small float16 gradients do not flush to zero,
    unscales them exactly once per optimizer step (before clipping, so clipping sees true values), and
    skips the step when they overflowed. ``optimizer_step`` then returns False so step-interval
    schedulers do not advance.
    """

    def __init__(self, dtype: torch.dtype, device_type: str, scaler: torch.amp.GradScaler | None = None):
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"MixedPrecision dtype must be torch.float16 or torch.bfloat16, got {dtype}")
        self.dtype = dtype
        self.device_type = device_type
        self.name = "16-mixed" if dtype == torch.float16 else "bf16-mixed"
        if scaler is None and dtype == torch.float16:
            scaler = torch.amp.GradScaler(device_type)
        self.scaler = scaler
        self._unscaled: set[int] = set()  # ids of optimizers already unscaled in this step

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        # A new autocast object per use: it keeps the previous autocast state on itself while active.
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward(*args, **kwargs)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None and id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        if self.scaler is None:
            optimizer.step(**kwargs)
            return True
        self._unscaled.discard(id(optimizer))
        # get_scale() reads a device scalar: one host-device sync per fp16 step, needed to tell a
        # skipped step from a taken one.
        before = self.scaler.get_scale()
        self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        return not self.scaler.get_scale() < before

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])


class HalfPrecision(Precision):
    """Train entirely in one dtype: parameters and floating point inputs are cast to it.

    ``bfloat16`` (``"bf16-true"``, the default), ``float16`` (``"16-true"``) or ``float64``
    (``"64-true"``, useful for numerical checks). No autocast and no loss scaling.
    """

    name = "bf16-true"

    def __init__(self, dtype: torch.dtype = torch.bfloat16):
        names = {dtype: name for name, dtype in _TRUE_DTYPES.items()}
        if dtype not in names:
            raise ValueError(f"HalfPrecision dtype must be bfloat16, float16 or float64, got {dtype}")
        self.dtype = dtype
        self.name = names[dtype]

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self.dtype)

    def convert_input(self, batch: Any) -> Any:
        return apply_to_tensors(batch, lambda t: t.to(self.dtype) if t.is_floating_point() else t)


def normalize_precision(precision: str | int) -> str:
    """Lightning's spelling of a precision to its name in :data:`PRECISIONS`; others refused by name.

    >>> normalize_precision(16), normalize_precision("bf16"), normalize_precision("64")
    ('16-mixed', 'bf16-mixed', '64-true')
    """
    if isinstance(precision, bool) or not isinstance(precision, (str, int)):
        raise TypeError(f"precision must be a name such as '32-true' or '16-mixed', got {precision!r}")
    name = ALIASES.get(precision, precision)
    if name in PRECISIONS:
        return str(name)
    if isinstance(name, str) and name.startswith(("transformer-engine", "nf4", "int8", "fp8", "deepspeed", "bnb")):
        raise ValueError(
            f"precision={precision!r} is a Lightning plugin precision that geartrain does not support; "
            f"use one of {', '.join(PRECISIONS)} (or Lightning's spellings 32, 16, 'bf16', 64)"
        )
    raise ValueError(f"Unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")


def make_precision(precision: str | int | Precision | None, device_type: str) -> Precision:
    """Build the precision plugin for a name in :data:`PRECISIONS` (or return an instance as is).

    ``None`` means ``"32-true"``; Lightning's spellings (``32``, ``"16"``, ``"bf16"``, ``64``) are accepted.
    """
    if precision is None:
        return Precision()
    if isinstance(precision, Precision):
        return precision
    name = normalize_precision(precision)
    if name == "32-true":
        return Precision()
    if name == "16-mixed":
        return MixedPrecision(torch.float16, device_type)
    if name == "bf16-mixed":
        return MixedPrecision(torch.bfloat16, device_type)
    return HalfPrecision(_TRUE_DTYPES[name])
