"""Checkpoints: the one room that owns checkpoint files, a file per job (docs/architecture.md's file
table says which). The names users catch or call are importable from here.
"""

from __future__ import annotations

from trainer.checkpoint.files import (
    AsyncCheckpointWriter,
    CheckpointError,
    load_checkpoint,
    write_checkpoint,
)

__all__ = ["AsyncCheckpointWriter", "CheckpointError", "load_checkpoint", "write_checkpoint"]
