"""Hyperparameters in a YAML file: Lightning's ``save_hparams_to_yaml`` and ``load_hparams_from_yaml``.

The loggers write ``hparams.yaml`` themselves; these two functions are for a user's own files (and
for reading a logger's back), under Lightning's names and with its meaning. Reading uses
``yaml.safe_load``: a hyperparameters file is data, never code.
"""

from __future__ import annotations

import copy
import os
import warnings
from argparse import Namespace
from collections.abc import Mapping
from enum import Enum
from typing import Any

import yaml

from trainer.hparams import _is_omegaconf

__all__ = ["load_hparams_from_yaml", "save_hparams_to_yaml"]


def load_hparams_from_yaml(config_yaml: str | os.PathLike[str], use_omegaconf: bool = True) -> Any:
    """The hyperparameters in ``config_yaml``: an OmegaConf ``DictConfig`` (``use_omegaconf``) or a dict.

    A missing file gives ``{}`` and a ``RuntimeWarning`` naming it, as in Lightning.
    """
    if not os.path.isfile(config_yaml):
        warnings.warn(f"Missing Tags: {config_yaml}.", RuntimeWarning, stacklevel=2)
        return {}
    with open(config_yaml, encoding="utf-8") as f:
        hparams = yaml.safe_load(f)
    if use_omegaconf and isinstance(hparams, Mapping):
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        try:
            return OmegaConf.create(dict(hparams))
        except OmegaConfBaseException:
            return hparams
    return hparams


def save_hparams_to_yaml(
    config_yaml: str | os.PathLike[str], hparams: Mapping[str, Any] | Namespace, use_omegaconf: bool = True
) -> None:
    """Write ``hparams`` (a dict, ``Namespace`` or ``DictConfig``) to ``config_yaml``; its folder must exist.

    An ``Enum`` is written by name; a value YAML cannot write is replaced by its type's name with a
    ``UserWarning`` naming it (Lightning's "Skipping ..." warning).
    """
    folder = os.path.dirname(os.fspath(config_yaml))
    if folder and not os.path.isdir(folder):
        raise RuntimeError(f"Missing folder: {folder}.")
    if isinstance(hparams, Namespace):
        hparams = vars(hparams)
    if _is_omegaconf(hparams) or (use_omegaconf and any(_is_omegaconf(v) for v in dict(hparams).values())):
        from omegaconf import OmegaConf

        hparams = {k: OmegaConf.to_container(v, resolve=True) if _is_omegaconf(v) else v for k, v in hparams.items()}
    if not isinstance(hparams, Mapping):
        raise TypeError(f"hparams must be dictionary, got {type(hparams).__name__}")
    allowed: dict[str, Any] = {}
    for key, value in dict(copy.copy(hparams)).items():
        value = value.name if isinstance(value, Enum) else value
        try:
            yaml.safe_dump(value)
        except (TypeError, ValueError, yaml.YAMLError):
            warnings.warn(
                f"Skipping '{key}' parameter because it is not possible to safely dump to YAML.",
                UserWarning,
                stacklevel=2,
            )
            continue
        allowed[key] = value
    with open(config_yaml, "w", encoding="utf-8", newline="") as f:
        yaml.safe_dump(allowed, f)
