"""Hyperparameters: ``save_hyperparameters``, ``hparams`` and what of them a checkpoint keeps.

Shared by :class:`~trainer.module.TrainModule` and :class:`~trainer.datamodule.DataModule`, with
Lightning's names and meaning. In memory a hyperparameter may be anything (a layer, a function);
a checkpoint keeps only what ``torch.load(weights_only=True)`` reads back, and records the rest as
a description string plus its name in ``hparams_unsaved``, so ``load_from_checkpoint`` can ask for
it instead of unpickling an object (which could run code).
"""

from __future__ import annotations

import copy
import inspect
import pickle
import types
import warnings
from argparse import Namespace
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import torch

from trainer.init_args import init_arguments

__all__ = [
    "PRIMITIVE_TYPES",
    "AttributeDict",
    "HyperparametersMixin",
    "clean_namespace",
    "given_hyperparameters",
    "hparams_kind",
    "hparams_record",
    "is_picklable",
    "omegaconf_paths",
    "plain_hparams",
    "restore_hparams",
    "restore_omegaconf",
]


class AttributeDict(dict[str, Any]):
    """A dict whose items are also attributes (Lightning's ``AttributeDict``).

    >>> hp = AttributeDict(lr=0.1)
    >>> hp.lr, hp["lr"]
    (0.1, 0.1)
    >>> hp.depth = 3
    >>> hp["depth"]
    3
    """

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as err:
            raise AttributeError(f"hparams has no {key!r} (it has: {', '.join(map(str, self)) or 'nothing'})") from err

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        try:
            del self[key]
        except KeyError as err:
            raise AttributeError(key) from err


class HyperparametersMixin:
    """``save_hyperparameters``, ``hparams`` and ``hparams_initial``, as in Lightning."""

    @property
    def hparams(self) -> AttributeDict:
        """The saved hyperparameters, with attribute and item access (empty until saved).

        An OmegaConf ``DictConfig`` given to ``save_hyperparameters`` is kept as it is, as Lightning keeps it.
        """
        hp = self.__dict__.get("_hparams")
        if hp is None:
            hp = AttributeDict()
            object.__setattr__(self, "_hparams", hp)
        return hp

    @hparams.setter
    def hparams(self, value: Mapping[str, Any] | Namespace) -> None:
        object.__setattr__(self, "_hparams", _to_hparams(value))

    @property
    def hparams_initial(self) -> AttributeDict:
        """A copy of the hyperparameters as ``save_hyperparameters`` recorded them (later edits excluded)."""
        initial = self.__dict__.get("_hparams_initial")
        return copy.deepcopy(initial) if initial is not None else AttributeDict()

    def save_hyperparameters(
        self,
        *args: Any,
        ignore: Sequence[str] | str | None = None,
        frame: types.FrameType | None = None,
        logger: bool = True,
    ) -> None:
        """Record hyperparameters in ``self.hparams``: the ``__init__`` arguments by default.

        Args:
            *args: names of ``__init__`` arguments to keep (default: all of them), or one dict,
                ``argparse.Namespace`` or OmegaConf ``DictConfig`` to record as it is.
            ignore: ``__init__`` argument names to leave out (e.g. a model passed in).
            frame: the frame whose arguments to record (default: the caller's ``__init__``).
            logger: whether loggers record them (TensorBoard's HPARAMS tab).

        They go into every checkpoint; :meth:`load_from_checkpoint` rebuilds the object from them
        (a recorded object that was an ``__init__`` argument is passed back under that argument's name).
        """
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        if frame is None:
            current = inspect.currentframe()
            frame = current.f_back if current is not None else None
        objects = [arg for arg in args if not isinstance(arg, str)]
        if len(objects) == 1:  # as Lightning: one object among the arguments is the hyperparameters
            init_args = init_arguments(self, frame, HyperparametersMixin)
            hp = _to_hparams(objects[0])
            names = [name for name, value in init_args.items() if value is objects[0]]
            object.__setattr__(self, "_hparams_name", names[0] if names else None)
        else:
            given = _GIVEN.get()
            # built by LightningCLI: its parsed config stands for the arguments
            init_args = dict(given) if given is not None else init_arguments(self, frame, HyperparametersMixin)
            if args:
                unknown = [name for name in args if name not in init_args]
                if unknown:
                    raise ValueError(
                        f"save_hyperparameters: {', '.join(map(repr, unknown))} "
                        f"{'is' if len(unknown) == 1 else 'are'} not __init__ arguments of {type(self).__name__} "
                        f"(they are: {', '.join(init_args) or 'none'})"
                    )
                hp = AttributeDict({name: init_args[name] for name in args})
            else:
                hp = AttributeDict(init_args)
            object.__setattr__(self, "_hparams_name", "kwargs" if hp else None)
        if isinstance(hp, dict) and isinstance(self.hparams, dict):
            self.hparams.update(hp)
        else:
            object.__setattr__(self, "_hparams", hp)
        for name in ignored & set(self.hparams):  # also what a base class's call saved, as in Lightning
            del self.hparams[name]
        for name, value in self.hparams.items():
            if isinstance(value, torch.nn.Module):
                warnings.warn(
                    f"Attribute {name!r} is an instance of `nn.Module` and is already saved during checkpointing. "
                    f"It is recommended to ignore them using `self.save_hyperparameters(ignore=[{name!r}])` "
                    "(geartrain's checkpoint keeps only its description; load_from_checkpoint then asks for it).",
                    UserWarning,
                    stacklevel=2,
                )
        # a shallow copy (as before: an nn.Module argument is not duplicated); a DictConfig is copied whole
        hp = self.hparams
        initial = AttributeDict(hp) if isinstance(hp, AttributeDict) else copy.deepcopy(hp)
        object.__setattr__(self, "_hparams_initial", initial)
        object.__setattr__(self, "_log_hyperparams", logger)

    def remove_ignored_hparams(self, ignore_list: list[str]) -> None:
        """Drop ``ignore_list`` from ``hparams`` (Lightning's helper of ``save_hyperparameters``)."""
        for name in ignore_list:
            self.hparams.pop(name, None)


