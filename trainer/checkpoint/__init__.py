"""Checkpoints: the one room that writes, reads and checks them.

| file | what it does |
|---|---|
| :mod:`~trainer.checkpoint.connector` | a run's checkpoint: its content, saving, restoring, ``"last"``/``"best"``, where ``last.ckpt`` lives |
| :mod:`~trainer.checkpoint.files` | checkpoint files: atomic and asynchronous writes, safe loads |
| :mod:`~trainer.checkpoint.reader` | the one reader: a directory, or a file read once and recognised once |
| :mod:`~trainer.checkpoint.layout` | the file's layout: Lightning's keys beside ours, and reading older versions |
| :mod:`~trainer.checkpoint.safety` | what to say when ``torch.load(weights_only=True)`` refuses a file |
| :mod:`~trainer.checkpoint.resume_checks` | whether a checkpoint can resume this run |
| :mod:`~trainer.checkpoint.sharded` | sharded checkpoint directories on the trainer's side |
| :mod:`~trainer.checkpoint.convert` | ``python -m trainer.checkpoint.convert``: a directory to one file and back |
| :mod:`~trainer.checkpoint.lightning_format` | ``load_from_checkpoint`` and files written by Lightning 2.x |

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
