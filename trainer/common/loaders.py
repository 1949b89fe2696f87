"""Rebuilding a ``DataLoader`` with some settings changed and every other one kept.

A ``DataLoader`` cannot be modified once built, yet strategies give it a sharding sampler and the
trainer a resumable batch sampler; both rebuild it through :func:`rebuild_dataloader`, so no setting
of the user's loader (workers, pinning, collate function, ...) is lost on the way.
"""

from __future__ import annotations

import copy
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset

__all__ = ["rebuild_dataloader", "shut_down_workers"]


def rebuild_dataloader(loader: DataLoader[Any], **changes: Any) -> DataLoader[Any]:
    """A new ``DataLoader`` with ``loader``'s settings and ``changes`` applied.

    Giving ``sampler`` or ``batch_sampler`` replaces the batching (the original batch size and
    ``drop_last`` are kept when only ``sampler`` is given). A loader over an ``IterableDataset``
    keeps its batch size and ``drop_last`` (such a loader has no sampler to carry over).

    A subclass of ``DataLoader`` stays one (its ``__iter__``, its own attributes): it is copied, not
    built again, as its constructor may take other arguments (Lightning keeps the user's class too).
    """
    if type(loader) is not DataLoader:
        return _copy_with(loader, changes)
    kwargs: dict[str, Any] = {
        "dataset": loader.dataset,
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    if "batch_sampler" in changes:
        pass
    elif isinstance(loader.dataset, IterableDataset) and "sampler" not in changes:
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)  # it takes no sampler
    elif "sampler" in changes or loader.batch_sampler is None:
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last, sampler=loader.sampler)
    else:
        kwargs["batch_sampler"] = loader.batch_sampler
    kwargs.update(changes)
    return DataLoader(**kwargs)


def _copy_with(loader: DataLoader[Any], changes: dict[str, Any]) -> DataLoader[Any]:
    """A shallow copy of a ``DataLoader`` subclass with ``changes`` set (as its constructor would set them).

    The copy shares the original's own attributes (a list it appends to stays one list) and starts
    without an iterator (persistent workers belong to the loader that started them).
    """
    new = copy.copy(loader)
    fields = dict(changes)
    if "sampler" in fields and "batch_sampler" not in fields:
        batch_size = loader.batch_size
        fields["batch_sampler"] = (
            None if batch_size is None else BatchSampler(fields["sampler"], batch_size, loader.drop_last)
        )
    elif "batch_sampler" in fields:
        fields.update(batch_size=None, drop_last=False)
    fields["_iterator"] = None
    for name, value in fields.items():
        # DataLoader refuses these assignments after its constructor ran; the copy is under construction.
        object.__setattr__(new, name, value)
    return new


def shut_down_workers(loaders: Any) -> None:
    """Stop the persistent worker processes of every ``DataLoader`` in ``loaders`` (a loader, a list or dict
    of them, or a combination with ``loaders``), as Lightning does when a run ends or fails: they would
    otherwise live as long as the loader object. The next iteration starts new ones."""
    if isinstance(loaders, DataLoader):
        iterator = loaders.__dict__.get("_iterator")
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
            loaders._iterator = None
        return
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    inner = getattr(loaders, "loaders", None)
    if isinstance(inner, (list, tuple, dict)):
        loaders = inner
    if isinstance(loaders, (list, tuple)):
        for loader in loaders:
            shut_down_workers(loader)
