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

__all__ = [
    "NULL_CONTEXT",
    "PRECISIONS",
    "DoublePrecision",
    "DtypeContext",
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
    """Full float32 precision (``"32-true"``): autocast off, plain ``backward`` and ``optimizer.step``.

    Lightning's ``lightning.pytorch.plugins.Precision``: the base of every precision plugin, with its
    methods (``convert_module``, ``forward_context``, ``module_init_context``, ``backward``,
    ``optimizer_step``, ``clip_gradients``, ...). The trainer calls the strategy, which calls these;
    a subclass given as ``Trainer(plugins=[...])`` replaces the strategy's plugin.
    """

    #: Lightning's name of this precision (``"32-true"``, ``"16-mixed"``, ...).
    precision: str = "32-true"

    @property
    def name(self) -> str:
        """The precision's name (:attr:`precision`), as the trainer and the ``geartrain`` command report it."""
        return self.precision

    @name.setter
    def name(self, value: str) -> None:
        self.precision = value

    # ----------------------------------------------------------------- module and data
    def connect(self, model: Any, optimizers: Any, lr_schedulers: Any) -> tuple[Any, Any, Any]:
        """Lightning's hook to wrap the model, optimizers and schedulers: here they are returned unchanged."""
        return model, optimizers, lr_schedulers

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast the module's parameters if this precision trains in a lower dtype (default: no-op)."""
        return module

    def convert_input(self, data: Any) -> Any:
        """Cast floating point inputs if this precision needs it (default: unchanged)."""
        return data

    def convert_output(self, data: Any) -> Any:
        """Cast floating point outputs back to torch's default dtype where this precision changed it."""
        return data

    def tensor_init_context(self) -> contextlib.AbstractContextManager[Any]:
        """Context in which tensors are created in this precision's dtype (default: nothing changes)."""
        return contextlib.nullcontext()

    def module_init_context(self) -> contextlib.AbstractContextManager[Any]:
        """Context around ``configure_model`` (and ``trainer.init_module()``): layers made in it get this
        precision's dtype (default: the same as :meth:`tensor_init_context`)."""
        return self.tensor_init_context()

    # ----------------------------------------------------------------- the step
    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        """Context for forward passes (autocast in mixed precision; here a shared do-nothing one)."""
        return NULL_CONTEXT

    def train_step_context(self) -> contextlib.AbstractContextManager[Any]:
        """Context around ``training_step``: :meth:`forward_context`."""
        return self.forward_context()

    def val_step_context(self) -> contextlib.AbstractContextManager[Any]:
        """Context around ``validation_step``: :meth:`forward_context`."""
        return self.forward_context()

    def test_step_context(self) -> contextlib.AbstractContextManager[Any]:
        """Context around ``test_step``: :meth:`forward_context`."""
        return self.forward_context()

    def predict_step_context(self) -> contextlib.AbstractContextManager[Any]:
        """Context around ``predict_step``: :meth:`forward_context`."""
        return self.forward_context()

    def pre_backward(self, tensor: torch.Tensor, module: Any) -> torch.Tensor:
        """Lightning's seam before backward; the loop calls ``on_before_backward`` itself, so: ``tensor``."""
        return tensor

    def backward(
        self, tensor: torch.Tensor, model: Any = None, optimizer: Any = None, *args: Any, **kwargs: Any
    ) -> None:
        """Backpropagate ``tensor``: ``model.backward(tensor, *args, **kwargs)`` where a module is given
        (Lightning's call, so a module's ``backward`` override runs), else ``tensor.backward(*args, **kwargs)``.

        ``args``/``kwargs`` (e.g. ``retain_graph=True``) reach ``backward``.
        """
        if model is None:
            tensor.backward(*args, **kwargs)
        else:
            model.backward(tensor, *args, **kwargs)

    def post_backward(self, tensor: torch.Tensor, module: Any) -> torch.Tensor:
        """Lightning's seam after backward; the loop calls ``on_after_backward`` itself, so: ``tensor``."""
        return tensor

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients to their true scale before clipping (default: they already are)."""

    def optimizer_step(self, optimizer: Any, model: Any = None, closure: Any = None, **kwargs: Any) -> Any:
        """Step ``optimizer`` (with ``closure`` where given, as Lightning's ``optimizer.step(closure=...)``);
        returns what the step returned."""
        if closure is None:
            return optimizer.step(**kwargs)
        return optimizer.step(closure=closure, **kwargs)

    def step_taken(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        """The trainer's optimizer step: :meth:`optimizer_step`, then whether it was taken (False when
        skipped, e.g. an fp16 overflow), so step-interval schedulers advance only on a taken step."""
        self.optimizer_step(optimizer, **kwargs)
        return True

    def clip_gradients(
        self, optimizer: torch.optim.Optimizer, clip_val: float = 0.0, gradient_clip_algorithm: str = "norm"
    ) -> None:
        """Clip the optimizer's gradients by ``"norm"`` or ``"value"``; nothing when ``clip_val`` is 0 or less.

        Lightning's plugin method (what ``LightningModule.clip_gradients`` calls); gradients are
        unscaled first (exactly once) where the precision scales them.
        """
        if clip_val <= 0:
            return
        self.unscale_gradients(optimizer)
        if gradient_clip_algorithm == "value":
            self.clip_grad_by_value(optimizer, clip_val)
        elif gradient_clip_algorithm == "norm":
            self.clip_grad_by_norm(optimizer, clip_val)
        else:
            raise ValueError(f"gradient_clip_algorithm must be 'norm' or 'value', got {gradient_clip_algorithm!r}")

    def clip_grad_by_value(self, optimizer: torch.optim.Optimizer, clip_val: float) -> None:
        """Clip every gradient of ``optimizer`` to ``[-clip_val, clip_val]``."""
        torch.nn.utils.clip_grad_value_(_parameters(optimizer), clip_val)

    def clip_grad_by_norm(self, optimizer: torch.optim.Optimizer, clip_val: float) -> None:
        """Scale the gradients of ``optimizer`` so that their total 2-norm is at most ``clip_val``."""
        torch.nn.utils.clip_grad_norm_(_parameters(optimizer), clip_val)

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """State to checkpoint (the GradScaler's, when there is one)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def teardown(self) -> None:
        """Release what the plugin holds at the end of a run (nothing here)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(precision={self.precision!r})"


def _parameters(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


_MIXED = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}


class MixedPrecision(Precision):
    """Autocast to ``float16`` (``"16-mixed"``) or ``bfloat16`` (``"bf16-mixed"``); float16 gets a ``GradScaler``.

    Lightning's ``MixedPrecision(precision, device, scaler=None)``; geartrain's older form
    ``MixedPrecision(torch.float16, "cpu", scaler)`` is accepted too. The scaler multiplies the loss
    before backward so small float16 gradients do not flush to zero, unscales them exactly once per
    optimizer step (before clipping, so clipping sees true values), and skips the step when they
    overflowed; :meth:`step_taken` then returns False so step-interval schedulers do not advance.
    """

    def __init__(
        self, precision: str | torch.dtype, device: str | torch.device, scaler: torch.amp.GradScaler | None = None
    ) -> None:
        if isinstance(precision, torch.dtype):
            names = {dtype: name for name, dtype in _MIXED.items()}
            if precision not in names:
                raise ValueError(f"MixedPrecision dtype must be torch.float16 or torch.bfloat16, got {precision}")
            precision = names[precision]
        if precision not in _MIXED:
            raise ValueError(
                f"Passed `{type(self).__name__}(precision={precision!r})`. Precision must be '16-mixed' or 'bf16-mixed'."
            )
        if scaler is not None and precision == "bf16-mixed":
            raise ValueError(f"`precision='bf16-mixed'` does not use a scaler, found {scaler}.")
        self.precision = precision
        self.dtype = _MIXED[precision]
        #: The device autocast runs on, as given (Lightning's attribute); its kind is :attr:`device_type`.
        self.device = str(device)
        self.device_type = torch.device(device).type if not isinstance(device, str) or ":" in device else device
        if scaler is None and self.dtype == torch.float16:
            scaler = torch.amp.GradScaler(self.device_type)
        self.scaler = scaler
        self._unscaled: set[int] = set()  # ids of optimizers already unscaled in this step

    def autocast_context_manager(self) -> torch.autocast:
        """A new ``torch.autocast`` for this device and dtype (Lightning's name for :meth:`forward_context`)."""
        # A new object per use: it keeps the previous autocast state on itself while active.
        return torch.autocast(self.device_type, dtype=self.dtype)

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        return self.autocast_context_manager()

    def pre_backward(self, tensor: torch.Tensor, module: Any) -> torch.Tensor:
        """The loss scaled by the ``GradScaler`` (float16), as it is to be backpropagated."""
        return self.scaler.scale(tensor) if self.scaler is not None else tensor

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None and id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def optimizer_step(self, optimizer: Any, model: Any = None, closure: Any = None, **kwargs: Any) -> Any:
        if self.scaler is None:
            return super().optimizer_step(optimizer, model, closure, **kwargs)
        if closure is not None:  # the scaler's step takes no closure: run it first, as Lightning does
            closure()
        self._unscaled.discard(id(optimizer))
        out = self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        return out

    def step_taken(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        if not isinstance(self.scaler, torch.amp.GradScaler):
            return super().step_taken(optimizer, **kwargs)
        # get_scale() reads a device scalar: one host-device sync per fp16 step, needed to tell a
        # skipped step from a taken one.
        before = self.scaler.get_scale()
        self.optimizer_step(optimizer, **kwargs)
        return not self.scaler.get_scale() < before

    def clip_gradients(
        self, optimizer: torch.optim.Optimizer, clip_val: float = 0.0, gradient_clip_algorithm: str = "norm"
    ) -> None:
        if clip_val > 0 and getattr(optimizer, "_step_supports_amp_scaling", False):
            raise RuntimeError(
                f"The current optimizer, {type(optimizer).__qualname__}, does not allow for gradient clipping"
                " because it performs unscaling of gradients internally. HINT: Are you using a 'fused' optimizer?"
            )
        super().clip_gradients(optimizer, clip_val, gradient_clip_algorithm)

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])


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
    allowed = ", ".join([*PRECISIONS, *(repr(a) for a in ALIASES)])
    raise ValueError(f"Precision {precision!r} is invalid. Allowed precision values: {allowed}")


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
    if name == "64-true":
        return DoublePrecision()
    return HalfPrecision(name)


# The true precisions live beside this module (imported last: they subclass Precision).
from strategies.precision_true import DoublePrecision, DtypeContext, HalfPrecision  # noqa: E402
