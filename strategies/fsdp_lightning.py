"""Lightning's FSDP (version 1) constructor arguments, translated to FSDP2's options or refused.

Lightning's ``FSDPStrategy`` takes ``torch.distributed.fsdp``'s FSDP1 objects (``ShardingStrategy``,
``CPUOffload``, ``MixedPrecision``, an ``auto_wrap_policy``); ours shards with FSDP2's ``fully_shard``.
Each argument that has an FSDP2 equivalent becomes it here; each that has none raises, naming what
to use instead, so no Lightning setting is silently dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

__all__ = [
    "activation_checkpointing_classes",
    "cpu_offload_config",
    "fsdp2_mixed_precision",
    "sharding_strategy",
    "use_orig_params",
]

_HYBRID = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")


def sharding_strategy(value: Any) -> tuple[Any, bool]:
    """Lightning's ``sharding_strategy`` (an enum or its name, any case) and FSDP2's ``reshard_after_forward``.

    ``FULL_SHARD`` frees gathered weights after forward (``True``); ``SHARD_GRAD_OP`` keeps them until
    backward (``False``). ``NO_SHARD`` and the hybrid strategies have no FSDP2 single-mesh equivalent here.
    """
    from torch.distributed.fsdp import ShardingStrategy

    if isinstance(value, str):
        try:
            value = ShardingStrategy[value.upper()]
        except KeyError:
            names = ", ".join(s.name for s in ShardingStrategy)
            raise ValueError(f"FSDPStrategy(sharding_strategy={value!r}): expected one of {names}") from None
    if value == ShardingStrategy.FULL_SHARD:
        return value, True
    if value == ShardingStrategy.SHARD_GRAD_OP:
        return value, False
    if value == ShardingStrategy.NO_SHARD:
        raise ValueError(
            "FSDPStrategy(sharding_strategy=NO_SHARD) replicates the whole model on every rank, which is "
            "data parallelism: use strategy='ddp' instead"
        )
    if getattr(value, "name", None) in _HYBRID:
        raise ValueError(
            f"FSDPStrategy(sharding_strategy={value.name}): hybrid sharding over a 2-D mesh is not supported "
            "by geartrain's FSDPStrategy; use ModelParallelStrategy and call fully_shard with a 2-D device_mesh "
            "in configure_model, or FSDPStrategy(reshard_after_forward=<ranks per node>) to regather within a node"
        )
    raise ValueError(f"FSDPStrategy(sharding_strategy={value!r}) must be a ShardingStrategy or its name")


def cpu_offload_config(value: Any) -> Any:
    """Lightning's ``cpu_offload`` (a bool or FSDP1's ``CPUOffload``) as a ``CPUOffload``, whose
    ``offload_params`` turns on FSDP2's ``CPUOffloadPolicy``."""
    from torch.distributed.fsdp import CPUOffload

    if isinstance(value, bool):
        return CPUOffload(offload_params=value)
    if isinstance(value, CPUOffload):
        return value
    raise TypeError(f"FSDPStrategy(cpu_offload=...) takes a bool or a CPUOffload, got {value!r}")


def fsdp2_mixed_precision(config: Any) -> Any:
    """FSDP2's ``MixedPrecisionPolicy`` for Lightning's ``mixed_precision`` (FSDP1's ``MixedPrecision``, or
    a ``MixedPrecisionPolicy`` given as it is); ``None`` when none was given.

    FSDP2 casts parameters (``param_dtype``) and reduces gradients (``reduce_dtype``) like FSDP1, but
    never casts buffers and always gives full-precision gradients to the optimizer: ``buffer_dtype`` and
    ``keep_low_precision_grads`` are refused rather than dropped.
    """
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    if config is None or isinstance(config, MixedPrecisionPolicy):
        return config
    if not isinstance(config, MixedPrecision):
        raise TypeError(f"FSDPStrategy(mixed_precision=...) takes a MixedPrecision(Policy), got {config!r}")
    if config.buffer_dtype is not None:
        raise ValueError(
            "FSDPStrategy(mixed_precision=MixedPrecision(buffer_dtype=...)): FSDP2 does not cast buffers; "
            "cast them in configure_model, or leave buffer_dtype=None"
        )
    if config.keep_low_precision_grads:
        raise ValueError(
            "FSDPStrategy(mixed_precision=MixedPrecision(keep_low_precision_grads=True)): FSDP2 always gives "
            "the optimizer float32 gradients of the float32 shards; leave keep_low_precision_grads=False"
        )
    return MixedPrecisionPolicy(
        param_dtype=config.param_dtype,
        reduce_dtype=config.reduce_dtype,
        cast_forward_inputs=config.cast_forward_inputs or config.cast_root_forward_inputs,
    )


def activation_checkpointing_classes(policy: Any, argument: str) -> tuple[type[nn.Module], ...]:
    """The module classes of Lightning's ``activation_checkpointing_policy`` or ``auto_wrap_policy``: a set
    (or list) of classes, or FSDP1's ``ModuleWrapPolicy``. A callable policy cannot be read and is refused."""
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    if isinstance(policy, ModuleWrapPolicy):
        return tuple(policy._module_classes)
    if isinstance(policy, type) and issubclass(policy, nn.Module):
        return (policy,)
    if isinstance(policy, Iterable) and all(isinstance(c, type) and issubclass(c, nn.Module) for c in policy):
        return tuple(policy)
    raise TypeError(
        f"FSDPStrategy({argument}={policy!r}): geartrain takes a set of nn.Module classes or a ModuleWrapPolicy, "
        "not a callable policy; name the block classes, e.g. {TransformerBlock}"
    )


def use_orig_params(value: Any) -> bool:
    """FSDP2 always trains the original parameters (Lightning's default ``use_orig_params=True``)."""
    if value is not True:
        raise ValueError(
            f"FSDPStrategy(use_orig_params={value!r}): FSDP2 always keeps the original parameters (as "
            "use_orig_params=True); there are no flat parameters to use instead"
        )
    return True
