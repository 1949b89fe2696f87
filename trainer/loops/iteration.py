"""Going through a dataloader: how many batches a stage uses, indices, the last-batch flag, resuming.

With a known length the batches come from a ``zip`` of C iterators, so a batch costs no Python frame;
a loader without a length is read one batch ahead to know which batch is the last.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from typing import Any

from trainer.common.errors import UserError
from trainer.common.rng import rng_state, set_rng_state
from trainer.data.loaders import set_sampler_epoch
from trainer.data.resumable import ResumableBatchSampler

__all__ = ["iterate", "last_batch_share", "num_batches", "set_sampler_epoch"]  # the last: the data room's


def num_batches(loader: Iterable[Any], limit: int | float | None, stage: str = "fit") -> float:
    """Batches a stage will use: the loader's length cut by its ``limit_*_batches`` (inf if unsized).

    A loader whose ``__len__`` raises ``TypeError`` or ``NotImplementedError`` has no length, as in
    Lightning. A fraction other than 1.0 of such a loader is refused with Lightning's message.
    """
    try:
        total: float = len(loader)  # type: ignore[arg-type]
    except (TypeError, NotImplementedError):
        total = math.inf
    if limit is None:
        return total
    if isinstance(limit, float):
        if math.isinf(total):
            if limit == 1.0:
                return total
            prefix = _PREFIX.get(stage, stage)
            raise UserError(
                f"When using an `IterableDataset`, `Trainer(limit_{prefix}_batches)` must be `1.0` or an int. An int "
                f"specifies `num_{prefix}_batches` to use (limit_{prefix}_batches={limit}: a fraction needs a "
                "dataloader with a length)."
            )
        return int(total * limit)
    return min(total, limit)


_PREFIX = {"fit": "train", "validate": "val"}


def iterate(
    loader: Iterable[Any], num: float, start: int = 0, epoch_rng: dict[str, Any] | None = None, drop: bool = True
) -> Iterator[tuple[int, Any, bool]]:
    """Yield ``(index, batch, is_last)`` for the first ``num`` batches, from index ``start``.

    ``is_last`` comes from the length when known, else from looking one batch ahead. Starting at
    ``start > 0`` (a mid-epoch resume) skips index batches in the sampler, with the epoch's order
    replayed from ``epoch_rng``, where the loader allows it; otherwise it fetches and drops them.
    ``drop=False``: the loader continues from its own restored state (:mod:`trainer.data.stateful`),
    so nothing is skipped and the indices still start at ``start``.
    """
    if num <= start:
        return iter(())
    sampler = getattr(loader, "batch_sampler", None)
    if start and drop and isinstance(sampler, ResumableBatchSampler):
        sampler.resume(start, epoch_rng)
        rng_now = rng_state()
        iterator = iter(loader)
        set_rng_state(rng_now)  # creating the iterator drew a worker seed; the run had drawn it earlier
    else:
        iterator = iter(loader)
        for _ in itertools.islice(iterator, start if drop else 0):
            pass
    if not math.isinf(num):
        count = int(num) - start
        flags = itertools.chain(itertools.repeat(False, count - 1), (True,))
        return zip(range(start, int(num)), iterator, flags)
    return _look_ahead(iterator, start)


def _look_ahead(iterator: Iterator[Any], start: int) -> Iterator[tuple[int, Any, bool]]:
    """``(index, batch, is_last)`` of a loader without a length: one batch fetched ahead."""
    sentinel = object()
    current = next(iterator, sentinel)
    idx = start
    while current is not sentinel:
        following = next(iterator, sentinel)
        yield idx, current, following is sentinel
        current, idx = following, idx + 1


def last_batch_share(loader: Iterable[Any], num: float) -> float | None:
    """The loss factor of this rank's last batch when the epoch ends on a short, unevenly split global batch.

    Under DDP a last global batch smaller than ``batch_size * world_size`` is split into unequal shards
    (:class:`~strategies.sampling.GlobalBatchSampler`); scaling each rank's mean loss by its share makes
    DDP's mean over ranks the mean over the batch's samples, as one process computes it. None when no
    scaling is needed, or when the epoch is cut short (``limit_train_batches``) before that batch.
    """
    sampler = getattr(getattr(loader, "batch_sampler", None), "sampler", None)
    share = getattr(sampler, "last_batch_share", None)
    if share is None or math.isinf(num) or int(num) != len(loader):  # type: ignore[arg-type]
        return None
    return float(share)
