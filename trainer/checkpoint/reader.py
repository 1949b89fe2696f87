"""The one reader: any checkpoint a run may be given, read once and recognised once.

:func:`read_any` (``Trainer.fit/validate/test/predict(ckpt_path=...)``) reads a sharded directory's
trainer state (the tensors stay in the shards) or a file, then recognises it: a geartrain checkpoint
(version checked, older layouts upgraded), a Lightning 2.x checkpoint, a plain PyTorch state dict
(weights only); anything else is refused naming what it holds. Every ``torch.load`` of a checkpoint
is :func:`read_checkpoint`'s (``weights_only=True``), and so are the checks on what is at the path
and why torch refused a file (pickled Python objects, named and never run, or a damaged file),
without torch's advice to retry with ``weights_only=False``. :func:`complete_path` finds the
checkpoint a kill left set aside mid-replacement (:data:`~trainer.checkpoint.format.SET_ASIDE`).
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import stat
import types
from pathlib import Path
from typing import IO, Any

import torch

from trainer.checkpoint.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    METADATA,
    SET_ASIDE,
    TRAINER_STATE,
    check_version,
    is_lightning_checkpoint,
    lightning_resume_state,
    upgrade,
)
from trainer.common.errors import CheckpointError, CheckpointNotFoundError
from trainer.common.state_dict import plain_state_dict

__all__ = [
    "PickledObjectsError",
    "complete_path",
    "fetch_url",
    "first_reason",
    "is_url",
    "load_checkpoint",
    "read_any",
    "read_checkpoint",
    "read_directory",
    "recognise",
]


#: The names Lightning's ``AttributeDict`` is pickled under (Lightning 2.x), each read as a plain dict.
LIGHTNING_SAFE_GLOBALS: list[Any] = [
    (dict, "lightning_fabric.utilities.data.AttributeDict"),
    (dict, "lightning.fabric.utilities.data.AttributeDict"),
    (dict, "pytorch_lightning.utilities.parsing.AttributeDict"),
]


def read_any(path: str | Path) -> dict[str, Any]:
    """Read ``path`` once and return it as geartrain's checkpoint dict (see the module docstring).

    A plain state dict comes back as ``{"state_dict": ..., "plain_weights": True}``; a sharded
    directory's dict names its shards under ``"sharded_directory"``.
    """
    path = complete_path(Path(path))
    return recognise(read_checkpoint(path), path)


def recognise(state: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """A loaded checkpoint dict (ours, Lightning's, a plain state dict; from ``path``) as geartrain's."""
    path = Path(path)
    if state.get("format") == FORMAT_NAME:
        return _ours(path, state)
    if is_lightning_checkpoint(state):
        return lightning_resume_state(state)
    weights = plain_state_dict(state)
    if weights is not None:
        return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "state_dict": weights, "plain_weights": True}
    raise CheckpointError(
        f"{path} is not a checkpoint geartrain reads (no format={FORMAT_NAME!r} entry, no Lightning keys and no "
        f"state dict; found {sorted(state)[:10]}). To load plain weights use module.load_state_dict(torch.load(path))."
    )


def load_checkpoint(path: str | os.PathLike[str], map_location: Any = "cpu") -> dict[str, Any]:
    """Read a geartrain checkpoint file (:func:`read_checkpoint`) and check its format and version."""
    path = Path(path)
    check_checkpoint_file(path)  # a file: a sharded directory is refused here, not read
    return _ours(path, read_checkpoint(path, map_location))


def _ours(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """A geartrain checkpoint's dict, its format version checked and older layouts upgraded; any other refused."""
    if state.get("format") != FORMAT_NAME:
        raise CheckpointError(
            f"{path} is not a geartrain checkpoint (no format={FORMAT_NAME!r} entry; found {sorted(state)[:10]}). "
            "To load plain weights use module.load_state_dict(torch.load(path))."
        )
    check_version(path, state.get("version"))
    return upgrade(state)


def is_url(path: object) -> bool:
    """``path`` is an ``http://`` or ``https://`` address (Lightning reads a checkpoint from one)."""
    return isinstance(path, str) and path.startswith(("http://", "https://"))


def fetch_url(url: str) -> Path:
    """The checkpoint at ``url``, downloaded once into torch hub's cache, as Lightning's loading does.

    Lightning reads such a file with ``torch.hub.load_state_dict_from_url``, which keeps it in
    ``<torch hub dir>/checkpoints/<file name>``; the same file is kept here and then read as any local
    checkpoint (``weights_only=True``, its kind recognised), so a URL is only another way to give it.
    """
    from urllib.parse import urlparse

    name = os.path.basename(urlparse(url).path)
    if not name:
        raise CheckpointError(f"Checkpoint URL {url} names no file; give the address of a .ckpt file")
    target = Path(torch.hub.get_dir()) / "checkpoints" / name
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            torch.hub.download_url_to_file(url, str(target), progress=False)
        except OSError as err:
            raise CheckpointError(f"Checkpoint {url} could not be downloaded: {err}") from err
    return target


def read_checkpoint(
    path: str | os.PathLike[str] | IO[bytes], map_location: Any = "cpu", trusted: bool = False
) -> dict[str, Any]:
    """Load a geartrain or Lightning checkpoint with ``weights_only=True`` (Lightning's AttributeDict allowed).

    ``trusted`` (``load_from_checkpoint(weights_only=False)``, for files the user trusts): with
    ``weights_only=False``, every pickled object rebuilt, Lightning's ``AttributeDict`` as a plain dict.
    An ``http(s)://`` address is downloaded first (:func:`fetch_url`).
    """
    if is_url(path):
        path = fetch_url(str(path))
    where = path if isinstance(path, (str, os.PathLike)) else getattr(path, "name", "<stream>")
    if isinstance(path, (str, os.PathLike)):
        if Path(path).is_dir():
            return read_directory(path)  # its tensors stay in the shards: "sharded_directory" says where
        check_checkpoint_file(Path(path))
    try:  # the one torch.load of a checkpoint file
        if trusted:
            state = torch.load(path, map_location=map_location, weights_only=False, pickle_module=_TRUSTING_PICKLE)
        else:
            with torch.serialization.safe_globals(list(LIGHTNING_SAFE_GLOBALS)):
                state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        if trusted:
            raise CheckpointError(f"Cannot read checkpoint {where} (weights_only=False): {err}") from err
        if isinstance(path, (str, os.PathLike)):
            raise unreadable(Path(path), err) from err
        raise CheckpointError(f"Cannot read checkpoint {where} with weights_only=True: {first_reason(err)}") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"{where} holds a {type(state).__name__}, not a checkpoint dict")
    return state


