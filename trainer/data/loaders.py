"""Which dataloaders a stage uses, prepared for the strategy, and how several of them are combined.

Lightning lets every stage take one dataloader or several (a list or a dict). Evaluation runs the
loaders one after another, each with its ``dataloader_idx`` (:func:`resolve_loaders`). Training zips
them in Lightning's default ``"max_size_cycle"`` mode (:class:`MaxSizeCycle`): each batch is a list
(or dict) with one batch from every loader, the shorter loaders start over until the longest ends.
A single loader is used as it is, so the one-loader path costs nothing extra. A list counts as several
loaders when its items are loaders; a list of batches (tensors, tuples, dicts) is one loader.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from trainer.common.errors import UserError
from trainer.data.resumable import add_worker_seeding, make_resumable

if TYPE_CHECKING:
    from trainer.module import DataModule
    from trainer.trainer import Trainer

__all__ = [
    "MaxSizeCycle",
    "check_takes_dataloader_idx",
    "is_datamodule",
    "resolve_loaders",
    "results_per_loader",
    "split_datamodule",
    "with_last_arg",
]

LOADER_METHODS = {
    "fit": "train_dataloader",
    "validate": "val_dataloader",
    "test": "test_dataloader",
    "predict": "predict_dataloader",
}


class MaxSizeCycle:
    """Several training loaders as one: batches of all of them together, the shorter ones cycled.

    Lightning's ``CombinedLoader(mode="max_size_cycle")``: an epoch lasts as long as the longest
    loader; a shorter loader that runs out starts over (a new iterator, so a shuffling sampler
    draws a new order). A list of loaders gives list batches, a dict gives dict batches.

    >>> [b for b in MaxSizeCycle([[1, 2, 3], [10]])]
    [[1, 10], [2, 10], [3, 10]]
    >>> next(iter(MaxSizeCycle({"a": [1], "b": [2]})))
    {'a': 1, 'b': 2}
    """

    def __init__(self, loaders: list[Iterable[Any]] | Mapping[str, Iterable[Any]]) -> None:
        self.keys: list[str] | None = list(loaders) if isinstance(loaders, Mapping) else None
        #: The loaders, in order (a dict's values in its order).
        self.loaders: list[Iterable[Any]] = list(loaders.values()) if isinstance(loaders, Mapping) else list(loaders)
        if not self.loaders:
            raise ValueError("train_dataloaders: an empty list or dict of dataloaders")

    def __len__(self) -> int:
        return max(len(loader) for loader in self.loaders)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        iterators = [iter(loader) for loader in self.loaders]
        exhausted = [False] * len(iterators)
        while True:
            batch = []
            for i, loader in enumerate(self.loaders):
                try:
                    batch.append(next(iterators[i]))
                except StopIteration:
                    exhausted[i] = True
                    if all(exhausted):
                        return
                    iterators[i] = iter(loader)
                    batch.append(next(iterators[i]))
            yield dict(zip(self.keys, batch)) if self.keys is not None else batch

    def set_epoch(self, epoch: int) -> None:
        """Tell every loader's epoch-aware sampler and dataset which epoch it is."""
        from trainer.loops.iteration import set_sampler_epoch

        for loader in self.loaders:
            set_sampler_epoch(loader, epoch)


def is_datamodule(obj: Any) -> bool:
    """Whether ``obj`` is a data module (it has ``setup`` and a dataloader method), not a loader."""
    from trainer.module import DataModule

    return isinstance(obj, DataModule)


def split_datamodule(loaders: Any, datamodule: DataModule | None, method: str) -> tuple[Any, DataModule | None]:
    """Lightning accepts a data module in the dataloaders' place (``trainer.fit(model, dm)``).

    Given both dataloaders and a data module, the dataloaders are used (Lightning refuses the pair).
    """
    if is_datamodule(loaders):
        if datamodule is not None:
            raise ValueError(f"trainer.{method}: a datamodule was passed twice (positionally and as datamodule=)")
        return None, loaders
    return loaders, datamodule


