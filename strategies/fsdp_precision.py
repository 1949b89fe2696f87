"""FSDP2's own mixed precision: the trainer's ``precision`` as a ``MixedPrecisionPolicy``.

Autocast casts float32 weights to the low dtype at every op, after FSDP has all-gathered them in
float32; the policy instead all-gathers the weights already cast, so each step moves half the bytes,
and the sharded master weights, their gradients after reduction and the optimizer state stay float32.

- ``"bf16-mixed"``: ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`` and no
  autocast: the forward and backward run entirely in bfloat16 (as torchtitan trains), gradients are
  reduced and stored in float32. bf16 has float32's exponent range, so no loss scaling.
- ``"16-mixed"``: ``param_dtype=float16, reduce_dtype=float32`` with the ``GradScaler`` as before, and
  autocast kept: float16's narrow range is what autocast's float32 op list (softmax, norms, losses) is
  for, while the policy still halves the all-gathered bytes.
- ``"bf16-true"``/``"16-true"``/``"64-true"`` convert the module (the parameters themselves are in
  that dtype); ``"32-true"`` has no policy.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch
from torch import nn

from strategies.precision import MixedPrecision, Precision
from strategies.precision_true import DtypeCasts

__all__ = [
    "FSDPPrecision",
    "PolicyPrecision",
    "ScaledPolicyPrecision",
    "as_sharded_precision",
    "mixed_precision_policy",
]

#: The precisions ``FSDPPrecision`` takes, and the dtype each creates and converts modules and inputs in.
_FSDP_DTYPES = {
    "32-true": torch.float32,
    "16-true": torch.float16,
    "bf16-true": torch.bfloat16,
    "16-mixed": torch.float32,
    "bf16-mixed": torch.float32,
}


def _policy(dtype: torch.dtype) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


class PolicyPrecision(Precision):
    """``"bf16-mixed"`` under FSDP2: bfloat16 compute from the policy, no autocast, no loss scaling.

    Keeps the base class's forward context, backward and optimizer step, so the training step binds
    the plain operations (nothing is entered per step).
    """

    precision = "bf16-mixed"

    def __init__(self, dtype: torch.dtype = torch.bfloat16) -> None:
        self.dtype = dtype

    def policy(self) -> Any:
        """The ``MixedPrecisionPolicy`` to give ``fully_shard``: bfloat16 parameters, float32 reduction."""
        return _policy(self.dtype)


class ScaledPolicyPrecision(MixedPrecision):
    """``"16-mixed"`` under FSDP2: float16 parameters from the policy, autocast and the ``GradScaler`` kept."""

    def policy(self) -> Any:
        """The ``MixedPrecisionPolicy`` to give ``fully_shard``: float16 parameters, float32 reduction."""
        return _policy(self.dtype)


def as_sharded_precision(precision: Precision) -> Precision:
    """``precision`` as FSDP2 should run it: autocast mixed precision becomes a policy precision.

    Other plugins (full, true half, a subclass of the user's own) are returned as they are.
    """
    if type(precision) is MixedPrecision:
        if precision.dtype == torch.bfloat16:
            return PolicyPrecision(precision.dtype)
        return ScaledPolicyPrecision(precision.dtype, precision.device_type, precision.scaler)
    return precision


def mixed_precision_policy(precision: Precision) -> Any:
    """The ``MixedPrecisionPolicy`` for ``precision``, or the default (no casting) one."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if isinstance(precision, (PolicyPrecision, ScaledPolicyPrecision)):
        return precision.policy()
    return MixedPrecisionPolicy()


class FSDPPrecision(DtypeCasts, MixedPrecision):
    """Lightning's ``FSDPPrecision(precision, scaler=None)``: a precision plugin for FSDP, given by hand.

    ``"32-true"``, ``"16-true"``, ``"bf16-true"`` (the module converted, created and run in that dtype),
    ``"16-mixed"`` (autocast float16 with a ``ShardedGradScaler``) or ``"bf16-mixed"`` (autocast
    bfloat16). ``Trainer(strategy="fsdp", precision=...)`` does not build one: geartrain's FSDP2
    strategy runs mixed precision as FSDP2's ``MixedPrecisionPolicy`` (see the module docstring).
    :attr:`mixed_precision_config` is the FSDP1 ``MixedPrecision`` Lightning's ``FSDPStrategy`` reads.
    """

    def __init__(self, precision: str, scaler: Any = None) -> None:
        if precision not in _FSDP_DTYPES:
            raise ValueError(
                f"`precision={precision!r})` is not supported in FSDP. `precision` must be one of: {tuple(_FSDP_DTYPES)}."
            )
        if scaler is not None and precision != "16-mixed":
            raise ValueError(f"`precision={precision!r}` does not use a scaler, found {scaler}.")
        if scaler is None and precision == "16-mixed":
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            scaler = ShardedGradScaler()
        self.precision = precision
        self.scaler = scaler
        self.dtype = torch.bfloat16 if precision.startswith("bf16") else torch.float16
        self.device = self.device_type = "cuda"  # Lightning's FSDP autocasts on CUDA
        self._desired_input_dtype = _FSDP_DTYPES[precision]
        self._unscaled: set[int] = set()

    @property
    def mixed_precision_config(self) -> Any:
        """FSDP1's ``torch.distributed.fsdp.MixedPrecision`` for this precision (as Lightning's plugin gives)."""
        from torch.distributed.fsdp import MixedPrecision as TorchMixedPrecision

        if self.precision in ("16-true", "bf16-true"):
            warnings.warn(
                f"FSDP with `{self.precision}` enables computation in lower precision. "
                "FSDP will always retain a full-precision copy of the model parameters for sharding.",
                UserWarning,
                stacklevel=2,
            )
        dtype = {"16": torch.float16, "bf16": torch.bfloat16, "32": torch.float32}[self.precision.split("-")[0]]
        return TorchMixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype)

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self._desired_input_dtype) if "true" in self.precision else module

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        return self.autocast_context_manager() if "mixed" in self.precision else super().forward_context()

    def clip_grad_by_norm(self, optimizer: torch.optim.Optimizer, clip_val: float) -> None:
        raise ValueError(
            f"`gradient_clip_algorithm='norm'` is not supported for `{type(self).__name__}` "
            "(Lightning's FSDP plugin); use gradient_clip_algorithm='value', or strategy='fsdp' with "
            "Trainer(precision=...), whose clipping by norm works on sharded gradients"
        )
