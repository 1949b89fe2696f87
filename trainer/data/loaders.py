"""Which dataloaders a stage uses, prepared for the strategy, and how several of them are combined.

Lightning lets every stage take one dataloader or several (a list or a dict). Evaluation runs the
loaders one after another, each with its ``dataloader_idx`` (:func:`resolve_loaders`). Training zips
them in Lightning's default ``"max_size_cycle"`` mode (:class:`MaxSizeCycle`): each batch is a list
(or dict) with one batch from every loader, the shorter loaders start over until the longest ends.
A single loader is used as it is, so the one-loader path costs nothing extra; one loader in a list or
dict (``[loader]``) gives batches in that collection, as Lightning's (:class:`InCollection`). A list counts as several
loaders when its items are loaders; a list of batches (tensors, tuples, dicts) is one loader.
Collections of collections of loaders (``{"a": [l1, l2], "b": l3}``) are combined as Lightning's
``CombinedLoader`` combines them: flattened, and each batch put back in their shape.
Lightning's :class:`CombinedLoader` chooses another of its modes (``"min_size"``, ``"max_size"``).
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from trainer.common.errors import InvalidDataloaderError
from trainer.common.rank_zero import rank_zero_warn
from trainer.data.combined import CombinedLoader, Spec, tree_flatten, tree_unflatten
from trainer.data.resumable import add_worker_seeding, make_resumable

if TYPE_CHECKING:
    from trainer.module import DataModule
    from trainer.trainer import Trainer

__all__ = [
    "ZIP_MODES",
    "CombinedLoader",
    "InCollection",
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
        self,
        loaders: list[Iterable[Any]] | Mapping[str, Iterable[Any]],
        mode: str = "max_size_cycle",
        spec: Spec | None = None,
    ) -> None:
        if mode not in ZIP_MODES:
            raise ValueError(f"mode={mode!r}: training combines loaders in one of {list(ZIP_MODES)}")
        self.mode = mode
        #: The shape of a nested collection of loaders (``{"a": [l1, l2], "b": l3}``): each batch is put
        #: into it, and ``loaders`` are its flattened loaders (:mod:`trainer.data.combined`).
        self.spec = spec
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
            if self.spec is not None:
                yield tree_unflatten(batch, self.spec)
            else:
                yield dict(zip(self.keys, batch)) if self.keys is not None else batch

    def set_epoch(self, epoch: int) -> None:
        """Tell every loader's epoch-aware sampler and dataset which epoch it is."""
        for loader in self.loaders:
            set_sampler_epoch(loader, epoch)


class InCollection:
    """One training loader given in a list or dict (``[loader]``, ``{"a": loader}``): as in Lightning, each
    batch keeps the collection (``[batch]``, ``{"a": batch}``). The loader inside stays resumable: its
    ``batch_sampler``, ``dataset``, length ... are read through this wrapper."""

    def __init__(self, loader: Iterable[Any], key: Any = None) -> None:
        self.loader, self.key = loader, key
        self.loaders, self.keys = [loader], None if key is None else [key]

    def __iter__(self) -> Iterator[Any]:
        # The loader's iterator is made now, not at the first batch: a resume replays the sampler's
        # order and the random state the iterator draws from around this call (trainer/loops/iteration.py).
        key = self.key
        return map((lambda batch: [batch]) if key is None else (lambda batch: {key: batch}), iter(self.loader))

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.loader, name)


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
    spec = None
    if _nested(given):  # {"a": [l1, l2], "b": l3}: its loaders flat, each batch put back in its shape
        given, spec = tree_flatten(given)
    several: list[Any] | Mapping[str, Any]
    if isinstance(given, Mapping) and not _of_primitives(given):
        several = {key: _prepare(trainer, loader, train, overfit, method) for key, loader in given.items()}
    elif isinstance(given, (list, tuple)) and (combined or (given and all(_is_loader(item) for item in given))):
        several = [_prepare(trainer, loader, train, overfit, method) for loader in given]
    else:
        one = _prepare(trainer, given, train, overfit, method)
        return make_resumable(one) if train else [one]
    if not several:
        if required:
            raise ValueError(f"{method}: an empty {type(given).__name__} of dataloaders")
        return None
    if train:
        if len(several) > 1 or mode != "max_size_cycle" or spec is not None:
            return ZipLoaders(several, mode, spec)
        key = next(iter(several)) if isinstance(several, Mapping) else None
        only = make_resumable(next(iter(_values(several))))
        assert only is not None
        return InCollection(only, key)
    if combined and mode in ZIP_MODES:  # as Lightning: evaluated as one loader of combined batches
        return [ZipLoaders(several, mode, spec)]
    return list(_values(several))


