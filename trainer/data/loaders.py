"""Which dataloaders a stage uses, prepared for the strategy, and how several of them are combined.

Lightning lets every stage take one dataloader or several (a list or a dict). Evaluation runs the
loaders one after another, each with its ``dataloader_idx`` (:func:`resolve_loaders`). Training zips
them in Lightning's default ``"max_size_cycle"`` mode (:class:`MaxSizeCycle`): each batch is a list
(or dict) with one batch from every loader, the shorter loaders start over until the longest ends.
A single loader is used as it is, so the one-loader path costs nothing extra. A list counts as several
loaders when its items are loaders; a list of batches (tensors, tuples, dicts) is one loader.
Lightning's :class:`CombinedLoader` chooses another of its modes (``"min_size"``, ``"max_size"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from trainer.common.errors import InvalidDataloaderError
from trainer.data.resumable import add_worker_seeding, make_resumable

if TYPE_CHECKING:
    from trainer.module import DataModule
    from trainer.trainer import Trainer

__all__ = [
    "ZIP_MODES",
    "CombinedLoader",
    "MaxSizeCycle",
    "ZipLoaders",
    "is_datamodule",
    "resolve_loaders",
    "results_per_loader",
    "set_sampler_epoch",
    "split_datamodule",
]

LOADER_METHODS = {
    "fit": "train_dataloader",
    "validate": "val_dataloader",
    "test": "test_dataloader",
    "predict": "predict_dataloader",
}


class ZipLoaders:
    """Several training loaders as one: a batch of every loader together (list or dict batches).

    ``mode`` is Lightning's: ``"max_size_cycle"`` (its default in training) lasts as long as the
    longest loader, a shorter one that runs out starts over (a new iterator, so a shuffling sampler
    draws a new order); ``"min_size"`` ends with the shortest; ``"max_size"`` lasts as long as the
    longest and gives ``None`` in place of a loader that has run out.

    >>> [b for b in ZipLoaders([[1, 2, 3], [10]])]
    [[1, 10], [2, 10], [3, 10]]
    >>> next(iter(ZipLoaders({"a": [1], "b": [2]})))
    {'a': 1, 'b': 2}
    >>> [b for b in ZipLoaders([[1, 2, 3], [10]], "max_size")], [b for b in ZipLoaders([[1, 2, 3], [10]], "min_size")]
    ([[1, 10], [2, None], [3, None]], [[1, 10]])
    """

    def __init__(
        self, loaders: list[Iterable[Any]] | Mapping[str, Iterable[Any]], mode: str = "max_size_cycle"
    ) -> None:
        if mode not in ZIP_MODES:
            raise ValueError(f"mode={mode!r}: training combines loaders in one of {list(ZIP_MODES)}")
        self.mode = mode
        self.keys: list[str] | None = list(loaders) if isinstance(loaders, Mapping) else None
        #: The loaders, in order (a dict's values in its order).
        self.loaders: list[Iterable[Any]] = list(loaders.values()) if isinstance(loaders, Mapping) else list(loaders)
        if not self.loaders:
            raise ValueError("train_dataloaders: an empty list or dict of dataloaders")

    def __len__(self) -> int:
        lengths = [len(loader) for loader in self.loaders]  # type: ignore[arg-type]
        return min(lengths) if self.mode == "min_size" else max(lengths)

    def __iter__(self) -> Iterator[Any]:
        iterators: list[Iterator[Any] | None] = [iter(loader) for loader in self.loaders]
        exhausted = [False] * len(iterators)
        while True:
            batch = []
            for i, loader in enumerate(self.loaders):
                try:
                    batch.append(next(iterators[i]) if iterators[i] is not None else None)  # type: ignore[arg-type]
                except StopIteration:
                    exhausted[i] = True
                    if all(exhausted) or self.mode == "min_size":
                        return
                    if self.mode == "max_size":
                        iterators[i] = None
                        batch.append(None)
                        continue
                    iterators[i] = iter(loader)
                    batch.append(next(iterators[i]))  # type: ignore[arg-type]
            yield dict(zip(self.keys, batch)) if self.keys is not None else batch

    def set_epoch(self, epoch: int) -> None:
        """Tell every loader's epoch-aware sampler and dataset which epoch it is."""
        for loader in self.loaders:
            set_sampler_epoch(loader, epoch)