def resolve_loaders(
    trainer: Trainer, stage: str, explicit: Any, required: bool = True
) -> list[Iterable[Any]] | Iterable[Any] | None:
    """The prepared dataloaders of ``stage``: given explicitly, else the datamodule's, else the module's.

    Evaluation stages get a list (one entry per loader, in order); ``"fit"`` gets one iterable (a
    :class:`MaxSizeCycle` over several). Every loader is sharded by the strategy (unless
    ``use_distributed_sampler=False``) and seeded for workers. None: no data and not ``required``.
    """
    method = LOADER_METHODS[stage]
    given = explicit
    for source in (trainer.datamodule, trainer.module):
        if given is not None:
            break
        fn = getattr(source, method, None) if source is not None else None
        if fn is not None:
            try:
                given = fn()
            except NotImplementedError:
                given = None
    if given is None:
        if required:
            raise UserError(
                f"No data for {stage}: pass dataloaders to trainer.{stage}(...), a datamodule "
                f"defining {method}(), or define {method}() on the module"
            )
        return None
    train = stage == "fit"
    overfit = bool(trainer.overfit_batches) and stage in ("fit", "validate") and trainer.stage == "fit"
    several: list[Any] | Mapping[str, Any]
    if isinstance(given, Mapping):
        several = {key: _prepare(trainer, loader, train, overfit) for key, loader in given.items()}
    elif isinstance(given, (list, tuple)) and all(_is_loader(item) for item in given):
        several = [_prepare(trainer, loader, train, overfit) for loader in given]
    else:
        one = _prepare(trainer, given, train, overfit)
        return make_resumable(one) if train else [one]
    if not several:
        if required:
            raise ValueError(f"{method}: an empty {type(given).__name__} of dataloaders")
        return None
    if train:
        return MaxSizeCycle(several) if len(several) > 1 else make_resumable(next(iter(_values(several))))
    return list(_values(several))


def results_per_loader(metrics: Mapping[str, float], count: int) -> list[dict[str, float]]:
    """Split an evaluation's values into one dict per loader, as Lightning returns them.

    With several loaders, loader ``i``'s dict holds the keys ending in ``/dataloader_idx_i`` and the
    keys logged without a loader index (e.g. in ``on_validation_epoch_end``).

    >>> results_per_loader({"a/dataloader_idx_0": 1.0, "a/dataloader_idx_1": 2.0, "b": 3.0}, 2)
    [{'a/dataloader_idx_0': 1.0, 'b': 3.0}, {'a/dataloader_idx_1': 2.0, 'b': 3.0}]
    """
    if count <= 1:
        return [dict(metrics)]
    return [
        {k: v for k, v in metrics.items() if k.endswith(f"/dataloader_idx_{i}") or "/dataloader_idx_" not in k}
        for i in range(count)
    ]


def with_last_arg(fn: Callable[..., Any] | None, value: Any) -> Any:
    """``fn`` with ``value`` appended to its arguments (``dataloader_idx``); None stays None."""
    if fn is None:
        return None

    def call(*args: Any) -> Any:
        return fn(*args, value)

    return call


def check_takes_dataloader_idx(module: Any, step_name: str) -> None:
    """Several loaders: the step must take ``dataloader_idx`` (Lightning passes it; say so, not a TypeError)."""
    fn = getattr(module, step_name)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    takes = (
        "dataloader_idx" in params
        or any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values())
        or len([p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) >= 3
    )
    if not takes:
        raise TypeError(
            f"{type(module).__name__}.{step_name} is given several dataloaders, so it is called as "
            f"{step_name}(batch, batch_idx, dataloader_idx) (as in Lightning); add a `dataloader_idx: int = 0` "
            "parameter, or pass one dataloader"
        )


def _is_loader(obj: Any) -> bool:
    """A dataloader (or other iterable of batches), not a batch: a list of batches is one loader."""
    if isinstance(obj, DataLoader):
        return True
    return hasattr(obj, "__iter__") and not isinstance(obj, (torch.Tensor, list, tuple, Mapping, str, bytes))


def _values(several: list[Any] | Mapping[str, Any]) -> Iterable[Any]:
    return several.values() if isinstance(several, Mapping) else several


def _prepare(trainer: Trainer, loader: Iterable[Any], train: bool, overfit: bool = False) -> Iterable[Any]:
    if overfit:  # Trainer(overfit_batches=...): training and validation on the first training batches
        from trainer.arguments import overfit_loader

        loader = overfit_loader(loader)
    if getattr(trainer, "use_distributed_sampler", True):
        loader = trainer.strategy.process_dataloader(loader, train=train)
    prepared = add_worker_seeding(loader, trainer.strategy.global_rank)
    assert prepared is not None
    return prepared