class _LightningUnpickler(pickle.Unpickler):
    """Unpickles everything (``weights_only=False``), Lightning's ``AttributeDict`` as a plain dict,
    so a Lightning file loads whether or not Lightning is installed."""

    def find_class(self, module: str, name: str) -> Any:
        if any(f"{module}.{name}" == qualified for _, qualified in LIGHTNING_SAFE_GLOBALS):
            return dict
        return super().find_class(module, name)


#: The ``pickle_module`` handed to ``torch.load(weights_only=False)``.
_TRUSTING_PICKLE = types.ModuleType("geartrain_trusting_pickle")
_TRUSTING_PICKLE.Unpickler = _LightningUnpickler  # type: ignore[attr-defined]
_TRUSTING_PICKLE.load = pickle.load  # type: ignore[attr-defined]  # files in torch's legacy format


def complete_path(path: str | os.PathLike[str]) -> Path:
    """``path``, or the previous checkpoint a save moved aside when a kill came mid-rename.

    A replacement renames the old directory (or file) to ``.<name>.old`` and then the new one into
    place; a process killed between the two leaves no ``path`` but a complete ``.<name>.old``, which
    is what was there before the save, so that is the checkpoint to load.
    """
    path = Path(path)
    if path.exists():
        return path
    old = path.parent / f".{path.name}{SET_ASIDE}"
    return old if old.exists() else path


