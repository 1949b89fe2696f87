"""Lightning's ``def training_step(self, dataloader_iter)``: the step pulls its batches itself.

A step (``training_step``, ``validation_step``, ``test_step``, ``predict_step``) whose signature names
``dataloader_iter`` gets one :class:`DataloaderIter` instead of a batch and a batch index; each
``next(dataloader_iter)`` returns ``(batch, batch_idx, dataloader_idx)``, as in Lightning. The loop
calls the step again until the iterator is exhausted (or the step lets ``StopIteration`` out), so
one step may consume several batches, or look one ahead. As in Lightning:

- the batches are not moved to the device (no batch transfer hooks): the step moves what it needs;
- the batch hooks get the batch, index and loader index of the last batch fetched: before the step,
  the previous one's (``None, 0, 0`` before the first); after it, the last one the step fetched;
- ``self.log`` in ``training_step`` needs ``batch_size=`` (the batch is the step's business);
- validation and test over several loaders go through one iterator, loader after loader.

What geartrain adds: a mid-epoch checkpoint of such a run cannot be resumed exactly (how many
batches a step fetched ahead is the step's own state), so resuming one is refused; accumulation
(``accumulate_grad_batches``) and ``micro_batch_size`` are refused with it (the window's end would
depend on batches the step has not fetched yet).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from trainer.metrics.routing import UnknownBatchSize

if TYPE_CHECKING:
    from trainer.run_state import RunState
    from trainer.trainer import Trainer

__all__ = [
    "DataloaderIter",
    "check_training_options",
    "iter_steps",
    "make_fetching_eval_batch",
    "make_iter_train_batch",
    "takes_dataloader_iter",
]


def takes_dataloader_iter(fn: Callable[..., Any] | None) -> bool:
    """Whether a step method names ``dataloader_iter`` in its signature (Lightning's rule: explicitly)."""
    if fn is None:
        return False
    try:
        return "dataloader_iter" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class DataloaderIter(Iterator[tuple[Any, int, int]]):
    """What a ``step(self, dataloader_iter)`` gets: ``next()`` returns ``(batch, batch_idx, dataloader_idx)``.

    ``sources`` are ``(dataloader_idx, num, open)`` triples, read one after another: ``num`` is the
    loader's batch count (its limit applied; a loader of none is skipped) and ``open()`` its batches
    as :func:`~trainer.loops.iteration.iterate` yields them, ``(batch_idx, batch, is_last)``, called
    when the loader's turn comes (so a later loader's workers start only then). ``batch``, ``batch_idx`` and ``dataloader_idx`` are those of the
    last batch fetched; ``fetched`` counts them; ``done`` is True once the last one was fetched.
    ``on_fetch(batch, dataloader_idx)`` is called with each batch fetched (the loop's logging follows it).
    """

    def __init__(
        self,
        sources: list[tuple[int, float, Callable[[], Iterator[tuple[int, Any, bool]]]]],
        on_fetch: Callable[[Any, int], None] | None = None,
    ) -> None:
        self._sources = iter([source for source in sources if source[1] > 0])
        self._on_fetch = on_fetch
        self._current: Iterator[tuple[int, Any, bool]] | None = None
        self.batch: Any = None
        self.batch_idx = 0
        self.dataloader_idx = 0
        self.fetched = 0
        self.done = False
        self._advance_source()

    def _advance_source(self) -> None:
        """Move on to the next loader; ``done`` when there is none."""
        nxt = next(self._sources, None)
        if nxt is None:
            self._current, self.done = None, True
        else:
            self._next_loader_idx, _, open_batches = nxt
            self._current = open_batches()

    def __next__(self) -> tuple[Any, int, int]:
        while not self.done:
            assert self._current is not None
            item = next(self._current, None)
            if item is None:  # this loader is empty (or cut to nothing): the next one
                self._advance_source()
                continue
            batch_idx, batch, is_last = item
            self.batch, self.batch_idx, self.dataloader_idx = batch, batch_idx, self._next_loader_idx
            self.fetched += 1
            if self._on_fetch is not None:
                self._on_fetch(batch, self.dataloader_idx)
            if is_last:
                self._advance_source()
            return batch, batch_idx, self.dataloader_idx
        raise StopIteration

    def __repr__(self) -> str:
        return f"DataloaderIter(fetched={self.fetched}, done={self.done})"


def check_training_options(trainer: Trainer, state: RunState) -> None:
    """Refuse what a ``training_step(self, dataloader_iter)`` run cannot do exactly (see the module docstring)."""
    module = state.module
    assert module is not None
    if state.progress.batch_in_epoch:
        raise ValueError(
            f"{type(module).__name__}.training_step(self, dataloader_iter) fetches its own batches, so a checkpoint "
            f"saved inside an epoch (this one stopped after step {state.progress.batch_in_epoch} of epoch "
            f"{state.progress.epoch}) cannot be resumed exactly: resume from one saved at an epoch's end "
            "(ModelCheckpoint(save_on_train_epoch_end=True)), or define training_step(self, batch, batch_idx)"
        )
    if module.automatic_optimization and (trainer.accumulate_grad_batches != 1 or trainer.micro_batcher is not None):
        raise ValueError(
            f"{type(module).__name__}.training_step(self, dataloader_iter) fetches its own batches: "
            f"accumulate_grad_batches={trainer.accumulate_grad_batches} and micro_batch_size are not supported "
            "with it (where a window ends depends on batches not fetched yet); accumulate inside the step "
            "(fetch several batches, or use manual optimisation), or define training_step(self, batch, batch_idx)"
        )


def make_iter_train_batch(
    state: RunState, step: Callable[[Any, int, bool], Any], batch_start: Any, batch_end: Any, router: Any
) -> Callable[[DataloaderIter, int, bool], Any]:
    """``train_batch(dataloader_iter, step_idx, is_last)`` around ``step`` (Lightning's order, module docstring).

    ``step_idx`` counts the step's calls this epoch (what accumulation, validation and the checkpoint's
    position count). Returns -1 to end the epoch: a batch-start hook's -1, or ``StopIteration`` from the step.
    """
    progress = state.progress
    unknown = UnknownBatchSize(
        "With `def training_step(self, dataloader_iter)`, `self.log(..., batch_size=...)` should be provided."
    )

    def train_batch(it: DataloaderIter, step_idx: int, is_last: bool) -> Any:
        router.current_batch = unknown
        if batch_start is not None and batch_start(it.batch, it.batch_idx) == -1:
            return -1
        try:
            out = step(it, step_idx, True)
        except StopIteration:  # the step found the data exhausted: the epoch ends, as in Lightning
            it.done = True
            return -1
        progress.batch_in_epoch = step_idx + 1
        state.is_last_batch = it.done
        if batch_end is not None:
            batch_end(out, it.batch, it.batch_idx)
        return out

    return train_batch


def make_fetching_eval_batch(
    step: Callable[[Any, int], Any],
    forward_context: Callable[[], Any] | None,
    start: Callable[..., Any] | None,
    end: Callable[..., Any] | None,
    several: bool,
) -> Callable[[DataloaderIter, int], Any]:
    """``eval_batch(dataloader_iter, _)`` for a validation/test/predict step that fetches its own batches.

    The batch hooks get the last fetched batch, its index and (with several loaders) its loader's index,
    before and after the step, as in Lightning; the step gets the iterator alone.
    """

    def hook_args(it: DataloaderIter) -> tuple[Any, ...]:
        return (it.batch, it.batch_idx, it.dataloader_idx) if several else (it.batch, it.batch_idx)

    def eval_batch(it: DataloaderIter, _: int = 0) -> Any:
        if start is not None:
            start(*hook_args(it))
        if forward_context is None:
            out = step(it, 0)
        else:
            with forward_context():
                out = step(it, 0)
        if end is not None:
            end(out, *hook_args(it))
        return out

    return eval_batch


def iter_steps(it: DataloaderIter) -> Iterator[tuple[int, DataloaderIter, bool]]:
    """The training loop's ``(step_idx, dataloader_iter, is_last)`` while the iterator has batches left."""
    step_idx = 0
    while not it.done:
        yield step_idx, it, False
        step_idx += 1
