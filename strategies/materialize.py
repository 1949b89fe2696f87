"""Give a module built on the meta device real, sharded storage, initialised as a normal build would be.

A module built under ``with torch.device("meta"):`` in ``configure_model`` has shapes but no storage,
so a model too big for one device can be sharded (``fully_shard``, ``parallelize_module``) before any
memory is spent. :func:`materialize_meta_module` then allocates each rank's shards (``to_empty``) and
initialises them with each submodule's own ``reset_parameters``.

Deterministic init: each submodule with meta tensors is initialised one at a time, in ``modules()``
order, on a full-size temporary copy of its own parameters drawn from the global RNG (seeded alike on
every rank by ``seed_everything``), and each rank keeps its shard of it. So the values equal those
of a normal build (whose constructors call ``reset_parameters`` in the same order), on any mesh,
while at most one submodule's parameters ever exist whole.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["has_meta_tensors", "materialize_meta_module"]


def _tensors(module: nn.Module, recurse: bool = True) -> list[torch.Tensor]:
    return [*module.parameters(recurse=recurse), *module.buffers(recurse=recurse)]


def has_meta_tensors(module: nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` is on the meta device."""
    return any(t.is_meta for t in _tensors(module))


def materialize_meta_module(module: nn.Module, device: torch.device) -> int:
    """Allocate ``module``'s meta tensors on ``device`` and initialise them; return how many submodules.

    Raises:
        TypeError: a submodule holding meta tensors has no ``reset_parameters`` to initialise them.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    pending = [m for m in module.modules() if any(t.is_meta for t in _tensors(m, recurse=False))]
    for sub in pending:
        if not callable(getattr(sub, "reset_parameters", None)):
            raise TypeError(
                f"configure_model built {type(sub).__name__} on the meta device, but it has no "
                "reset_parameters() to initialise it after sharding; give it one, or build it on a real device"
            )
    module.to_empty(device=device, recurse=True)
    with torch.no_grad():
        for sub in pending:
            sharded = {name: p for name, p in sub.named_parameters(recurse=False) if isinstance(p, DTensor)}
            # The submodule's own reset_parameters runs on full-size plain parameters put in place of its
            # sharded ones for the moment; each rank then copies out its shard.
            full = {
                name: nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device)) for name, p in sharded.items()
            }
            for name, p in full.items():
                sub._parameters[name] = p
            try:
                sub.reset_parameters()  # type: ignore[operator]
            finally:
                for name, p in sharded.items():
                    sub._parameters[name] = p
            for name, p in sharded.items():
                local = distribute_tensor(full[name].data, p.device_mesh, p.placements, src_data_rank=None)
                p.to_local().copy_(local.to_local())
    return len(pending)
