"""Reading and setting a hyperparameter where Lightning's finders look for it: the module, its hparams, the data.

``lr``/``learning_rate`` for the learning-rate finder, ``batch_size`` for the batch-size finder: an
attribute of the module, a key of ``module.hparams``, or an attribute of the trainer's datamodule
(Lightning's ``lightning_hasattr``/``lightning_setattr`` rules). Setting writes every place that has it.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

__all__ = ["attr_holders", "get_attr", "has_attr", "set_attr"]


def attr_holders(module: Any, name: str, datamodule: Any = None) -> list[Any]:
    """Every object (or ``hparams`` mapping) holding ``name``: the module, its hparams, the datamodule and its hparams.

    The datamodule is the one given, else the module's trainer's.
    """
    holders: list[Any] = []
    if datamodule is None:
        datamodule = getattr(getattr(module, "_trainer", None), "datamodule", None)
    for owner in (module, datamodule):
        if owner is None:
            continue
        if hasattr(owner, name):
            holders.append(owner)
        hparams = getattr(owner, "hparams", None)
        if isinstance(hparams, MutableMapping):
            if name in hparams:
                holders.append(hparams)
        elif hparams is not None and hasattr(hparams, name):
            holders.append(hparams)
    return holders


def has_attr(module: Any, name: str, datamodule: Any = None) -> bool:
    """Whether the module, its hparams or the datamodule has ``name``."""
    return bool(attr_holders(module, name, datamodule))


def get_attr(module: Any, name: str) -> Any:
    """The value of ``name`` as Lightning's ``lightning_getattr`` reads it: the last holder's (module, its
    hparams, datamodule, its hparams), so the datamodule's value wins over the module's."""
    holders = attr_holders(module, name)
    if not holders:
        raise AttributeError(
            f"{name!r} is neither an attribute of {type(module).__name__}, nor in its hparams, nor of the datamodule"
        )
    holder = holders[-1]
    return holder[name] if isinstance(holder, MutableMapping) else getattr(holder, name)


def set_attr(module: Any, name: str, value: Any, datamodule: Any = None) -> None:
    """Set ``name`` to ``value`` everywhere it is held (so the module and ``hparams`` stay in agreement)."""
    holders = attr_holders(module, name, datamodule)
    if not holders:
        raise AttributeError(
            f"{name!r} is neither an attribute of {type(module).__name__}, nor in its hparams, nor of the datamodule"
        )
    for holder in holders:
        if isinstance(holder, MutableMapping):
            holder[name] = value
        else:
            setattr(holder, name, value)
