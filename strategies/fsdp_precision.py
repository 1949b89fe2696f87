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

from typing import Any

import torch

from strategies.precision import MixedPrecision, Precision

__all__ = ["PolicyPrecision", "ScaledPolicyPrecision", "as_sharded_precision", "mixed_precision_policy"]


def _policy(dtype: torch.dtype) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


class PolicyPrecision(Precision):
    """``"bf16-mixed"`` under FSDP2: bfloat16 compute from the policy, no autocast, no loss scaling.

    Keeps the base class's forward context, backward and optimizer step, so the training step binds
    the plain operations (nothing is entered per step).
    """

    name = "bf16-mixed"

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
