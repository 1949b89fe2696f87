"""``load_from_checkpoint``: a new module (or data module) built and loaded from a geartrain or Lightning 2.x file.

The file is read by the one reader (:func:`~trainer.checkpoint.reader.read_checkpoint`), with
``torch.load(weights_only=True)``: loading never runs pickled code. Only
``load_from_checkpoint(..., weights_only=False)``, as in Lightning, rebuilds hyperparameters that
are pickled objects (an ``nn.Module``, a ``functools.partial``), for files the user trusts.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Mapping
from typing import IO, Any, TypeVar

import torch

from trainer.checkpoint.format import is_lightning_checkpoint, upgrade
from trainer.checkpoint.reader import PickledObjectsError, read_checkpoint
from trainer.common.errors import UserError
from trainer.hparams import restore_hparams, restore_omegaconf

__all__ = ["load_from_checkpoint"]

T = TypeVar("T")


def load_from_checkpoint(
    cls: type[T],
    checkpoint_path: str | os.PathLike[str] | IO[bytes],
    map_location: Any = None,
    hparams_file: str | os.PathLike[str] | None = None,
    strict: bool | None = None,
    weights_only: bool | None = None,
    kwargs: Mapping[str, Any] | None = None,
    weights: bool = True,
) -> T:
    """Build ``cls`` from a checkpoint's hyperparameters (``kwargs`` override them), then load its state.

    ``weights`` says whether to load the model weights (modules) or the data module's state.
    ``weights_only=False`` reads the file with ``torch.load(weights_only=False)``, as Lightning does, for
    hyperparameters that are pickled objects; ``None`` or ``True``: only safe types.
    """
    location = map_location if map_location is not None else "cpu"
    try:  # weights_only=False, as Lightning: the file's pickled objects are rebuilt, running their code
        state = read_checkpoint(checkpoint_path, location, trusted=weights_only is False)
    except PickledObjectsError as err:
        raise PickledObjectsError(
            f"{err} If the file comes from a source you trust, load it with "
            f"{cls.__name__}.load_from_checkpoint(path, weights_only=False), as in Lightning: its pickled "
            "objects are then rebuilt, which runs their code."
        ) from err
    lightning = is_lightning_checkpoint(state)
    if not lightning:
        upgrade(state)
    prefix = "" if weights else "datamodule_"
    hparams: dict[str, Any] = {}
    # a module's: Lightning's keys before 0.8, read beneath the current one as Lightning reads them
    for key in ("hparams", "module_arguments", "hyper_parameters") if weights else ("datamodule_hyper_parameters",):
        hparams.update(state.get(key) or {})
    hparams = restore_omegaconf(hparams, list(state.get(f"{prefix}hparams_omegaconf", [])))
    unsaved = [] if lightning else list(state.get(f"{prefix}hparams_unsaved", []))
    if hparams_file is not None:
        hparams.update(_read_hparams_file(hparams_file))
    named = (state.get(f"{prefix}hparams_name"), state.get(f"{prefix}hparams_type"))
    obj = _construct(cls, hparams, unsaved, dict(kwargs or {}), checkpoint_path, named)
    on_load = getattr(obj, "on_load_checkpoint", None)
    if weights:
        if callable(on_load):
            on_load(state)
        from trainer.common.state_dict import load_module_state

        assert isinstance(obj, torch.nn.Module)
        chosen = getattr(obj, "_strict_loading", None)  # set by the module itself (self.strict_loading = ...)
        if chosen is not None and strict is not None and strict != chosen:
            raise UserError(
                f"You set `.load_from_checkpoint(..., strict={strict!r})` which is in conflict with "
                f"`{cls.__name__}.strict_loading={chosen!r}`. Please set the same value for both of them."
            )
        use_strict = strict if strict is not None else bool(getattr(obj, "strict_loading", True))
        if "sharded_directory" in state:
            from trainer.checkpoint.sharded import load_sharded

            load_sharded(state["sharded_directory"], obj, strict=use_strict)
        elif not state.get("state_dict"):
            warnings.warn(
                f"The state dict in {checkpoint_path!r} contains no parameters: {cls.__name__} keeps the weights "
                "its __init__ gave it",
                UserWarning,
                stacklevel=3,
            )
        else:
            load_module_state(obj, state["state_dict"], strict=use_strict)
        if map_location is not None and isinstance(map_location, (str, torch.device)):
            obj.to(map_location)
    else:
        dm_state = state.get("datamodule") if not lightning else state.get(type(obj).__qualname__)
        if dm_state is not None:
            obj.load_state_dict(dm_state)  # type: ignore[attr-defined]
    return obj


#: Parameter kinds that are not one named argument (``*args``, ``**kwargs``).
_SPREAD = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
#: The ``_instantiator`` values a checkpoint may name: LightningCLI's ``instantiate_module``, Lightning's or ours.
_INSTANTIATORS = frozenset(
    f"{package}.cli.instantiate_module" for package in ("lightning.pytorch", "pytorch_lightning", "trainer.lightning")
)


def _construct(
    cls: type[T],
    hparams: dict[str, Any],
    unsaved: list[str],
    kwargs: dict[str, Any],
    where: Any,
    named: tuple[Any, Any] = (None, None),
) -> T:
    """``cls(**arguments)``: the saved hyperparameters its ``__init__`` takes, overridden by ``kwargs``.

    ``named`` is the checkpoint's ``(hparams_name, hparams_type)``: hyperparameters saved from one
    ``__init__`` argument (``save_hyperparameters(hparams)``) go back as that argument, as in Lightning.
    """
    instantiator = hparams.pop("_instantiator", None)
    if instantiator is not None:  # saved by LightningCLI: rebuilt from the config it parsed
        if instantiator not in _INSTANTIATORS:  # a function the file names is never called
            raise ValueError(
                f"load_from_checkpoint({where!s}): the checkpoint's hyperparameters name {instantiator!r} to build "
                f"the module; geartrain calls only LightningCLI's instantiate_module "
                f"({', '.join(sorted(_INSTANTIATORS))}), never a function a file names. Build the module yourself "
                "and load_state_dict(checkpoint['state_dict'])"
            )
        from trainer.lightning.cli import instantiate_module

        return instantiate_module(cls, {**hparams, **kwargs})
    params = dict(list(inspect.signature(cls.__init__).parameters.items())[1:])  # after self, whatever its name
    name, kind = named
    if isinstance(name, str) and name in params and params[name].kind not in _SPREAD:
        hparams, unsaved = {name: restore_hparams(hparams, kind)}, [name] if unsaved else []
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    accepted = {n for n, p in params.items() if p.kind not in _SPREAD}
    arguments = {k: v for k, v in hparams.items() if takes_any or k in accepted}
    missing_unsaved = [n for n in unsaved if n in arguments and n not in kwargs]
    if missing_unsaved:
        names = ", ".join(missing_unsaved)
        example = ", ".join(f"{n}=..." for n in missing_unsaved)
        raise TypeError(
            f"{cls.__name__}.load_from_checkpoint({where!s}): the argument(s) {names} could not be saved in the "
            f"checkpoint (not plain data; it holds only a description); pass them: "
            f"{cls.__name__}.load_from_checkpoint(path, {example})"
        )
    arguments.update(kwargs)
    required = [
        n
        for n, p in params.items()
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and n not in arguments
    ]
    if required:
        raise TypeError(
            f"{cls.__name__}.load_from_checkpoint({where!s}): __init__ argument(s) {', '.join(required)} are not "
            "among the checkpoint's hyperparameters; pass them as keyword arguments to load_from_checkpoint "
            "(or call self.save_hyperparameters() in __init__)"
        )
    return cls(**arguments)


def _read_hparams_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Hyperparameters from a YAML file (Lightning's ``hparams.yaml``).

    A missing file adds none and warns ``Missing Tags: <path>``, as Lightning's ``load_from_checkpoint``
    does: a run whose logger wrote no ``hparams.yaml`` (``fast_dev_run``) still loads its checkpoint.
    """
    if not os.path.isfile(path):
        warnings.warn(f"Missing Tags: {path}.", RuntimeWarning, stacklevel=4)
        return {}
    import yaml

    with open(path) as f:
        loaded = yaml.safe_load(f) or {}
    if not isinstance(loaded, dict):
        raise ValueError(f"hparams_file {path} does not hold a mapping")
    return loaded
