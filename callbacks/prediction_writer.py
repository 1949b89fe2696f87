"""Lightning's ``BasePredictionWriter``: write predictions as they come (per batch, per epoch, or both).

Subclass it and implement ``write_on_batch_end`` and/or ``write_on_epoch_end``. Each call gets the
dataset indices of the predictions (``batch_indices``), recorded from the loader's own sampler as it
runs, so under DDP, where each rank predicts its shard, every rank can write its shard with the
indices it covered, and :func:`join_predictions` puts the shards back into dataset order. The
recording wraps the loader's batch sampler for the predict run only; nothing is recorded when no
writer is used.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from callbacks.base import Callback
from trainer.common.errors import UserError

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

__all__ = ["BasePredictionWriter", "join_predictions"]

_INTERVALS = ("batch", "epoch", "batch_and_epoch")


class _RecordingBatchSampler:
    """Yields what the wrapped batch sampler yields and keeps each batch's indices, in order."""

    def __init__(self, inner: Iterable[list[int]]) -> None:
        self.inner = inner
        self.seen: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        self.seen = []
        for indices in self.inner:
            self.seen.append(list(indices))
            yield indices

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:  # batch_size, drop_last, sampler: as the wrapped one's
        return getattr(self.inner, name)


class BasePredictionWriter(Callback):
    """Write predictions during ``trainer.predict`` (Lightning's signature and hooks).

    Args:
        write_interval: ``"batch"`` calls :meth:`write_on_batch_end` after each batch, ``"epoch"``
            calls :meth:`write_on_epoch_end` once with everything, ``"batch_and_epoch"`` both.

    Example:
        >>> class Writer(BasePredictionWriter):
        ...     def __init__(self, folder):
        ...         super().__init__(write_interval="epoch")
        ...         self.folder = folder
        ...     def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        ...         path = os.path.join(self.folder, f"predictions_{trainer.global_rank}.pt")
        ...         torch.save({"predictions": predictions, "batch_indices": batch_indices[0]}, path)
        >>> Writer("out").interval
        'epoch'
    """

    def __init__(self, write_interval: str = "batch") -> None:
        if write_interval not in _INTERVALS:
            raise UserError(
                f"BasePredictionWriter(write_interval={write_interval!r}): `write_interval` should be one of "
                f"{list(_INTERVALS)}"
            )
        self.interval = write_interval
        self._recorders: list[_RecordingBatchSampler | None] = []
        self._predictions: list[list[Any]] = []
        self._batch_indices: list[list[list[int]]] = []

    def write_on_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        prediction: Any,
        batch_indices: list[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        """Write one batch's ``prediction``; ``batch_indices`` are its samples' dataset indices."""
        raise NotImplementedError(
            f"{type(self).__name__}(write_interval={self.interval!r}) must implement write_on_batch_end"
        )

    def write_on_epoch_end(
        self, trainer: Trainer, pl_module: TrainModule, predictions: list[Any], batch_indices: list[list[list[int]]]
    ) -> None:
        """Write all predictions (a list per loader when several); ``batch_indices[loader][batch]`` are dataset indices."""
        raise NotImplementedError(
            f"{type(self).__name__}(write_interval={self.interval!r}) must implement write_on_epoch_end"
        )

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Start recording the indices each predict loader's batch sampler hands out."""
        loaders = trainer.loaders.get("predict") or []
        self._recorders = [_record(loader) for loader in loaders]
        self._predictions = [[] for _ in self._recorders]
        self._batch_indices = [[] for _ in self._recorders]

    def on_predict_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Hand the batch to :meth:`write_on_batch_end` (``"batch"`` intervals); keep it for the epoch's end."""
        recorder = self._recorders[dataloader_idx] if dataloader_idx < len(self._recorders) else None
        indices = recorder.seen[batch_idx] if recorder is not None and batch_idx < len(recorder.seen) else None
        if self.interval != "batch":
            self._predictions[dataloader_idx].append(outputs)
            self._batch_indices[dataloader_idx].append(indices if indices is not None else [])
        if self.interval != "epoch":
            self.write_on_batch_end(trainer, pl_module, outputs, indices, batch, batch_idx, dataloader_idx)

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Hand everything to :meth:`write_on_epoch_end` (``"epoch"`` intervals)."""
        if self.interval != "batch":
            predictions: list[Any] = self._predictions[0] if len(self._predictions) == 1 else self._predictions
            self.write_on_epoch_end(trainer, pl_module, predictions, self._batch_indices)
        self._predictions, self._batch_indices = [], []

    def on_predict_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Put the loaders' own batch samplers back."""
        for loader, recorder in zip(trainer.loaders.get("predict") or [], self._recorders):
            if recorder is not None:
                object.__setattr__(loader, "batch_sampler", recorder.inner)
        self._recorders = []


def _record(loader: Any) -> _RecordingBatchSampler | None:
    if (
        not isinstance(loader, DataLoader)
        or loader.batch_sampler is None
        or isinstance(loader.dataset, IterableDataset)
    ):
        # An iterable-style dataset: its sampler hands out no indices (only None), so none are given, as Lightning.
        return None
    recorder = _RecordingBatchSampler(loader.batch_sampler)
    # DataLoader refuses a new batch_sampler after construction; the iterator reads the attribute
    # when each pass starts, and on_predict_end puts the original back.
    object.__setattr__(loader, "batch_sampler", recorder)
    return recorder


def join_predictions(paths: Iterable[str | os.PathLike[str]]) -> torch.Tensor:
    """Join the shards of a distributed predict run into one tensor, in dataset order.

    Each file holds ``{"predictions": [tensor per batch], "batch_indices": [[index, ...] per batch]}``
    (as a writer saves it with ``torch.save``; read back with ``weights_only=True``). A sample that
    several shards hold is kept once. Raises ValueError naming a file whose counts disagree.
    """
    rows: dict[int, torch.Tensor] = {}
    for path in paths:
        shard = torch.load(path, weights_only=True)
        for prediction, indices in zip(shard["predictions"], shard["batch_indices"], strict=True):
            if len(prediction) != len(indices):
                raise ValueError(f"{path}: a batch of {len(prediction)} predictions has {len(indices)} indices")
            for row, index in zip(prediction, indices):
                rows.setdefault(int(index), row)
    if not rows:
        raise ValueError("join_predictions: the shards hold no predictions")
    return torch.stack([rows[i] for i in sorted(rows)])
