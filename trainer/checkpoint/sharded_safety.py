"""Reading sharded checkpoints safely: DCP's metadata and its values, never unpickled freely.

``torch.distributed.checkpoint`` unpickles ``.metadata`` with plain ``pickle`` and its default load
planner reads non-tensor values with ``torch.load(weights_only=False)``: a crafted directory would
run code. Here the metadata goes through an unpickler that admits only DCP's own metadata classes
and torch's dtypes, layouts and sizes, every value through ``torch.load(weights_only=True)`` (the
trainer state file is read by the trainer's reader), and DCP's wrapped errors become one :class:`CheckpointError`
that names the file and the refused name.
"""

from __future__ import annotations

import collections
import io
import os
import pathlib
import pickle
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoint.format import METADATA
from trainer.checkpoint.reader import first_reason
from trainer.common.errors import CheckpointError

__all__ = ["checkpoint_error", "dcp_failures", "read_sharded_metadata", "safe_planner", "safe_reader"]


def dcp_failures() -> tuple[type[BaseException], ...]:
    """What a DCP call raises for a failure on any rank: its ``CheckpointException`` is a BaseException."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


def checkpoint_error(err: BaseException, what: str) -> CheckpointError:
    """A :class:`CheckpointError` for a failed DCP call: the first rank's own refusal where there is one.

    DCP wraps every rank's exception (ours included) as ``(exception, traceback summary)`` in its
    ``CheckpointException``, whose message is the whole traceback; the refusal a rank raised says
    more, so it is passed on as it is, and any other error is named with the file it concerns.
    """
    failures = getattr(err, "failures", None)
    if not isinstance(failures, dict):
        return err if isinstance(err, CheckpointError) else CheckpointError(f"{what}: {_one_line(err)}")
    unwrapped = {rank: failure for rank, (failure, _traceback_summary) in failures.items()}
    for failure in unwrapped.values():
        for refusal in (failure, failure.__cause__):
            if isinstance(refusal, CheckpointError):
                return refusal
    return CheckpointError(f"{what}: " + "; ".join(f"rank {r}: {_one_line(e)}" for r, e in sorted(unwrapped.items())))


def _one_line(err: BaseException) -> str:
    """``err`` in one line: an OS error as its reason and the file it concerns, else its first line."""
    if isinstance(err, OSError) and err.errno is not None:
        where = f": {err.filename}" if err.filename else ""
        return f"{os.strerror(err.errno)}{where}"
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


# The classes DCP's ``.metadata`` pickle may name: its own plain data classes, and torch's sizes,
# dtypes, layouts and memory formats. Anything else (os.system, ...) is refused, never called.
_METADATA_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint._extension",
    "torch.distributed.checkpoint.planner",
)


class _RefusedClass(pickle.UnpicklingError):
    """A class the metadata's pickle names that :class:`_MetadataUnpickler` does not admit (``module.name``)."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _METADATA_MODULES:
            obj = getattr(__import__(module, fromlist=[name]), name, None)
            if isinstance(obj, type) and obj.__module__ == module:  # defined there, not imported
                return obj
        if (module, name) == ("torch.serialization", "_get_layout"):  # torch's weights_only loader admits it
            return torch.serialization._get_layout
        if module == "torch":
            obj = getattr(torch, name, None)
            if obj is torch.Size or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
                return obj
        if module == "pathlib" and name in ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"):
            return getattr(pathlib, name)  # the checkpoint id DCP records; making a path runs nothing
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise _RefusedClass(f"{module}.{name}")


def read_sharded_metadata(path: str | os.PathLike[str]) -> Any:
    """DCP's ``.metadata`` of ``path``, unpickled admitting only DCP's metadata classes and torch's dtypes.

    Every storage file it names must lie inside ``path``: a crafted entry pointing at
    ``../elsewhere`` is refused here, before DCP reads a byte.
    """
    file = Path(path) / METADATA
    try:
        with open(file, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except FileNotFoundError as err:
        raise CheckpointError(f"{path} is not a sharded checkpoint: it has no {METADATA}") from err
    except EOFError as err:
        raise CheckpointError(
            f"Checkpoint {file} is truncated (it ends before its content does); the save that wrote it did not "
            "finish. Use an earlier checkpoint"
        ) from err
    except _RefusedClass as err:
        raise CheckpointError(
            f"Checkpoint {file} holds pickled Python objects ({err}), which could run code when loaded; "
            "refusing it. A sharded checkpoint's metadata holds only torch.distributed.checkpoint's own classes."
        ) from err
    except Exception as err:  # pickle's UnpicklingError, or what a damaged pickle makes the unpickler raise
        raise CheckpointError(f"Checkpoint {file} is damaged or not readable (truncated or corrupted?): {err}") from err
    _check_storage_paths(Path(path), metadata)
    return metadata


def _check_storage_paths(path: Path, metadata: Any) -> None:
    """Refuse storage entries whose file lies outside the checkpoint directory (``../``, absolute paths)."""
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(storage, dict):
        return
    root = path.resolve()
    for info in storage.values():
        relative = getattr(info, "relative_path", None)
        if not isinstance(relative, str):
            raise CheckpointError(f"Checkpoint {path / METADATA} names a storage file that is not a path: {relative!r}")
        where = (root / relative).resolve()
        if root not in where.parents:
            raise CheckpointError(
                f"Checkpoint {path / METADATA} names the storage file {relative!r}, outside {path}; refusing it "
                "(a sharded checkpoint reads only files inside its own directory)"
            )


def safe_reader(path: str | os.PathLike[str]) -> Any:
    """DCP's file reader for ``path``, reading ``.metadata`` with :func:`read_sharded_metadata`."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            metadata = read_sharded_metadata(self.path)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(path)


def safe_planner(base: type[Any] | None = None) -> Any:
    """A DCP load planner (``base``, default ``DefaultLoadPlanner``) reading values with ``weights_only=True``.

    The values are what DCP saves as small ``torch.save`` blobs: non-tensors, such as an optimizer's betas.
    """
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._nested_dict import set_element
    from torch.distributed.checkpoint.planner import ReadItem

    class SafePlanner(base or DefaultLoadPlanner):  # type: ignore[misc]
        def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
            fqn = read_item.dest_index.fqn
            try:
                obj = torch.load(value, weights_only=True)
            except Exception as err:
                raise CheckpointError(
                    f"The value {fqn!r} of a sharded checkpoint cannot be read with weights_only=True, "
                    f"refusing it: {first_reason(err)}"
                ) from err
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], obj)
            else:
                self.state_dict[fqn] = obj

    return SafePlanner()