def read_directory(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A sharded checkpoint's trainer state, format-checked; ``"sharded_directory"`` names the tensors' place.

    ``"optimizer_states"`` holds one empty placeholder per saved optimizer (their tensors stay in the
    shards), so the resume checks count them as they count a file's.
    """
    path = Path(path)
    if not (path / METADATA).is_file():  # not a directory a sharded save wrote
        check_checkpoint_file(path)  # says what it is instead: missing, a plain directory, ...
    if not (path / TRAINER_STATE).is_file():
        raise CheckpointError(
            f"{path} is not a sharded geartrain checkpoint: it has no {TRAINER_STATE} (a directory written "
            "by torch.distributed.checkpoint alone holds no trainer state; load its weights with dcp.load)"
        )
    state = load_checkpoint(path / TRAINER_STATE)
    if "optimizer_types" in state:
        state["optimizer_states"] = [{} for _ in state["optimizer_types"]]
    state["sharded_directory"] = path
    return state


def check_checkpoint_file(path: Path) -> None:
    """Raise :class:`CheckpointError` naming why ``path`` cannot be read as a checkpoint file, if it cannot.

    ``Path.is_file()`` answers False for a missing file, a directory, a FIFO, a device and a symlink
    loop alike; a user needs to know which one it is.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise CheckpointError(f"Checkpoint {path} is a symbolic link loop; point it at a checkpoint file") from None
        if err.errno == errno.EACCES:
            raise CheckpointError(f"Checkpoint {path} cannot be opened: permission denied") from None
        why = "does not exist"
        if err.errno == errno.ENOTDIR:
            why += " (a part of its path is a file)"
        elif os.path.islink(path):
            why = f"is a symbolic link to {os.readlink(path)}, which does not exist"
        raise CheckpointNotFoundError(f"Checkpoint file not found: {path} {why}") from None
    if stat.S_ISDIR(mode):
        raise CheckpointError(
            f"Checkpoint {path} is a directory but not a sharded geartrain checkpoint (no .metadata from "
            "torch.distributed.checkpoint); give a .ckpt file or a sharded checkpoint's directory"
        )
    if not stat.S_ISREG(mode):
        kind = (
            "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket"
        )
        raise CheckpointError(f"Checkpoint {path} is {kind}, not a regular file; give a .ckpt file")


def first_reason(err: BaseException) -> str:
    """The line of torch's error that says what is wrong with the file, not its advice on ``weights_only``."""
    found = re.search(r"WeightsUnpickler error:\s*(\S.*)", str(err)) or re.search(r"(\S.{0,200})", str(err))
    reason = found.group(1).strip() if found else type(err).__name__
    # torch's advice on allow-listing the global (or on weights_only=False) is not geartrain's to give.
    return re.split(r"\s*(?:Please use `torch\.serialization|Re-running `torch\.load`)", reason)[0]


_SAFE_IMPORTS = ("torch.", "collections.OrderedDict", "builtins.")


class PickledObjectsError(CheckpointError):
    """A checkpoint that holds pickled Python objects, which ``weights_only=True`` refuses to rebuild."""


def unreadable(path: Path, err: Exception) -> CheckpointError:
    """The error for a file ``torch.load(weights_only=True)`` refused: pickled objects, or a damaged file."""
    imports = _unsafe_globals(path)
    if imports:
        return PickledObjectsError(
            f"Checkpoint {path} holds pickled Python objects ({', '.join(imports[:5])}), which could run "
            "code when loaded; refusing it (weights_only=True). geartrain checkpoints hold only tensors and "
            "plain containers."
        )
    return CheckpointError(
        f"Checkpoint {path} is not a readable torch file (truncated or corrupted?): {first_reason(err)}"
    )


def _unsafe_globals(path: Path) -> list[str]:
    """The globals a file names that ``weights_only`` loading refuses, read without unpickling; [] if unreadable.

    torch lists them for a ``torch.save`` zip file (its own unsafe names too, ``torch.hub.load``); a
    plain pickle, which torch does not inspect, is walked here, and the names outside torch's tensor
    machinery are the ones that made the safe loader refuse it, and what a malicious file would call.
    """
    import pickletools
    import zipfile

    try:
        if zipfile.is_zipfile(path):
            return list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        names: list[str] = []
        strings: list[str] = []
        for opcode, arg, _ in pickletools.genops(path.read_bytes()):
            if opcode.name == "GLOBAL":
                names.append(str(arg).replace(" ", "."))
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                names.append(".".join(strings[-2:]))
            elif isinstance(arg, str):
                strings.append(arg)
    except Exception:
        return []
    return [n for n in dict.fromkeys(names) if not n.startswith(_SAFE_IMPORTS)]