def is_picklable(obj: object) -> bool:
    """Whether ``pickle.dumps(obj)`` works (Lightning's ``utilities.parsing.is_picklable``)."""
    try:
        pickle.dumps(obj)
    except (pickle.PickleError, AttributeError, RuntimeError, TypeError):
        return False
    return True


def clean_namespace(hparams: MutableMapping[str, Any]) -> None:
    """Drop every value pickle cannot write from ``hparams``, with Lightning's warning naming each.

    The trainer does this to the module's ``hparams`` when a run starts, as Lightning's does: a
    lambda or a local class among them would stop the processes a strategy starts and the loggers.
    """
    for name in [k for k, v in hparams.items() if not is_picklable(v)]:
        warnings.warn(
            f"Attribute {name!r} removed from hparams because it cannot be pickled. You can suppress this warning "
            f"by setting `self.save_hyperparameters(ignore=[{name!r}])`.",
            UserWarning,
            stacklevel=2,
        )
        del hparams[name]


def plain_hparams(hparams: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``(what a checkpoint keeps, names recorded only as a description)`` for ``hparams``.

    Numbers, strings, bools, None, tensors and lists/tuples/dicts of them are kept as they are; any
    other value (a module, a ``functools.partial``, a class) becomes a description string and its
    name is listed, so loading asks for it instead of unpickling it.
    """
    kept: dict[str, Any] = {}
    unsaved: list[str] = []
    for name, value in hparams.items():
        plain = _plain(value)
        if plain is _UNSAVED:
            kept[str(name)] = _describe(value)
            unsaved.append(str(name))
        else:
            kept[str(name)] = plain
    return kept, unsaved


_UNSAVED = object()


def _plain(value: Any) -> Any:
    """``value`` as plain data, or ``_UNSAVED`` where some part of it is not plain."""
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Namespace):
        value = vars(value)
    if isinstance(value, Mapping):
        items = {str(k): _plain(v) for k, v in value.items()}
        return _UNSAVED if any(v is _UNSAVED for v in items.values()) else items
    if isinstance(value, (list, tuple)):
        seq = [_plain(v) for v in value]
        if any(v is _UNSAVED for v in seq):
            return _UNSAVED
        return tuple(seq) if isinstance(value, tuple) else seq
    try:  # an OmegaConf container (Hydra configs): resolved into plain data
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, (DictConfig, ListConfig)):
            return _plain(OmegaConf.to_container(value, resolve=True))
    except ImportError:  # pragma: no cover - hydra is a dependency
        pass
    return _UNSAVED


def _describe(value: Any) -> str:
    """A readable, never-executed description of a value a checkpoint cannot keep."""
    if isinstance(value, type):
        return f"<class {value.__module__}.{value.__qualname__}>"
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    text = repr(value)
    if len(text) > 200:
        text = text[:200] + "..."
    return f"<{kind}: {text}>"


#: What ``save_hyperparameters`` refuses as the one object to record (Lightning's ``PRIMITIVE_TYPES``).
PRIMITIVE_TYPES = (bool, int, float, str)


def _to_hparams(value: Any) -> Any:
    """``value`` as ``hparams``: an ``AttributeDict`` of a dict or Namespace; an OmegaConf ``DictConfig`` as it is."""
    if isinstance(value, Namespace):
        value = vars(value)
    if _is_omegaconf(value):
        return value
    if isinstance(value, Mapping):
        return AttributeDict(value)
    if isinstance(value, PRIMITIVE_TYPES):
        raise ValueError(
            f"Primitives {PRIMITIVE_TYPES} are not allowed. save_hyperparameters takes __init__ argument names "
            f"(strings), or one dict, argparse.Namespace or DictConfig; got the {type(value).__name__} {value!r}"
        )
    raise ValueError(
        f"Unsupported config type of {type(value)}. save_hyperparameters takes __init__ argument names, or one "
        "dict, argparse.Namespace or OmegaConf DictConfig"
    )


def _is_omegaconf(value: Any) -> bool:
    """Whether ``value`` is an OmegaConf ``DictConfig`` (Hydra's configs)."""
    try:
        from omegaconf import DictConfig
    except ImportError:  # pragma: no cover - hydra, a dependency, brings omegaconf
        return False
    return isinstance(value, DictConfig)


def hparams_kind(hparams: Any) -> str | None:
    """What a checkpoint records as ``hparams_type``: ``"DictConfig"`` for an OmegaConf config, else None.

    Lightning records the class itself (a pickled object); a name keeps the file ``weights_only``-safe,
    and Lightning's loader reads a name as "a dict".
    """
    return "DictConfig" if _is_omegaconf(hparams) else None


def hparams_record(owner: Any, prefix: str = "") -> dict[str, Any]:
    """What a checkpoint keeps of ``owner``'s hyperparameters, under Lightning's keys (with ``prefix``).

    ``hyper_parameters`` and ``hparams_unsaved`` (:func:`plain_hparams`), ``hparams_name`` (the
    ``__init__`` argument they came in as, or ``"kwargs"``) and ``hparams_type`` (``"DictConfig"``).
    """
    kept, unsaved = plain_hparams(owner.hparams)
    record: dict[str, Any] = {f"{prefix}hyper_parameters": kept, f"{prefix}hparams_unsaved": unsaved}
    name = owner.__dict__.get("_hparams_name")
    if name and owner.hparams:
        record[f"{prefix}hparams_name"] = name
    kind = hparams_kind(owner.hparams)
    if kind is not None:
        record[f"{prefix}hparams_type"] = kind
    inner = [] if kind is not None else omegaconf_paths(dict(owner.hparams))
    if inner:
        record[f"{prefix}hparams_omegaconf"] = inner
    return record


def omegaconf_paths(value: Any, path: tuple[str | int, ...] = ()) -> list[list[str | int]]:
    """Where OmegaConf containers sit inside ``value`` (key and index paths), outermost only.

    A checkpoint keeps a container resolved into plain data; these paths let loading make it one
    again (``hparams_omegaconf``), as Lightning's pickled hyperparameters come back.
    """
    if _is_omegaconf(value) or type(value).__name__ == "ListConfig":
        return [list(path)]
    if isinstance(value, Mapping):
        return [p for key, item in value.items() for p in omegaconf_paths(item, (*path, str(key)))]
    if isinstance(value, (list, tuple)):
        return [p for i, item in enumerate(value) for p in omegaconf_paths(item, (*path, i))]
    return []


def restore_omegaconf(hparams: dict[str, Any], paths: list[list[str | int]]) -> dict[str, Any]:
    """``hparams`` with the values at ``paths`` (:func:`omegaconf_paths`) made OmegaConf containers again."""
    if not paths:
        return hparams
    from omegaconf import OmegaConf

    hparams = copy.deepcopy(hparams)
    for path in paths:
        parent: Any = hparams
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, tuple):  # a tuple is rebuilt around its new item
            continue
        parent[path[-1]] = OmegaConf.create(parent[path[-1]])
    return hparams


def restore_hparams(hparams: dict[str, Any], kind: Any) -> Any:
    """Saved hyperparameters back in the kind they were given: a ``DictConfig`` where one was saved."""
    if kind == "DictConfig" or (isinstance(kind, type) and kind.__name__ == "DictConfig"):
        from omegaconf import OmegaConf

        return OmegaConf.create(hparams)
    return hparams


#: Hyperparameters that ``save_hyperparameters`` records instead of the ``__init__`` arguments (see below).
_GIVEN: ContextVar[dict[str, Any] | None] = ContextVar("given_hyperparameters", default=None)


@contextmanager
def given_hyperparameters(hparams: Mapping[str, Any], instantiator: str) -> Iterator[None]:
    """While open, ``save_hyperparameters()`` records ``hparams`` and ``_instantiator`` instead of ``__init__``'s arguments.

    Lightning's ``LightningCLI(load_from_checkpoint_support=True)`` builds the model in here, with the
    config it parsed (class paths of nested objects included): ``load_from_checkpoint`` then rebuilds
    the model from that config with ``instantiator`` (the function's import path) instead of calling
    ``__init__`` with objects a checkpoint cannot hold.
    """
    token = _GIVEN.set({**hparams, "_instantiator": instantiator})
    try:
        yield
    finally:
        _GIVEN.reset(token)
