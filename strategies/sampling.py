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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils.data import Sampler

__all__ = ["ShardedBatchSampler", "ShardedSampler"]


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
