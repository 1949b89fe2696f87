"""Sharded checkpoint directories on the trainer's side: reading one, and converting to and from one file.

The directory format and the per-rank save/load are :mod:`strategies.sharded_checkpoint`'s; this
room checks a directory's trainer state like :func:`~trainer.checkpoint.files.load_checkpoint` checks a
file, and converts between the two forms (``python -m trainer.checkpoint.convert``):

- :func:`directory_to_file`: every shard read into full tensors (no process group needed), the
  optimizer state renumbered into ``optimizer.state_dict()``'s by-index layout, written as one
  geartrain file that ``load_checkpoint`` reads with ``weights_only=True`` and any strategy resumes.
- :func:`file_to_directory`: the other way, using the parameter names the file records
  (``optimizer_param_names``), so the optimizer state is keyed by name as in a sharded save.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from strategies.sharded_checkpoint import (
    PendingSave,
    checkpoint_error,
    complete_path,
    is_sharded_checkpoint,
    read_sharded_metadata,
    read_trainer_state,
    safe_planner,
    safe_reader,
    save_sharded,
)
from trainer.checkpoint.files import FORMAT_NAME, check_version, load_checkpoint, save_checkpoint
from trainer.checkpoint.layout import upgrade
from trainer.checkpoint.safety import check_checkpoint_file
from trainer.common.errors import CheckpointError

__all__ = [
    "PendingSave",
    "complete_path",
    "directory_to_file",
    "file_to_directory",
    "is_sharded_checkpoint",
    "param_names",
    "read_directory",
]


def read_directory(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A sharded checkpoint's trainer state, format-checked; ``"sharded_directory"`` names the tensors' place.

    ``"optimizer_states"`` holds one empty placeholder per saved optimizer (their tensors stay in the
    shards), so the resume checks count them as they count a file's.
    """
    path = Path(path)
    if not is_sharded_checkpoint(path):
        check_checkpoint_file(path)  # says what it is instead: missing, a plain directory, ...
    state = read_trainer_state(path)
    if state.get("format") != FORMAT_NAME:
        raise CheckpointError(f"{path} is not a geartrain checkpoint (no format={FORMAT_NAME!r} in its trainer state)")
    check_version(path, state.get("version"))
    upgrade(state)
    if "optimizer_types" in state:
        state["optimizer_states"] = [{} for _ in state["optimizer_types"]]
    state["sharded_directory"] = path
    return state


def param_names(module: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> list[list[str]]:
    """Each optimizer's parameter names in the order ``optimizer.state_dict()`` numbers them."""
    by_id = {id(p): name for name, p in module.named_parameters()}
    return [[by_id.get(id(p), "") for group in opt.param_groups for p in group["params"]] for opt in optimizers]


def _read_all_tensors(path: Path) -> dict[str, Any]:
    """Every tensor and value of a sharded checkpoint, whole, in one process (what conversion needs)."""
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    read_sharded_metadata(path)  # refuses a crafted .metadata with its own message, before DCP wraps it
    state: dict[str, Any] = {}
    planner = safe_planner(_EmptyStateDictLoadPlanner)
    try:
        _load_state_dict(state, storage_reader=safe_reader(path), planner=planner, no_dist=True)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:  # DCP's CheckpointException is one
        raise checkpoint_error(err, f"Cannot read the sharded checkpoint {path}") from err
    return state


def directory_to_file(directory: str | os.PathLike[str], file: str | os.PathLike[str]) -> Path:
    """Write the sharded checkpoint ``directory`` as one portable geartrain checkpoint ``file``.

    Holds the whole state in this process's memory once (that is what a single file is).
    """
    directory = complete_path(directory)
    state = read_directory(directory)
    del state["sharded_directory"]
    tensors = _read_all_tensors(directory)
    state["state_dict"] = dict(tensors.get("state_dict", {}))
    if "optimizer_types" in state:
        saved = tensors.get("optimizers", {})
        state["optimizer_states"] = [_by_index(saved.get(str(i), {})) for i in range(len(state["optimizer_types"]))]
        state["optimizer_param_names"] = [_names(saved.get(str(i), {})) for i in range(len(state["optimizer_types"]))]
    return save_checkpoint(state, file)


def _names(named: dict[str, Any]) -> list[str]:
    return [str(name) for group in named.get("param_groups", []) for name in group["params"]]


def _by_index(named: dict[str, Any]) -> dict[str, Any]:
    """Optimizer state keyed by parameter name → ``optimizer.state_dict()``'s layout (by index)."""
    if not named:
        return {"state": {}, "param_groups": []}
    index = {name: i for i, name in enumerate(_names(named))}
    return {
        "state": {index[name]: value for name, value in named.get("state", {}).items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in named["param_groups"]],
    }


def file_to_directory(file: str | os.PathLike[str], directory: str | os.PathLike[str]) -> Path:
    """Write the geartrain checkpoint ``file`` as a sharded checkpoint ``directory`` (one shard).

    The optimizer state is keyed by parameter name, from the names the file records; a file
    without them (written before geartrain recorded them) converts its weights and trainer state,
    and refuses to guess the optimizer's names.
    """
    state = load_checkpoint(file)
    optimizers = state.get("optimizer_states")
    if optimizers:
        names = state.get("optimizer_param_names")
        if not names or len(names) != len(optimizers):
            raise CheckpointError(
                f"{file} does not record its optimizers' parameter names, which a sharded checkpoint keys their "
                "state by; resave it with this geartrain (Trainer.save_checkpoint), or load it as a file"
            )
        state["optimizer_states"] = [_by_name(opt, n) for opt, n in zip(optimizers, names)]
    save_sharded(directory, state).wait()
    return Path(directory)


def _by_name(indexed: dict[str, Any], names: list[str]) -> dict[str, Any]:
    if not indexed.get("param_groups"):
        return {}
    return {
        "state": {names[int(i)]: value for i, value in indexed["state"].items()},
        "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in indexed["param_groups"]],
    }