def set_sampler_epoch(loader: Iterable[Any], epoch: int) -> None:
    """Tell a distributed (or any epoch-aware) sampler and dataset which epoch it is (each once)."""
    targets = (
        loader if not hasattr(loader, "dataset") else None,  # a combination of loaders
        getattr(loader, "dataset", None),
        getattr(loader, "sampler", None),
        getattr(getattr(loader, "batch_sampler", None), "sampler", None),
    )
    for i, target in enumerate(targets):
        if any(target is earlier for earlier in targets[:i]):
            continue  # a loader's sampler is also its batch sampler's
        set_epoch = getattr(target, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)


#: The name :class:`ZipLoaders` had when it knew Lightning's default mode only.
MaxSizeCycle = ZipLoaders

#: Lightning's ways of combining loaders that training takes; evaluation takes ``"sequential"``.
ZIP_MODES = ("max_size_cycle", "min_size", "max_size")


class CombinedLoader:
    """Lightning's ``CombinedLoader``: several loaders (a list or dict) handed over as one.

    Give it to ``trainer.fit`` to choose how training combines loaders (``"max_size_cycle"``,
    ``"min_size"``, ``"max_size"``: see :class:`ZipLoaders`); give it in ``"sequential"`` mode to
    ``validate``/``test``/``predict`` (or as validation loaders), which run the loaders one after
    another with their ``dataloader_idx``. Iterating it yields Lightning's
    ``(batch, batch_idx, dataloader_idx)`` triples.

    >>> list(CombinedLoader({"a": [1, 2], "b": [10]}, "max_size_cycle"))
    [({'a': 1, 'b': 10}, 0, 0), ({'a': 2, 'b': 10}, 1, 0)]
    >>> list(CombinedLoader([[1, 2], [10]], "sequential"))
    [(1, 0, 0), (2, 1, 0), (10, 0, 1)]
    """

    MODES = ("min_size", "max_size_cycle", "max_size", "sequential")

    def __init__(self, iterables: Any, mode: str = "min_size") -> None:
        if mode not in self.MODES:
            raise ValueError(f"Unsupported mode {mode!r}, please select one of: {list(self.MODES)}.")
        self.iterables = iterables
        self.mode = mode

    @property
    def flattened(self) -> list[Any]:
        """The loaders, in order (a dict's values in its order; one loader given alone is a list of one)."""
        if isinstance(self.iterables, Mapping):
            return list(self.iterables.values())
        if isinstance(self.iterables, (list, tuple)):
            return list(self.iterables)
        return [self.iterables]

    def _rebuilt(self, loaders: list[Any]) -> list[Any] | dict[str, Any]:
        """``loaders`` (prepared versions of :attr:`flattened`) in the shape of :attr:`iterables`."""
        if isinstance(self.iterables, Mapping):
            return dict(zip(self.iterables, loaders, strict=True))
        return loaders

    def __iter__(self) -> Iterator[tuple[Any, int, int]]:
        if self.mode == "sequential":
            for dataloader_idx, loader in enumerate(self.flattened):
                for batch_idx, batch in enumerate(loader):
                    yield batch, batch_idx, dataloader_idx
            return
        for batch_idx, batch in enumerate(ZipLoaders(self._rebuilt(self.flattened), self.mode)):
            yield batch, batch_idx, 0

    def __len__(self) -> int:
        if self.mode == "sequential":
            return sum(len(loader) for loader in self.flattened)
        return len(ZipLoaders(self._rebuilt(self.flattened), self.mode))


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
    given, returned_by = explicit, None
    for source in (trainer.datamodule, trainer.module):
        if given is not None:
            break
        fn = getattr(source, method, None) if source is not None else None
        if fn is not None:
            try:
                given, returned_by = fn(), f"{type(source).__name__}.{method}()"
            except NotImplementedError:
                given = None
    if given is not None:
        _check_iterable(given, stage, returned_by)
        _refuse_nested(given.iterables if isinstance(given, CombinedLoader) else given, stage)
    if given is None:
        if required and returned_by:
            raise InvalidDataloaderError(
                f"An invalid dataloader was returned from `{returned_by}`. Found None: it must return a DataLoader "
                "or another iterable of batches."
            )
        if required:
            raise InvalidDataloaderError(
                f"An invalid dataloader was passed to `Trainer.{stage}({'train_' if stage == 'fit' else ''}"
                f"dataloaders=...)`. Found None. No data for {stage}: pass the dataloader to the `.{stage}()` method "
                f"OR implement {method}() in your LightningModule/LightningDataModule."
            )
        return None
    train = stage == "fit"
    overfit = bool(trainer.overfit_batches) and stage in ("fit", "validate") and trainer.stage == "fit"
    mode = "max_size_cycle"
    combined = isinstance(given, CombinedLoader)
    if isinstance(given, CombinedLoader):
        given, mode = _combined(given, stage), given.mode
    several: list[Any] | Mapping[str, Any]
    if isinstance(given, Mapping):
        several = {key: _prepare(trainer, loader, train, overfit) for key, loader in given.items()}
    elif isinstance(given, (list, tuple)) and (combined or all(_is_loader(item) for item in given)):
        several = [_prepare(trainer, loader, train, overfit) for loader in given]
    else:
        one = _prepare(trainer, given, train, overfit)
        return make_resumable(one) if train else [one]
    if not several:
        if required:
            raise ValueError(f"{method}: an empty {type(given).__name__} of dataloaders")
        return None
    if train:
        if len(several) > 1 or mode != "max_size_cycle":
            return ZipLoaders(several, mode)
        return make_resumable(next(iter(_values(several))))
    if combined and mode in ZIP_MODES:  # as Lightning: evaluated as one loader of combined batches
        return [ZipLoaders(several, mode)]
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


