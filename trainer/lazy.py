"""Lazy modules (``nn.LazyLinear`` and friends) made whole before a strategy wraps them.

DDP, FSDP and optimizers need every parameter's shape, and a lazy module learns its shapes from its
first forward: plain ``DistributedDataParallel`` (and Lightning's ``ddp``) refuse it with "Modules with
uninitialized parameters". Before the strategy wraps the module, :func:`materialize_lazy` runs one
forward without gradients on ``example_input_array``, or else on the first element of a training
batch (the whole batch when it is a tensor), however the data comes: loaders passed to ``fit``, a
data module's or the module's ``train_dataloader()`` (then requested here, once, and kept for the fit).

The forward changes nothing a run depends on: the global random state is put back after it (so
everything drawn later equals the run of a module built whole), it runs in eval mode (no batch-norm
statistics move), and the batch is built from the dataset's first samples rather than drawn from the
loader, whose sampler stays untouched.
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
    """Give ``module``'s lazy layers their shapes with one forward, leaving the run's state as it was."""
    if not has_lazy_parameters(module):
        return
    has_forward = type(module).forward is not torch.nn.Module.forward
    example = module.example_input_array if has_forward else None
    if example is None and has_forward:
        if loader is None and trainer.run_state.fn == "fit":
            loader = trainer._fit_loader()  # the data module's or module's, prepared once and kept for the fit
        example = _first_input(loader)
    if example is None:
        if not trainer.strategy.wraps_module:
            return  # the first training step gives the shapes, as in plain PyTorch (and Lightning)
        missing = "an input" if has_forward else "a forward() method"
        raise UserError(
            f"{type(module).__name__} has lazy layers (uninitialised parameters), which need their shapes before "
            f"{type(trainer.strategy).__name__} wraps the module, and the trainer found {missing} to run them on: "
            "define forward() and set `self.example_input_array` to an input of it in __init__"
        )
    device = trainer.strategy.root_device
    module.to(device)
    example = trainer.strategy.batch_to_device(example)
    cuda = [device.index or 0] if device.type == "cuda" else []
    modes = [(m, m.training) for m in module.modules()]
    for m, _ in modes:
        m.training = False  # no batch-norm statistics move (set directly: a user's train() is not called)
    try:
        with torch.random.fork_rng(devices=cuda), torch.no_grad():
            if isinstance(example, dict):
                module(**example)
            elif isinstance(example, tuple):
                module(*example)
            else:
                module(example)
    finally:
        for m, training in modes:
            m.training = training


def _first_input(loader: Iterable[Any] | None) -> Any:
    """The first element of a batch of the dataset's first samples (the batch itself when a tensor), else None.

    A map-style dataset's batch is collated from its first ``batch_size`` samples, so the loader's
    sampler draws nothing; a stream's first batch is read. Several loaders: the first one's.
    """
    combined = getattr(loader, "loaders", None)
    if combined:
        loader = combined[0] if isinstance(combined, (list, tuple)) else None
    if not isinstance(loader, torch.utils.data.DataLoader):
        return None
    dataset = loader.dataset
    with torch.random.fork_rng(devices=[]):  # an augmentation in __getitem__ draws from the global generator
        if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
            batch = next(iter(loader), None)
        elif len(dataset) == 0:
            return None
        elif loader.batch_sampler is None:  # automatic batching off: each sample is a batch
            batch = loader.collate_fn(dataset[0])
        else:
            size = min(len(dataset), _batch_size(loader.batch_sampler))
            batch = loader.collate_fn([dataset[i] for i in range(size)])
    if isinstance(batch, (list, tuple)) and batch:
        return batch[0]
    return batch


def _batch_size(batch_sampler: Any) -> int:
    """The batch size of a batch sampler, looking inside the trainer's wrappers (2 when it has none)."""
    while batch_sampler is not None:
        size = getattr(batch_sampler, "batch_size", None)
        if isinstance(size, int) and size > 0:
            return size
        batch_sampler = getattr(batch_sampler, "batch_sampler", None)
    return 2
