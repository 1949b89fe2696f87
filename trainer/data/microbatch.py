"""Micro-batching: run one training batch as several smaller forward/backward passes.

``Trainer(micro_batch_size=n)`` splits every training batch along dim 0 into pieces of at most ``n``
samples and accumulates their gradients, each piece's loss weighted by its share of the samples, so
the optimizer sees the gradient of the whole batch's mean loss. With ``"auto"`` the whole batch is
tried first and an out-of-memory error halves the piece size and retries the same batch.

Exactness: the weighted sum ``sum_i (n_i / N) * mean_loss_i`` is mathematically the full-batch mean
loss, but the float additions happen in a different order, so gradients agree to rounding (allclose,
not bitwise). Tests use ``rtol=1e-5, atol=1e-6`` for float32.

Under several processes, "auto" backs off per rank without telling the others; an out-of-memory
error inside the backward that syncs gradients would leave them waiting, so give an int there.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainer.common.tree import apply_to_tensors, batch_size_of

if TYPE_CHECKING:
    from trainer.run_state import Window
    from trainer.trainer import Trainer

__all__ = ["MicroBatcher", "micro_batches", "split_batch"]


def split_batch(batch: Any, size: int) -> Iterator[tuple[Any, int]]:
    """Yield ``(piece, samples)`` for consecutive pieces of ``batch`` of at most ``size`` samples.

    Every tensor whose first dimension is the batch's size is sliced (views, no copies); other
    values (scalars, strings, tensors of another length) are passed whole to every piece.

    >>> [p.tolist() for p, _ in split_batch(torch.arange(5), 2)]
    [[0, 1], [2, 3], [4]]
    """
    total = batch_size_of(batch)
    for start in range(0, total, size):
        stop = min(start + size, total)

        def cut(t: torch.Tensor, start: int = start, stop: int = stop) -> torch.Tensor:
            return t[start:stop] if t.ndim > 0 and t.shape[0] == total else t

        yield apply_to_tensors(batch, cut), stop - start


class MicroBatcher:
    """Runs a batch's forward/backward passes micro-batch by micro-batch (see the module docstring).

    Args:
        size: ``"auto"`` (start with the whole batch, halve on out-of-memory) or a positive int.
    """

    def __init__(self, size: int | str) -> None:
        if size != "auto" and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise ValueError(f"micro_batch_size must be 'auto', a positive int or None, got {size!r}")
        self.auto = size == "auto"
        #: Current samples per micro-batch; ``None`` until "auto" has seen its first batch.
        self.size: int | None = None if self.auto else int(size)
        #: Set when "auto" reduced the size; the trainer prints and logs it, then clears it.
        self.news: str | None = None

    def run(
        self,
        batch: Any,
        params: Callable[[], Iterator[nn.Parameter]],
        step: Callable[[Any, float, bool], Any],
        keep_grads: bool,
    ) -> list[tuple[Any, float]]:
        """Call ``step(piece, weight, is_last_piece)`` for every micro-batch of ``batch``.

        ``step`` runs forward and backward with the loss multiplied by ``weight`` (the piece's share
        of the samples). Under "auto", an out-of-memory error discards this batch's gradients (those
        of earlier batches in the accumulation window survive when ``keep_grads``: they are copied to
        the CPU before the batch, a cost paid only then), halves the size and starts the batch over.

        Returns the outputs of ``step`` with their weights, in order.
        """
        total = batch_size_of(batch)
        if self.size is None:
            self.size = total
        if not self.auto:
            return self._run_once(batch, total, step)
        saved = _copy_grads(params()) if keep_grads else None
        while True:
            size = self.size
            try:
                return self._run_once(batch, total, step)
            except torch.OutOfMemoryError:
                if size <= 1:
                    raise
            # Outside the except block, so the failed attempt's frames (and activations) are freed.
            self.size = max(1, min(size, total) // 2)
            self.news = (
                f"micro_batch_size='auto': out of memory with {size} samples per micro-batch; settled on {self.size}"
            )
            _restore_grads(params(), saved)
            _release_memory()

    def _run_once(self, batch: Any, total: int, step: Callable[[Any, float, bool], Any]) -> list[tuple[Any, float]]:
        assert self.size is not None
        if self.size >= total:
            return [(step(batch, 1.0, True), 1.0)]
        outs: list[tuple[Any, float]] = []
        seen = 0
        for piece, n in split_batch(batch, self.size):
            seen += n
            weight = n / total
            outs.append((step(piece, weight, seen == total), weight))
        return outs


def _copy_grads(params: Iterator[nn.Parameter]) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.detach().to("cpu", copy=True) for p in params]


def _restore_grads(params: Iterator[nn.Parameter], saved: list[torch.Tensor | None] | None) -> None:
    """Put back the gradients copied before the batch (``None``: the batch started the window)."""
    for i, p in enumerate(params):
        old = saved[i] if saved is not None else None
        if old is None:
            p.grad = None
        elif p.grad is None:
            p.grad = old.to(p.device)
        else:
            p.grad.copy_(old)


def _release_memory() -> None:
    """Free what the failed attempt held: its frames are gone, the allocator's cache is not."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def micro_batches(
    trainer: Trainer,
    window: Window,
    accumulate: Callable[[Any, int, bool, float], Any],
    batch: Any,
    batch_idx: int,
    sync: bool,
) -> Any:
    """The forward/backward part of the training step, one micro-batch at a time.

    ``accumulate(piece, batch_idx, sync, share)`` is the step's forward and backward of one piece
    (``loss * share / accumulate_grad_batches``); gradient sync (DDP) happens on the last piece of the
    window's last batch only. Returns the output of the last piece with its ``"loss"`` replaced by the
    samples-weighted mean loss.
    """
    from trainer.loops.step import loss_of

    micro, router = trainer.micro_batcher, trainer.metric_router
    assert micro is not None and trainer.module is not None

    def step(piece: Any, share: float, last: bool) -> Any:
        router.current_batch = piece  # self.log weights epoch means by the piece's size
        return accumulate(piece, batch_idx, sync and last, share)

    keep = trainer.accumulate_grad_batches > 1 and window.has_loss
    outs = micro.run(batch, trainer.module.parameters, step, keep_grads=keep)
    router.current_batch = batch
    if micro.news is not None:
        if trainer.is_global_zero:
            print(micro.news)
        router.emit({"micro_batch_size": torch.tensor(float(micro.size or 0))}, trainer.global_step)
        micro.news = None
    if len(outs) == 1:
        return outs[0][0]
    losses = [loss_of(out) for out, _ in outs]
    if any(loss is None for loss in losses):
        return outs[-1][0]
    mean = torch.stack([loss.detach() * w for loss, (_, w) in zip(losses, outs)]).sum()  # type: ignore[union-attr]
    last = outs[-1][0]
    return {**last, "loss": mean} if isinstance(last, Mapping) else mean