def _check_iterable(given: Any, stage: str, returned_by: str | None) -> None:
    """Refuse, as Lightning does, a dataloader (or an entry of a list or dict of them) that cannot be iterated."""
    if isinstance(given, CombinedLoader):
        given = given.iterables
    if isinstance(given, Mapping):
        entries = list(given.values())
    elif isinstance(given, (list, tuple)):
        entries = [item for item in given if not isinstance(item, torch.Tensor)]  # a list of batches is one loader
    else:
        entries = [given]
    for entry in entries:
        if isinstance(entry, DataLoader) or hasattr(entry, "__iter__") or hasattr(entry, "__getitem__"):
            continue
        where = (
            f"An invalid dataloader was returned from `{returned_by}`"
            if returned_by
            else f"An invalid dataloader was passed to `Trainer.{stage}({'train_' if stage == 'fit' else ''}dataloaders=...)`"
        )
        raise InvalidDataloaderError(f"{where}. Found {entry!r}: give a DataLoader or another iterable of batches.")


def _refuse_nested(given: Any, stage: str) -> None:
    """A collection of collections of loaders (``{"a": [loader, loader]}``) is refused, not read as batches."""
    items = given.values() if isinstance(given, Mapping) else given if isinstance(given, (list, tuple)) else ()
    for item in items:
        inner = list(item.values()) if isinstance(item, Mapping) else item if isinstance(item, (list, tuple)) else ()
        if inner and all(_is_loader(loader) for loader in inner):
            raise NotImplementedError(
                f"trainer.{stage} got nested collections of dataloaders ({type(given).__name__} of "
                f"{type(item).__name__}s of loaders): not supported yet. Pass one flat list or dict of "
                "loaders (or a CombinedLoader of one); each batch is then a list or dict of their batches."
            )


def _is_loader(obj: Any) -> bool:
    """A dataloader (or other iterable of batches), not a batch: a list of batches is one loader."""
    if isinstance(obj, DataLoader):
        return True
    return hasattr(obj, "__iter__") and not isinstance(obj, (torch.Tensor, list, tuple, Mapping, str, bytes))


def _combined(loader: CombinedLoader, stage: str) -> Any:
    """The loaders of a :class:`CombinedLoader`, refusing a mode ``stage`` cannot run (as Lightning does)."""
    if stage == "fit" and loader.mode not in ZIP_MODES:
        raise ValueError(
            f'trainer.fit does not support CombinedLoader(mode="{loader.mode}"); training combines loaders in one '
            f"of {list(ZIP_MODES)}. For loaders one after another, run them in separate fits."
        )
    if stage == "predict" and loader.mode != "sequential":
        raise ValueError(
            '`trainer.predict()` only supports the `CombinedLoader(mode="sequential")` mode '
            f'(got mode="{loader.mode}"): predictions are kept per loader, one after another.'
        )
    return loader.iterables


def _values(several: list[Any] | Mapping[str, Any]) -> Iterable[Any]:
    return several.values() if isinstance(several, Mapping) else several


def _prepare(trainer: Trainer, loader: Iterable[Any], train: bool, overfit: bool = False) -> Iterable[Any]:
    if overfit:  # Trainer(overfit_batches=...): training and validation on the first training batches
        from trainer.arguments import overfit_loader

        loader = overfit_loader(loader, "train" if train else "val")
    if getattr(trainer, "use_distributed_sampler", True):
        loader = trainer.strategy.process_dataloader(loader, train=train)
    prepared = add_worker_seeding(loader, trainer.strategy.global_rank)
    assert prepared is not None
    return prepared
