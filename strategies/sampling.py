"""A user's sampler or batch sampler, kept and sharded over the ranks (Lightning's ``DistributedSamplerWrapper``).

Under DDP a ``DataLoader`` built with its own sampler (a ``SubsetRandomSampler`` over part of the data,
a weighted sampler, a bucketing batch sampler) keeps it: every epoch the sampler is asked for its order
once per rank, and rank ``r`` of ``W`` takes positions ``r, r + W, r + 2W, ...`` of it. So the union of
what the ranks see is what the sampler yields, and, as with a ``DistributedSampler`` over the default
sampler, the ranks' half batches of a step together are the batch one process would take (DDP equals
one process). Training pads the order by repeating its start so every rank gets the same count (or
drops the tail with ``drop_last``), as ``DistributedSampler`` does; evaluation never pads.

A random sampler must draw the same order on every rank: seed it (``seed_everything`` or its own
``generator``), as with Lightning's wrapper.

The default samplers (a loader built with ``shuffle=True`` or ``False``) get :class:`GlobalBatchSampler`
instead: the same global batches on any number of processes (see its docstring). An ``IterableDataset``
is sharded by the user's own code; :class:`EvenEnd` makes every rank stop at the same batch.
Evaluation shards the default samplers with :class:`EvalShardSampler` (no padding).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler, RandomSampler, Sampler

__all__ = [
    "EmptyShardError",
    "EvalShardSampler",
    "EvenEnd",
    "GlobalBatchSampler",
    "ShardedBatchSampler",
    "ShardedSampler",
]


def _shard(order: list[Any], rank: int, world_size: int, pad: bool, drop_last: bool) -> list[Any]:
    """Positions ``rank::world_size`` of ``order``, padded (or cut) to a length divisible by the world."""
    if drop_last:
        order = order[: len(order) // world_size * world_size]
    elif pad and order:
        total = math.ceil(len(order) / world_size) * world_size
        while len(order) < total:
            order = order + order[: total - len(order)]
    return order[rank::world_size]


def _shard_len(total: int, rank: int, world_size: int, pad: bool, drop_last: bool) -> int:
    if drop_last:
        return total // world_size
    if pad:
        return math.ceil(total / world_size) if total else 0
    return max(0, (total - rank + world_size - 1) // world_size)


class _Sharded:
    """What both wrappers share: the wrapped object, the rank's place, ``set_epoch`` and ``generator``."""

    def __init__(self, inner: Iterable[Any], rank: int, world_size: int, pad: bool, drop_last: bool) -> None:
        self.inner = inner
        self.rank, self.world_size = rank, world_size
        self.pad, self.drop_last = pad, drop_last

    def set_epoch(self, epoch: int) -> None:
        """Pass the epoch on to a wrapped sampler that wants it (e.g. one seeded by epoch)."""
        set_epoch = getattr(self.inner, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    @property
    def generator(self) -> Any:
        """The wrapped sampler's generator (exact mid-epoch resume replays its state)."""
        return getattr(self.inner, "generator", None)

    def __iter__(self) -> Iterator[Any]:
        return iter(_shard(list(self.inner), self.rank, self.world_size, self.pad, self.drop_last))

    def __len__(self) -> int:
        total = len(self.inner)  # type: ignore[arg-type]
        return _shard_len(total, self.rank, self.world_size, self.pad, self.drop_last)


class ShardedSampler(_Sharded, Sampler[int]):
    """Rank ``rank``'s share of the indices ``sampler`` yields (see the module docstring).

    >>> list(ShardedSampler([5, 1, 7], rank=1, world_size=2))
    [1, 5]
    >>> list(ShardedSampler([5, 1, 7], rank=1, world_size=2, pad=False))
    [1]
    """

    def __init__(
        self, sampler: Iterable[int], rank: int, world_size: int, pad: bool = True, drop_last: bool = False
    ) -> None:
        super().__init__(sampler, rank, world_size, pad, drop_last)

    @property
    def sampler(self) -> Iterable[int]:
        """The user's sampler."""
        return self.inner


class ShardedBatchSampler(_Sharded):
    """Rank ``rank``'s share of the batches ``batch_sampler`` yields: batches ``rank::world_size``.

    >>> list(ShardedBatchSampler([[0, 1], [2], [3, 4]], rank=0, world_size=2, pad=False))
    [[0, 1], [3, 4]]
    """

    def __init__(
        self, batch_sampler: Iterable[list[int]], rank: int, world_size: int, pad: bool = True, drop_last: bool = False
    ) -> None:
        super().__init__(batch_sampler, rank, world_size, pad, drop_last)

    @property
    def sampler(self) -> Any:
        """The wrapped batch sampler's sampler, if it has one (``set_epoch`` and resume look there)."""
        return getattr(self.inner, "sampler", None)


class GlobalBatchSampler(DistributedSampler[int]):
    """Rank ``rank``'s shards of the global batches one process with batch ``batch_size * world_size`` takes.

    The contract (docs/data.md, "Same batches on any number of processes"): a loader's ``batch_size``
    is per process, as in Lightning, so ``W`` processes train on global batches of
    ``B = batch_size * W``. Every epoch the single process's sampler gives the order (for
    ``shuffle=True`` the permutation a one-process ``RandomSampler`` draws from the same seed), which
    is cut into global batches of ``B``; rank ``r`` takes positions ``r, r + W, ...`` of each. So the
    ranks' batches of a step together are one process's batch of ``B``, and a run on ``M`` processes
    with ``batch_size = B / M`` sees the same global batches (and can resume the other's checkpoints).

    A last global batch smaller than ``B`` is split the same way, so shards may differ in size; a rank
    whose shard is empty takes the batch's first sample as a stand-in, whose loss counts zero.
    :attr:`last_batch_share` is the factor the trainer scales that batch's loss by, so DDP's mean over
    ranks weights each sample alike, as one process's mean over the batch does. ``drop_last`` drops
    that batch, as one process drops its last short batch.

    A ``torch.utils.data.DistributedSampler`` subclass, so code that asks for one (``set_epoch``,
    ``num_replicas``, ``rank``, ``shuffle``) still finds it.

    >>> [list(GlobalBatchSampler(range(7), range(7), 2, rank=r, world_size=2)) for r in range(2)]
    [[0, 2, 4, 6], [1, 3, 5]]
    >>> GlobalBatchSampler(range(5), range(5), 2, rank=1, world_size=2).last_batch_share  # 1 of 1 sample
    0.0
    """

    def __init__(
        self,
        dataset: Sized,
        sampler: Iterable[int],
        batch_size: int,
        rank: int,
        world_size: int,
        drop_last: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__(
            dataset,  # type: ignore[arg-type]
            num_replicas=world_size,
            rank=rank,
            shuffle=isinstance(sampler, RandomSampler),
            seed=seed,
            drop_last=drop_last,
        )
        #: The sampler one process would use (its order is the global order).
        self.sampler = sampler
        self.batch_size = batch_size
        self.global_batch_size = batch_size * world_size
        full, rest = divmod(len(sampler), self.global_batch_size)  # type: ignore[arg-type]
        self._full, self._rest = full, 0 if drop_last else rest
        own = len(range(rank, self._rest, world_size))
        self.num_samples = full * batch_size + (max(own, 1) if self._rest else 0)
        self.total_size = full * self.global_batch_size + self._rest
        #: The loss factor of this rank's share of a short last global batch; None when it needs none.
        self.last_batch_share: float | None = None
        if self._rest and self._rest % world_size:
            self.last_batch_share = own * world_size / self._rest

    @property
    def generator(self) -> Any:
        """The wrapped sampler's own generator, if it has one (exact mid-epoch resume replays its state)."""
        return getattr(self.sampler, "generator", None)

    def __iter__(self) -> Iterator[int]:
        order = self._order()
        rank, world, size = self.rank, self.num_replicas, self.global_batch_size
        for start in range(0, self._full * size, size):
            yield from order[start + rank : start + size : world]
        if self._rest:
            start = self._full * size
            yield from order[start + rank : start + self._rest : world] or order[start : start + 1]

    def __len__(self) -> int:
        return self.num_samples

    def _order(self) -> list[int]:
        """The epoch's global order: the single process's sampler's, the same on every rank."""
        sampler = self.sampler
        if isinstance(sampler, RandomSampler) and sampler.generator is None:
            # RandomSampler seeds itself from the global torch generator, one draw per epoch; the same
            # draw here keeps one process's order. Rank 0's draw is used by all: a rank whose generator
            # moved differently (augmentations on a shorter shard) still agrees. A small broadcast,
            # once per epoch, made by every rank when the trainer starts the epoch.
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                box = [seed]
                dist.broadcast_object_list(box, src=0)
                seed = box[0]
            seeded = copy.copy(sampler)
            seeded.generator = torch.Generator().manual_seed(seed)
            return list(seeded)
        return list(sampler)


class EvenEnd:
    """A loader over a user-sharded ``IterableDataset`` whose ranks all stop at the same batch.

    Each rank streams its own shard; shards may hold different numbers of batches. Before each batch
    the ranks agree with one small all-reduce (the minimum of "I have a batch") whether all of them
    have one, and stop together when one has run out: the longer shards' extra batches are not used
    in that epoch (without this, the ranks with data would wait in the gradient all-reduce for the
    others until the collective timeout). The cost, one all-reduce per batch, is paid only here.

    The length is the smallest of the ranks' lengths, agreed when the loader is prepared (every rank
    does that together); a loader without a length stays without one. Every other attribute is the
    wrapped loader's.
    """

    def __init__(self, loader: Iterable[Any], device: torch.device) -> None:
        self.loader = loader
        self.device = device
        try:
            own: float = len(loader)  # type: ignore[arg-type]
        except TypeError:
            own = math.inf
        self._length = int(_agree(own, "min", device)) if not math.isinf(_agree(own, "max", device)) else None

    def __len__(self) -> int:
        if self._length is None:
            raise TypeError(f"{type(self.loader).__name__} over an IterableDataset without __len__ has no length")
        return self._length

    def __iter__(self) -> Iterator[Any]:
        sentinel = object()
        iterator = iter(self.loader)
        first = True
        while True:
            batch = next(iterator, sentinel)
            if _agree(0.0 if batch is sentinel else 1.0, "min", self.device) == 0.0:
                if first:  # a rank streamed nothing: as an empty training set, not an epoch of 0 steps
                    rank = _agree(float(dist.get_rank()) if batch is sentinel else math.inf, "min", self.device)
                    raise EmptyShardError(int(rank))
                return
            first = False
            yield batch

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


class EmptyShardError(RuntimeError):
    """The share of a user-sharded ``IterableDataset`` of rank ``rank`` (the first such) gave no batch."""

    def __init__(self, rank: int) -> None:
        super().__init__(f"rank {rank}'s share of its IterableDataset is empty")
        self.rank = rank


def _agree(value: float, op: str, device: torch.device) -> float:
    """``value`` reduced over the ranks (``"min"`` or ``"max"``)."""
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN if op == "min" else dist.ReduceOp.MAX)
    return float(tensor.item())


class EvalShardSampler(Sampler[int]):
    """Rank ``r`` of ``W`` gets positions ``r, r + W, r + 2W, ...`` of ``sampler``'s order.

    Unlike ``DistributedSampler`` it adds no padded duplicates, so shards may differ in size by one
    and every sample is evaluated exactly once: epoch means weighted by batch size and torchmetrics
    states summed over ranks equal what one process computes on the whole dataset.

    >>> list(EvalShardSampler(range(5), rank=1, world_size=2))
    [1, 3]
    """

    def __init__(self, sampler: Iterable[int], rank: int, world_size: int) -> None:
        self.sampler = sampler
        self.rank = rank
        self.world_size = world_size

    def __iter__(self) -> Iterator[int]:
        for position, index in enumerate(self.sampler):
            if position % self.world_size == self.rank:
                yield index

    def __len__(self) -> int:
        total = len(self.sampler)  # type: ignore[arg-type]
        return max(0, (total - self.rank + self.world_size - 1) // self.world_size)
