"""Reading checkpoints safely: what to say when ``torch.load(weights_only=True)`` refuses a file.

A refused file either holds pickled Python objects (named, never run) or is damaged; torch's own
message adds advice to retry with ``weights_only=False``, which geartrain never gives.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
from pathlib import Path

from trainer.common.errors import CheckpointError

__all__ = ["check_checkpoint_file", "first_reason", "unreadable", "write_failure"]


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
        if err.errno == errno.ENOTDIR:
            raise CheckpointError(f"Checkpoint {path} does not exist (a part of its path is a file)") from None
        if os.path.islink(path):
            raise CheckpointError(
                f"Checkpoint {path} is a symbolic link to {os.readlink(path)}, which does not exist"
            ) from None
        raise CheckpointError(f"Checkpoint {path} does not exist") from None
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


def write_failure(path: Path, err: BaseException) -> str:
    """What stopped writing ``path``: the disk's own reason where the chain of errors holds one.

    torch reports a write the disk refused as ``enforce fail at inline_container.cc ... unexpected
    pos``; the ``OSError`` underneath (or the free space left) says what happened.
    """
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"the disk is full ({os.strerror(seen.errno)}){_free_space(path)}"
        if isinstance(seen, OSError) and seen.errno is not None:
            return f"{os.strerror(seen.errno)} ({seen})"
        seen = seen.__cause__ or seen.__context__
    if "unexpected pos" in str(err) or "inline_container" in str(err):
        free = _free_bytes(path)
        if free is not None and free < 1 << 20:
            return f"the disk is full{_free_space(path)}"
        return f"the file could not be written completely (torch: {first_reason(err)}){_free_space(path)}"
    return str(err)


def _free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path.parent).free
    except OSError:
        return None


def _free_space(path: Path) -> str:
    free = _free_bytes(path)
    return "" if free is None else f"; {free / 2**20:.1f} MiB free in {path.parent}"


def first_reason(err: BaseException) -> str:
    """The line of torch's error that says what is wrong with the file, not its advice on ``weights_only``."""
    found = re.search(r"WeightsUnpickler error:\s*(\S.*)", str(err)) or re.search(r"(\S.{0,200})", str(err))
    reason = found.group(1).strip() if found else type(err).__name__
    # torch's advice on allow-listing the global (or on weights_only=False) is not geartrain's to give.
    return re.split(r"\s*(?:Please use `torch\.serialization|Re-running `torch\.load`)", reason)[0]


_SAFE_IMPORTS = ("torch.", "collections.OrderedDict", "builtins.")


def unreadable(path: Path, err: Exception) -> CheckpointError:
    """The error for a file ``torch.load(weights_only=True)`` refused: pickled objects, or a damaged file."""
    imports = _unsafe_globals(path)
    if imports:
        return CheckpointError(
            f"Checkpoint {path} holds pickled Python objects ({', '.join(imports[:5])}), which could run "
            "code when loaded; refusing it. geartrain checkpoints hold only tensors and plain containers."
        )
    return CheckpointError(
        f"Checkpoint {path} is not a readable torch file (truncated or corrupted?): {first_reason(err)}"
    )


def _unsafe_globals(path: Path) -> list[str]:
    """The globals a file names that ``weights_only`` loading refuses, read without unpickling."""
    import torch

    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception:
        return _pickled_imports(path)


def _pickled_imports(path: Path) -> list[str]:
    """Python names a pickle (or torch zip file) would import, read without unpickling; [] if unreadable.

    Only names outside torch's tensor machinery are returned: those are what made the safe loader
    refuse the file, and what a malicious file would call.
    """
    import pickletools
    import zipfile

    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                members = [n for n in archive.namelist() if n.endswith("data.pkl")]
                data = archive.read(members[0]) if members else b""
        else:
            data = path.read_bytes()
        names: list[str] = []
        strings: list[str] = []
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name == "GLOBAL":
                names.append(str(arg).replace(" ", "."))
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                names.append(".".join(strings[-2:]))
            elif isinstance(arg, str):
                strings.append(arg)
    except Exception:
        return []
    return [n for n in dict.fromkeys(names) if not n.startswith(_SAFE_IMPORTS)]
