"""Checkpoints: the one room that owns checkpoint files, a file per job.

The format (:mod:`~trainer.checkpoint.format`), the one reader (``reader``), the one writer
(``files``; ``sharded`` and ``sharded_safety`` for directories), which file ``"last"``/``"best"``
mean (``resolve``), a run's content and its restore (``connector``, ``resume``), Lightning's IO
plugins (``plugin_io``), the converter (``convert``) and ``load_from_checkpoint``
(``lightning_format``); docs/architecture.md's file table says more.
The names users catch or call are importable from here.
"""

from __future__ import annotations

from trainer.checkpoint.files import (
    AsyncCheckpointWriter,
    CheckpointError,
    load_checkpoint,
    write_checkpoint,
)

__all__ = ["AsyncCheckpointWriter", "CheckpointError", "load_checkpoint", "write_checkpoint"]
