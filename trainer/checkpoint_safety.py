"""Reading checkpoints safely: what to say when ``torch.load(weights_only=True)`` refuses a file.

A refused file either holds pickled Python objects (named, never run) or is damaged; torch's own
message adds advice to retry with ``weights_only=False``, which geartrain never gives.
"""

from __future__ import annotations

import re
from pathlib import Path

from trainer.common.errors import CheckpointError

__all__ = ["first_reason", "unreadable"]


def first_reason(err: BaseException) -> str:
    """The line of torch's error that says what is wrong with the file, not its advice on ``weights_only``."""
    found = re.search(r"WeightsUnpickler error:\s*(\S.*)", str(err)) or re.search(r"(\S.{0,200})", str(err))
    return found.group(1).strip() if found else type(err).__name__


_SAFE_IMPORTS = ("torch.", "collections.OrderedDict", "builtins.")


def unreadable(path: Path, err: Exception) -> CheckpointError:
    """The error for a file ``torch.load(weights_only=True)`` refused: pickled objects, or a damaged file."""
    imports = _pickled_imports(path)
    if imports:
        return CheckpointError(
            f"Checkpoint {path} holds pickled Python objects ({', '.join(imports[:5])}), which could run "
            "code when loaded; refusing it. geartrain checkpoints hold only tensors and plain containers."
        )
    return CheckpointError(
        f"Checkpoint {path} is not a readable torch file (truncated or corrupted?): {first_reason(err)}"
    )


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
