"""Lazy modules (``nn.LazyLinear`` and friends) made whole before a strategy wraps them.

DDP, FSDP and optimizers need every parameter's shape, and a lazy module learns its shapes from its
first forward: plain ``DistributedDataParallel`` (and Lightning's ``ddp``) refuse it with "Modules with
uninitialized parameters". Before the strategy wraps the module, :func:`materialize_lazy` runs one
forward without gradients on ``example_input_array``, or else on the first element of the first
training batch (the whole batch when it is a tensor). The global random state is put back after it,
so the parameters a lazy layer draws, and everything drawn later, equal an eager build's run.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.parameter import is_lazy

from trainer.common.errors import UserError

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["has_lazy_parameters", "materialize_lazy"]


def has_lazy_parameters(module: torch.nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` is still uninitialised (a lazy module's)."""
    return any(is_lazy(t) for t in (*module.parameters(), *module.buffers()))


def materialize_lazy(trainer: Trainer, module: TrainModule, loader: Iterable[Any] | None) -> None:
    """Give ``module``'s lazy layers their shapes with one forward, leaving the random state as it was."""
    if not has_lazy_parameters(module):
        return
    example = module.example_input_array
    if example is None:
        example = _first_input(loader)
    if example is None:
        raise UserError(
            f"{type(module).__name__} has lazy layers (uninitialised parameters), which must get their shapes "
            "before the strategy wraps the module: set `self.example_input_array` to an input of forward(), "
            "or pass the training DataLoader to fit(...)"
        )
    device = trainer.strategy.root_device
    module.to(device)
    example = trainer.strategy.batch_to_device(example)
    cuda = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), torch.no_grad():
        if isinstance(example, dict):
            module(**example)
        elif isinstance(example, tuple):
            module(*example)
        else:
            module(example)


def _first_input(loader: Iterable[Any] | None) -> Any:
    """The first element of the loader's first batch (the batch itself when it is a tensor), else None."""
    if not isinstance(loader, torch.utils.data.DataLoader):
        return None
    with torch.random.fork_rng(devices=[]):  # drawing a shuffled order moves the global generator
        batch = next(iter(loader), None)
    if isinstance(batch, (list, tuple)) and batch:
        return batch[0]
    return batch
