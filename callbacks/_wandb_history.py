"""Reading what a W&B run already holds: wandb's local transaction log and the logger's own journal.

``WandbLogger`` reads these when a fit resumes into an existing run, to know the last step each
metric reached (see ``WandbLogger._last_steps``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["STEP_KEY", "history_rows", "last_steps_in", "whole_lines"]

#: The x-axis of every metric, as Lightning names it.
STEP_KEY = "trainer/global_step"


def whole_lines(path: Path) -> list[str]:
    """The complete lines of ``path`` (a line cut short by a crash is left out)."""
    text = path.read_text()
    return text.splitlines()[: text.count("\n")]


def last_steps_in(files: list[Path]) -> dict[str, int]:
    """Metric key -> the last ``trainer/global_step`` at which ``files`` hold it."""
    last: dict[str, int] = {}
    for path in files:
        if not path.is_file():
            continue
        for row in history_rows(path):
            step = row.get(STEP_KEY)
            if isinstance(step, (int, float)):
                for key in row:
                    if not key.startswith("_") and key != STEP_KEY:
                        last[key] = max(last.get(key, -1), int(step))
    return last


def history_rows(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The history rows of a run's ``.wandb`` file, in order, each ``{key: value}``.

    The file is wandb's transaction log: LevelDB's log format (32 KiB blocks of records framed by a
    7-byte header: checksum, length, kind) after a 7-byte file header; each record is one of wandb's
    own protobuf ``Record`` messages. wandb 0.2x and later write it from their Go core and ship no
    Python reader, hence this one; a record cut short by a crash ends the scan.
    """
    from wandb.proto import wandb_internal_pb2

    for data in _log_records(Path(path).read_bytes()):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            yield {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}


_BLOCK, _HEADER = 32768, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _log_records(raw: bytes) -> Iterator[bytes]:
    if raw[:4] != b":W&B":
        raise ValueError("not a wandb transaction log (no :W&B header)")
    pos, parts = _HEADER, bytearray()
    while pos + _HEADER <= len(raw):
        room = _BLOCK - pos % _BLOCK
        if room < _HEADER:  # a block's tail too short for a header is padding
            pos += room
            continue
        length, kind = int.from_bytes(raw[pos + 4 : pos + 6], "little"), raw[pos + 6]
        start, pos = pos + _HEADER, pos + _HEADER + length
        if kind == 0 or pos > len(raw):  # padding, or a record the writer never finished
            if kind == 0:
                pos = start - _HEADER + room
                continue
            return
        if kind in (_FULL, _FIRST):
            parts = bytearray()
        parts += raw[start:pos]
        if kind in (_FULL, _LAST):
            yield bytes(parts)