def results_per_loader(
    metrics: Mapping[str, float], count: int, loader_keys: Mapping[str, str] | None = None
) -> list[dict[str, float]]:
    """Split an evaluation's values into one dict per loader, as Lightning returns them.

    With several loaders, loader ``i``'s dict holds the keys ending in ``/dataloader_idx_i``, the
    keys its steps logged with ``add_dataloader_idx=False`` (``loader_keys``: key -> that loader's
    suffix) and the keys logged outside any loader (e.g. in ``on_validation_epoch_end``).

    >>> results_per_loader({"a/dataloader_idx_0": 1.0, "a/dataloader_idx_1": 2.0, "b": 3.0}, 2)
    [{'a/dataloader_idx_0': 1.0, 'b': 3.0}, {'a/dataloader_idx_1': 2.0, 'b': 3.0}]
    >>> results_per_loader({"c": 1.0, "d": 2.0}, 2, {"d": "/dataloader_idx_1"})
    [{'c': 1.0}, {'c': 1.0, 'd': 2.0}]
    """
    if count <= 1:
        return [dict(metrics)]
    owned = loader_keys or {}
    out: list[dict[str, float]] = []
    for i in range(count):
        suffix = f"/dataloader_idx_{i}"
        out.append(
            {
                k: v
                for k, v in metrics.items()
                if k.endswith(suffix) or ("/dataloader_idx_" not in k and owned.get(k, suffix) == suffix)
            }
        )
    return out


def _check_iterable(given: Any, stage: str, returned_by: str | None) -> None:
    """Refuse, as Lightning does, a dataloader (or an entry of a list or dict of them) that cannot be iterated."""
    if isinstance(given, CombinedLoader):
        given = given.iterables
    if _of_primitives(given):
        entries = [given]  # Lightning's rule: a list (or dict) of numbers or strings is one loader of those batches
    elif isinstance(given, Mapping):
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


def _of_primitives(given: Any) -> bool:
    """A non-empty list, tuple or dict of ints, floats and strings only (``[0]``): Lightning iterates it as one loader."""
    items = given.values() if isinstance(given, Mapping) else given if isinstance(given, (list, tuple)) else ()
    items = list(items)
    return bool(items) and all(isinstance(item, (int, float, str)) for item in items)


def _nested(given: Any) -> bool:
    """Whether a list or dict of loaders holds collections of loaders (``{"a": [loader, loader]}``)."""
    items = given.values() if isinstance(given, Mapping) else given if isinstance(given, (list, tuple)) else ()
    for item in items:
        if isinstance(item, (list, tuple, Mapping)):
            leaves = tree_flatten(item)[0]
            if leaves and all(_is_loader(leaf) for leaf in leaves):
                return True
    return False


def _is_loader(obj: Any) -> bool:
    """A dataloader (or other iterable of batches), not a batch: a list of batches is one loader."""
    if isinstance(obj, DataLoader):
        return True
    if _of_primitives(obj):
        return True  # Lightning's rule: a list of numbers or strings in a collection is one iterable of them
    return hasattr(obj, "__iter__") and not isinstance(obj, (torch.Tensor, list, tuple, Mapping, str, bytes))


def _combined(loader: CombinedLoader, stage: str) -> Any:
    """The loaders of a :class:`CombinedLoader`, refusing a mode ``stage`` cannot run (as Lightning does)."""
    if stage == "fit" and loader.mode not in ZIP_MODES:
        raise ValueError(  # Lightning's words first
            f'`FitLoop` does not support the `CombinedLoader(mode="{loader.mode}")` mode. The available modes are: '
            f"{list(ZIP_MODES)} (training combines loaders; for loaders one after another, run separate fits)"
        )
    if stage == "predict" and loader.mode != "sequential":
        raise ValueError(
            '`trainer.predict()` only supports the `CombinedLoader(mode="sequential")` mode '
            f'(got mode="{loader.mode}"): predictions are kept per loader, one after another.'
        )
    return loader.iterables


def _values(several: list[Any] | Mapping[str, Any]) -> Iterable[Any]:
    return several.values() if isinstance(several, Mapping) else several


def _prepare(
    trainer: Trainer, loader: Iterable[Any], train: bool, overfit: bool = False, method: str = "train_dataloader"
) -> Iterable[Any]:
    _check_workers(loader, method)
    if overfit:  # Trainer(overfit_batches=...): training and validation on the first training batches
        from trainer.arguments import overfit_loader

        loader = overfit_loader(loader, "train" if train else "val")
    if getattr(trainer, "use_distributed_sampler", True):
        loader = trainer.strategy.process_dataloader(loader, train=train)
    prepared = add_worker_seeding(loader, trainer.strategy.global_rank)
    assert prepared is not None
    return prepared


def _check_workers(loader: Iterable[Any], method: str) -> None:
    """Lightning's advice: worker processes started with ``spawn`` each epoch are slow to start."""
    if not isinstance(loader, DataLoader) or loader.num_workers == 0 or loader.persistent_workers:
        return
    context = loader.multiprocessing_context
    start = context.get_start_method() if context is not None else mp.get_start_method()
    if start == "spawn":
        rank_zero_warn(
            f"Consider setting `persistent_workers=True` in '{method}' to speed up the dataloader worker "
            "initialization."
        )
