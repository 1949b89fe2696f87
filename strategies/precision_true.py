"""The true precisions: parameters, inputs and the tensors a step creates in one dtype.

``"bf16-true"`` and ``"16-true"`` (:class:`HalfPrecision`), ``"64-true"`` (:class:`DoublePrecision`):
no autocast and no loss scaling. Inside the step, ``configure_model`` and ``trainer.init_module()``
the dtype is torch's default (:class:`DtypeContext`), as Lightning's plugins make it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from strategies.precision import _TRUE_DTYPES, Precision
from trainer.common.tree import apply_to_tensors

__all__ = ["DoublePrecision", "DtypeCasts", "DtypeContext", "HalfPrecision"]


class DtypeContext:
    """Makes ``dtype`` torch's default dtype inside the ``with`` (restored on exit, also on an error).

    Lightning's true-precision plugins create tensors and modules in their dtype this way: a
    ``torch.zeros(3)`` inside ``training_step`` under ``"64-true"`` is float64, as the parameters are.
    """

    def __init__(self, dtype: torch.dtype) -> None:
        self._new_dtype = dtype
        self._previous: list[torch.dtype] = []

    def __enter__(self) -> None:
        self._previous.append(torch.get_default_dtype())
        torch.set_default_dtype(self._new_dtype)

    def __exit__(self, *exc: object) -> None:
        torch.set_default_dtype(self._previous.pop())


class DtypeCasts:
    """The casts of a precision that runs in one dtype (``_desired_input_dtype``), shared by the true
    precisions and Lightning's ``FSDPPrecision``: floating point inputs cast to it, outputs back to
    torch's default, and tensors created and steps run with it as torch's default (:class:`DtypeContext`).
    """

    _desired_input_dtype: torch.dtype = torch.float32

    def convert_input(self, data: Any) -> Any:
        return _cast_floats(data, self._desired_input_dtype)

    def convert_output(self, data: Any) -> Any:
        return _cast_floats(data, torch.get_default_dtype())

    def tensor_init_context(self) -> contextlib.AbstractContextManager[Any]:
        return DtypeContext(self._desired_input_dtype)

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        return DtypeContext(self._desired_input_dtype)


def _cast_floats(data: Any, dtype: torch.dtype) -> Any:
    return apply_to_tensors(data, lambda t: t.to(dtype) if t.is_floating_point() else t)


class _CastPrecision(DtypeCasts, Precision):
    """What the true precisions share: parameters and floating point inputs in one dtype, created in it.

    No autocast and no loss scaling; inside the step, configure_model and ``trainer.init_module()``
    the dtype is torch's default (:class:`DtypeContext`), as in Lightning.
    """

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self._desired_input_dtype)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype parameters and inputs are cast to."""
        return self._desired_input_dtype


class HalfPrecision(_CastPrecision):
    """Train entirely in half precision: ``"bf16-true"`` (the default) or ``"16-true"``.

    Lightning's ``HalfPrecision(precision="bf16-true")``; ``HalfPrecision(torch.float16)`` is accepted
    too (``torch.float64`` gives ``"64-true"``; :class:`DoublePrecision` is Lightning's class for it).
    """

    precision = "bf16-true"

    def __init__(self, precision: str | torch.dtype = "bf16-true") -> None:
        names = {dtype: name for name, dtype in _TRUE_DTYPES.items()}
        if isinstance(precision, torch.dtype):
            if precision not in names:
                raise ValueError(f"HalfPrecision dtype must be bfloat16, float16 or float64, got {precision}")
            precision = names[precision]
        if precision not in ("bf16-true", "16-true", "64-true"):
            raise ValueError(
                f"Passed `HalfPrecision(precision={precision!r})`. Precision must be 'bf16-true' or '16-true'."
            )
        self.precision = precision
        self._desired_input_dtype = _TRUE_DTYPES[precision]


class DoublePrecision(_CastPrecision):
    """``"64-true"``: parameters, inputs and the tensors a step creates in float64 (numerical checks).

    ``convert_module`` is ``module.double()``: complex buffers keep their dtype (``module.to(float64)``
    would drop their imaginary part); create them in ``configure_model`` to get complex128.
    """

    precision = "64-true"
    _desired_input_dtype = torch.float64

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module.double()
