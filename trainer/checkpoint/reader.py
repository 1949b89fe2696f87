"""The one reader: any checkpoint a run may be given, read once and recognised once.

``Trainer.fit/validate/test/predict(ckpt_path=...)`` reads through :func:`read_any`: a sharded
directory (its trainer state; the tensors stay in the shards), or a file loaded once with
``weights_only=True`` and then recognised from what it holds, in this order: a geartrain checkpoint
(its format version checked, older layouts upgraded), a Lightning 2.x checkpoint (turned into
geartrain's dict), a plain PyTorch state dict (weights only). Anything else is refused naming what
the file holds. The one ``torch.load`` of a checkpoint file (:func:`read_checkpoint`, also
``load_from_checkpoint``'s) is here; the safety checks (what is at the path, why ``torch.load``
refused it) are :mod:`trainer.checkpoint.safety`'s.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

import torch

from trainer.checkpoint.files import FORMAT_NAME, FORMAT_VERSION, check_version
from trainer.checkpoint.layout import upgrade
from trainer.checkpoint.safety import check_checkpoint_file, first_reason, unreadable
from trainer.checkpoint.sharded import complete_path, read_directory
from trainer.common.errors import CheckpointError
from trainer.common.state_dict import plain_state_dict

__all__ = ["LIGHTNING_SAFE_GLOBALS", "read_any", "read_checkpoint"]


#: The names Lightning's ``AttributeDict`` is pickled under (Lightning 2.x), each read as a plain dict.
LIGHTNING_SAFE_GLOBALS: list[Any] = [
    (dict, "lightning_fabric.utilities.data.AttributeDict"),
    (dict, "lightning.fabric.utilities.data.AttributeDict"),
    (dict, "pytorch_lightning.utilities.parsing.AttributeDict"),
]


def read_checkpoint(path: str | os.PathLike[str] | IO[bytes], map_location: Any = "cpu") -> dict[str, Any]:
    """Load a geartrain or Lightning checkpoint with ``weights_only=True`` (Lightning's AttributeDict allowed)."""
    where = path if isinstance(path, (str, os.PathLike)) else getattr(path, "name", "<stream>")
    if isinstance(path, (str, os.PathLike)) and Path(path).is_dir():
        return read_directory(path)  # its tensors stay in the shards: "sharded_directory" says where
    if isinstance(path, (str, os.PathLike)):
        check_checkpoint_file(Path(path))
    try:
        with torch.serialization.safe_globals(LIGHTNING_SAFE_GLOBALS):
            state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        if isinstance(path, (str, os.PathLike)):
            raise unreadable(Path(path), err) from err
        raise CheckpointError(f"Cannot read checkpoint {where} with weights_only=True: {first_reason(err)}") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"{where} holds a {type(state).__name__}, not a checkpoint dict")
    return state


def read_any(path: str | Path) -> dict[str, Any]:
    """Read ``path`` once and return it as geartrain's checkpoint dict (see the module docstring).

    A plain state dict comes back as ``{"state_dict": ..., "plain_weights": True}``; a sharded
    directory's dict names its shards under ``"sharded_directory"``.
    """
    path = complete_path(Path(path))  # after a kill between a save's two renames, the checkpoint set aside
    if path.is_dir():
        return read_directory(path)
    state = read_checkpoint(path)  # one torch.load (weights_only; Lightning's AttributeDict allowed by name)
    return recognise(state, path)


def recognise(state: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """A loaded checkpoint dict (ours, Lightning's, a plain state dict; from ``path``) as geartrain's."""
    path = Path(path)
    if state.get("format") == FORMAT_NAME:
        check_version(path, state.get("version"))
        return upgrade(state)
    # Imported here: lightning_format imports this module (its load_from_checkpoint reads through it).
    from trainer.checkpoint.lightning_format import is_lightning_checkpoint, lightning_resume_state

    if is_lightning_checkpoint(state):
        return lightning_resume_state(state)
    weights = plain_state_dict(state)
    if weights is not None:
        return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "state_dict": weights, "plain_weights": True}
    raise CheckpointError(
        f"{path} is not a checkpoint geartrain reads (no format={FORMAT_NAME!r} entry, no Lightning keys and no "
        f"state dict; found {sorted(state)[:10]}). To load plain weights use module.load_state_dict(torch.load(path))."
    )
