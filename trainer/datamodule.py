"""``DataModule``: the data of a task, with Lightning's ``LightningDataModule`` names and meaning."""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Mapping, Sized
from typing import IO, TYPE_CHECKING, Any, TypeVar

from torch.utils.data import DataLoader, Dataset, IterableDataset

from trainer.hparams import HyperparametersMixin
from trainer.module_hooks import DataHooks

if TYPE_CHECKING:
    from trainer.trainer import Trainer

__all__ = ["DataModule"]

D = TypeVar("D", bound="DataModule")


class DataModule(HyperparametersMixin, DataHooks):
    """Bundles the data of a task: ``prepare_data`` (once per node), ``setup(stage)``, one loader per stage.

    Override the ``*_dataloader`` methods a run needs; the trainer reports which one is missing.
    ``self.trainer`` is the trainer using it (None outside a run).
    """

    #: The checkpoint keys of the data module's hyperparameters (Lightning's names).
    CHECKPOINT_HYPER_PARAMS_KEY = "datamodule_hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "datamodule_hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "datamodule_hparams_type"

    def __init__(self) -> None:
        self.trainer: Trainer | None = None

    def __getattr__(self, name: str) -> Any:
        if name == "trainer":  # subclasses that do not call super().__init__()
            return None
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __str__(self) -> str:
        """The dataset size of each stage's loader, as Lightning prints a data module.

        ``{Train dataloader: size=64}`` per line; ``None`` where the loader method fails (not defined,
        or ``setup`` not run yet), ``size=NA`` for a dataset without a length, ``1. size=16 ; 2. size=NA``
        for a list or dict of loaders.
        """
        lines = []
        for title, method in _LOADER_METHODS:
            try:
                loaders = getattr(self, method)()
            except Exception:  # a loader that cannot be built yet shows as None, as in Lightning
                lines.append(f"{{{title}: None}}")
                continue
            if isinstance(loaders, (list, tuple, Mapping)):
                items = loaders.values() if isinstance(loaders, Mapping) else loaders
                text = " ; ".join(f"{i}. {_loader_size(loader)}" for i, loader in enumerate(items, start=1))
            else:
                text = _loader_size(loaders)
            lines.append(f"{{{title}: {text}}}")
        return os.linesep.join(lines)

    def state_dict(self) -> dict[str, Any]:
        """State to put into checkpoints (e.g. a data cursor); restored by :meth:`load_state_dict`."""
        return {}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    @classmethod
    def from_datasets(
        cls,
        train_dataset: Dataset[Any] | Iterable[Dataset[Any]] | None = None,
        val_dataset: Dataset[Any] | Iterable[Dataset[Any]] | None = None,
        test_dataset: Dataset[Any] | Iterable[Dataset[Any]] | None = None,
        predict_dataset: Dataset[Any] | Iterable[Dataset[Any]] | None = None,
        batch_size: int = 1,
        num_workers: int = 0,
        **datamodule_kwargs: Any,
    ) -> DataModule:
        """A data module serving these datasets with ``DataLoader(batch_size, num_workers, pin_memory=True)``.

        The training loader shuffles (unless the dataset is iterable); the others do not. A list or
        dict of datasets gives a list or dict of loaders. ``datamodule_kwargs`` go to ``cls(...)``, and so
        do ``batch_size`` and ``num_workers`` where its ``__init__`` takes them (or takes ``**kwargs``), as in
        Lightning.

        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> dm = DataModule.from_datasets(TensorDataset(torch.arange(4.0)), batch_size=2)
        >>> len(dm.train_dataloader())
        2
        """

        def loaders(ds: Any, shuffle: bool) -> Any:
            if isinstance(ds, Mapping):
                return {key: loaders(value, shuffle) for key, value in ds.items()}
            if isinstance(ds, (list, tuple)):
                return [loaders(value, shuffle) for value in ds]
            return DataLoader(
                ds,
                batch_size=batch_size,
                shuffle=shuffle and not isinstance(ds, IterableDataset),
                num_workers=num_workers,
                pin_memory=True,
            )

        params = inspect.signature(cls.__init__).parameters
        special = {"batch_size": batch_size, "num_workers": num_workers}
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            special = {k: v for k, v in special.items() if k in params}
        datamodule = cls(**datamodule_kwargs, **special)
        if train_dataset is not None:
            datamodule.train_dataloader = lambda: loaders(train_dataset, True)  # type: ignore[method-assign]
        if val_dataset is not None:
            datamodule.val_dataloader = lambda: loaders(val_dataset, False)  # type: ignore[method-assign]
        if test_dataset is not None:
            datamodule.test_dataloader = lambda: loaders(test_dataset, False)  # type: ignore[method-assign]
        if predict_dataset is not None:
            datamodule.predict_dataloader = lambda: loaders(predict_dataset, False)  # type: ignore[method-assign]
        return datamodule

    @classmethod
    def load_from_checkpoint(
        cls: type[D],
        checkpoint_path: str | os.PathLike[str] | IO[bytes],
        map_location: Any = None,
        hparams_file: str | os.PathLike[str] | None = None,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> D:
        """Rebuild the data module from a checkpoint's saved hyperparameters and state (``kwargs`` override).

        Reads geartrain's and Lightning 2.x's checkpoints, always with ``weights_only=True``.
        """
        from trainer.checkpoint.lightning_format import load_from_checkpoint

        return load_from_checkpoint(
            cls, checkpoint_path, map_location, hparams_file, None, weights_only, kwargs, weights=False
        )


#: The loader methods ``str(datamodule)`` lists, with Lightning's titles.
_LOADER_METHODS = [
    ("Train dataloader", "train_dataloader"),
    ("Validation dataloader", "val_dataloader"),
    ("Test dataloader", "test_dataloader"),
    ("Predict dataloader", "predict_dataloader"),
]


def _loader_size(loader: Any) -> str:
    """``size=<len(dataset)>`` of a loader (``NA`` without a length), ``None`` for what is not a loader."""
    if not isinstance(loader, DataLoader):
        return "None"
    dataset = loader.dataset
    return f"size={len(dataset)}" if isinstance(dataset, Sized) else "size=NA"
