"""Training dataloaders that can resume mid-epoch exactly, without loading the batches already seen.

The trainer wraps a map-style ``DataLoader``'s batch sampler in :class:`ResumableBatchSampler`. In
an ordinary epoch the wrapper only records the random state the sampler draws its order from (once
per epoch). On resume it replays that state so the sampler produces the same order, skips the index
batches already trained on (indices only: no sample is loaded), and puts the random state back, so
dropout and augmentations continue as the uninterrupted run had them.

With worker processes (``num_workers > 0``) a sample's augmentation would depend on which worker
loaded it and what that worker loaded before, which a resume cannot reproduce. So the trainer seeds
each sample's random draws from (seed, epoch, index) there (:class:`SampleSeededDataset`): augmentations
stay random across samples and epochs, and become independent of worker count and exactly resumable.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from trainer.common.env import SEED_WORKERS, seed_from_env
from trainer.common.loaders import rebuild_dataloader
from trainer.common.rng import WorkerInit, rng_state, set_rng_state

__all__ = [
    "SHOWN_AS",
    "ResumableBatchSampler",
    "SampleSeededDataset",
    "add_worker_seeding",
    "make_resumable",
    "rebuild_dataloader",
    "shown_loader",
]


class SampleSeededDataset(Dataset[Any]):
    """Seeds Python's, NumPy's and torch's generators from (seed, epoch, index) before each sample.

    Used only inside DataLoader worker processes; ``set_epoch`` is called by the trainer before each
    epoch's workers start (they receive a fresh copy of this object).
    """

    def __init__(self, dataset: Dataset[Any], seed: int) -> None:
        self.dataset = dataset
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose samples are about to be loaded."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        import numpy as np

        seed = hash((self.seed, self.epoch, int(index))) & 0x7FFF_FFFF_FFFF_FFFF
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed & 0xFFFF_FFFF)
        return self.dataset[index]


class ResumableBatchSampler:
    """Wraps a batch sampler; can start an epoch at batch ``n`` with the order of the original epoch.

    Attributes:
        epoch_rng: the random state the wrapped sampler drew this epoch's order from (checkpointed).
    """

    def __init__(self, batch_sampler: Iterable[list[int]]) -> None:
        self.batch_sampler = batch_sampler
        self.epoch_rng: dict[str, Any] | None = None
        self._skip = 0
        self._replay: dict[str, Any] | None = None

    @property
    def sampler(self) -> Any:
        """The wrapped sampler (so ``set_epoch`` reaches a DistributedSampler)."""
        return getattr(self.batch_sampler, "sampler", None)

    def __len__(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]

    def resume(self, skip: int, epoch_rng: dict[str, Any] | None) -> None:
        """Make the next ``__iter__`` replay ``epoch_rng`` and start after ``skip`` batches."""
        self._skip, self._replay = skip, epoch_rng

    def __iter__(self) -> Iterator[list[int]]:
        skip, replay = self._skip, self._replay
        self._skip, self._replay = 0, None
        if replay is None:
            self.epoch_rng = _sampler_state(self.batch_sampler)
            yield from self.batch_sampler
            return
        current = _sampler_state(self.batch_sampler)
        _set_sampler_state(self.batch_sampler, replay)
        self.epoch_rng = replay
        iterator = iter(self.batch_sampler)
        pending: list[list[int]] = []
        try:
            # The sampler draws its order when first advanced, so advance it under the replayed state.
            for _ in range(skip):
                next(iterator)
            if skip == 0:
                pending.append(next(iterator))
        except StopIteration:
            return
        finally:
            _set_sampler_state(self.batch_sampler, current)
        yield from pending
        yield from iterator


def _generator_of(batch_sampler: Any) -> Any:
    return getattr(getattr(batch_sampler, "sampler", None), "generator", None)


def _sampler_state(batch_sampler: Any) -> dict[str, Any]:
    state = {"rng": rng_state()}
    generator = _generator_of(batch_sampler)
    if generator is not None:
        state["generator"] = generator.get_state()
    return state


def _set_sampler_state(batch_sampler: Any, state: dict[str, Any]) -> None:
    set_rng_state(state["rng"])
    generator = _generator_of(batch_sampler)
    if generator is not None and "generator" in state:
        generator.set_state(state["generator"])


def make_resumable(loader: Iterable[Any] | None) -> Iterable[Any] | None:
    """Wrap a map-style ``DataLoader``'s batch sampler in :class:`ResumableBatchSampler`.

    With worker processes (and workers that are not persistent) the dataset is wrapped in
    :class:`SampleSeededDataset`. Other iterables (iterable datasets, custom loaders) are returned
    unchanged; resuming them mid-epoch skips batches by fetching them.
    """
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    if loader.batch_sampler is None or isinstance(loader.batch_sampler, ResumableBatchSampler):
        return loader
    changes: dict[str, Any] = {"batch_sampler": ResumableBatchSampler(loader.batch_sampler)}
    if loader.num_workers > 0 and not loader.persistent_workers:
        changes["dataset"] = SampleSeededDataset(loader.dataset, seed_from_env())
    resumable = rebuild_dataloader(loader, **changes)
    resumable.__dict__[SHOWN_AS] = loader
    return resumable


#: The attribute of a :func:`make_resumable` loader holding the loader it was made from: what
#: ``trainer.train_dataloader`` shows (its ``batch_size``, ``sampler``, ``dataset`` are the user's, as in
#: Lightning), while the loop iterates the resumable one.
SHOWN_AS = "_geartrain_shown_as"


def shown_loader(loader: Any) -> Any:
    """The loader users see for ``loader``: the one :func:`make_resumable` was given, else ``loader`` itself."""
    return getattr(loader, SHOWN_AS, loader)


def add_worker_seeding(loader: Iterable[Any] | None, rank: int) -> Iterable[Any] | None:
    """Seed a DataLoader's worker processes from (base seed, worker id, ``rank``) if asked to.

    Asked to means ``seed_everything(workers=True)`` (the ``GEARTRAIN_SEED_WORKERS`` variable is
    "1"); then a ``DataLoader`` with worker processes is rebuilt with a :class:`WorkerInit` as its
    ``worker_init_fn``, chaining the one it had, which is called after the seeding. Anything
    else (no workers, not a ``DataLoader``, seeding not asked for, already seeded) is returned as
    it is. In training with non-persistent workers :func:`make_resumable` then seeds every sample
    on top, from (seed, epoch, index), which keeps exact resume.
    """
    if os.environ.get(SEED_WORKERS) != "1" or not isinstance(loader, DataLoader) or loader.num_workers == 0:
        return loader
    if isinstance(loader.worker_init_fn, WorkerInit):
        return loader
    return rebuild_dataloader(loader, worker_init_fn=WorkerInit(rank, loader.worker_init_fn))
