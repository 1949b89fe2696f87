"""``ThroughputMonitor``: training samples and batches per second, sent to the loggers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from callbacks.base import Callback
from trainer.common.tree import batch_size_of

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["ThroughputMonitor"]


class ThroughputMonitor(Callback):
    """Log ``throughput/batches_per_sec`` and ``throughput/samples_per_sec`` of training.

    Measured over wall time between logging points, data loading included and validation excluded
    (the clock restarts after each validation pass and at each epoch start). ``samples_per_sec``
    counts all processes (local samples times world size); ``batches_per_sec`` is per process. On
    CUDA the device is synchronised at each logging point so queued work is counted: one sync per
    ``every_n_steps`` steps.

    Args:
        batch_size_fn: samples in a batch (default: the length of the batch's first tensor).
        length_fn: items in a batch (tokens, say); given, ``throughput/items_per_sec`` is logged too
            (all processes, like samples).
        every_n_steps: optimizer steps between measurements (default: the trainer's
            ``log_every_n_steps``, so they line up with the loss curves).
        **kwargs: of Lightning's ``Throughput`` options only ``separator`` (between ``throughput``
            and the name, default ``"/"``); the others are refused with what to use instead.
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int] | None = None,
        length_fn: Callable[[Any], int] | None = None,
        every_n_steps: int | None = None,
        **kwargs: Any,
    ) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.separator = str(kwargs.pop("separator", "/"))
        if kwargs:
            raise TypeError(
                f"ThroughputMonitor: {', '.join(sorted(kwargs))} not supported: throughput is measured between "
                "logging points (set every_n_steps), over all processes; FLOP counts are not computed"
            )
        self.batch_size_fn = batch_size_fn if batch_size_fn is not None else batch_size_of
        self.length_fn = length_fn
        self.every_n_steps = every_n_steps
        self._items = 0
        self._start = 0.0
        self._batches = 0
        self._samples = 0
        self._last_step = -1

    def _restart(self) -> None:
        self._start = time.perf_counter()
        self._batches = self._samples = self._items = 0

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._restart()

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._restart()

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._batches += 1
        self._samples += self.batch_size_fn(batch)
        if self.length_fn is not None:
            self._items += self.length_fn(batch)
        n = self.every_n_steps or trainer.log_every_n_steps
        step = trainer.global_step
        if step == self._last_step or step == 0 or step % n:
            return
        self._last_step = step
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        sep = self.separator
        values = {
            f"throughput{sep}batches_per_sec": self._batches / elapsed,
            f"throughput{sep}samples_per_sec": self._samples * trainer.world_size / elapsed,
        }
        if self.length_fn is not None:
            values[f"throughput{sep}items_per_sec"] = self._items * trainer.world_size / elapsed
        trainer.log_metrics(values, step=step - 1)
        self._restart()
