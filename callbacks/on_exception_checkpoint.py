"""``OnExceptionCheckpoint``: save a checkpoint when a run raises, as Lightning's callback of that name."""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from callbacks.base import Checkpoint

if TYPE_CHECKING:
    from trainer.trainer import Trainer

__all__ = ["OnExceptionCheckpoint"]


class OnExceptionCheckpoint(Checkpoint):
    """Save ``<dirpath>/<filename>.ckpt`` when fitting (or another stage) raises; remove it when a run ends well.

    In one process the file is a full checkpoint (``trainer.save_checkpoint``: resume with
    ``ckpt_path=``). Under several processes the rank(s) that raised write it alone: a collective
    (gathering every rank's random state or optimizer shards) would wait forever for ranks that are
    still inside the step, so the file holds the weights, counters and hyperparameters (a
    ``save_weights_only`` checkpoint) of the rank that raised; with DDP every rank holds the same
    weights. An exception inside an accumulation window (one process) drops the window's gradients and
    saves the state at the window's first batch, with a warning: the file resumes exactly by training
    the window again (Lightning's file resumes after the lost gradients).
    A signal that ends a run is not an exception here: preemption saves ``last.ckpt``.

    Args:
        dirpath: folder of the checkpoint (given up front: an exception may come before any setup).
        filename: the file's name without the extension.

    >>> OnExceptionCheckpoint("ckpts").ckpt_path
    'ckpts/on_exception.ckpt'
    """

    FILE_EXTENSION = ".ckpt"

    def __init__(self, dirpath: str | os.PathLike[str], filename: str = "on_exception") -> None:
        super().__init__()
        if not filename:
            raise ValueError("OnExceptionCheckpoint(filename=''): the filename cannot be empty, e.g. 'on_exception'")
        self.dirpath = dirpath
        self.filename = filename
        self._raised = False

    @property
    def ckpt_path(self) -> str:
        """Where the checkpoint is written."""
        return os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION)

    @override
    def setup(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        self._raised = False

    @override
    def on_exception(self, trainer: Trainer, pl_module: Any, exception: BaseException) -> None:
        self._raised = True
        if trainer.world_size == 1:
            if trainer.checkpointing.in_accumulation_window:
                start = trainer.checkpointing.rewind_open_window()
                warnings.warn(
                    f"OnExceptionCheckpoint: {type(exception).__name__} raised inside an accumulation window; its "
                    f"gradients are dropped and {self.ckpt_path} resumes at its first batch ({start})",
                    UserWarning,
                    stacklevel=2,
                )
            trainer.save_checkpoint(self.ckpt_path)
            return
        # No collective under DDP: this rank's weights and counters, written atomically by the trainer's
        # writer (a temporary file renamed over the name, so two ranks that both raised never mix).
        trainer.checkpointing.write(trainer.checkpointing.state(weights_only=True), self.ckpt_path)

    @override
    def teardown(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        # As Lightning: a run that ended well leaves no exception checkpoint (an older one would mislead).
        # Teardown also runs after an exception here, so the file just written stays then.
        if not self._raised and trainer.is_global_zero:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.ckpt_path)
