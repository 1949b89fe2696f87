"""Checkpoints: the one room that owns checkpoint files, a file per job.

| file | what it does |
|---|---|
| :mod:`~trainer.checkpoint.format` | the format: keys, versions, Lightning's layout, the names on disk (``.partial``, ``.old``, links) |
| :mod:`~trainer.checkpoint.reader` | the one reader: a file, a sharded directory, a Lightning file, plain weights; why a file is refused |
| :mod:`~trainer.checkpoint.files` | the one writer: atomic, asynchronous, extra names as links, superseded files removed last |
| :mod:`~trainer.checkpoint.resolve` | the one resolver: which checkpoint ``"last"``/``"best"`` mean, for the ``Trainer`` and the ``geartrain`` command |
| :mod:`~trainer.checkpoint.connector` | a run's checkpoint: its content, saving, restoring, where ``last.ckpt`` lives |
| :mod:`~trainer.checkpoint.resume_checks` | whether a checkpoint can resume this run |
| :mod:`~trainer.checkpoint.resume_point` | where a fit that stopped inside an epoch stood |
| :mod:`~trainer.checkpoint.plugin_io` | Lightning's ``CheckpointIO`` plugins over the writer and the reader |
| :mod:`~trainer.checkpoint.convert` | ``python -m trainer.checkpoint.convert``: a directory to one file and back |
| :mod:`~trainer.checkpoint.lightning_format` | ``load_from_checkpoint`` |

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
