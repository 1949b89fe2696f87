"""Lightning's checkpoint IO plugins over geartrain's own writing and reading.

``TorchCheckpointIO`` is what geartrain does anyway; ``AsyncCheckpointIO`` writes another IO's files in
a thread. A :class:`CheckpointIO` of the user's own (``Trainer(plugins=[MyIO()])``, or a strategy's
``checkpoint_io=``) writes, reads and removes the run's checkpoint files instead of geartrain
(:func:`save_with`); what it writes is then its business (atomicity included).
"""

from __future__ import annotations

import abc
import os
from typing import Any

from trainer.checkpoint import files

__all__ = [
    "DEFAULT_IO_TYPES",
    "AsyncCheckpointIO",
    "CheckpointIO",
    "TorchCheckpointIO",
    "is_default_io",
    "save_with",
]

_INTERFACE = ("save_checkpoint", "load_checkpoint", "remove_checkpoint")


class CheckpointIO(metaclass=abc.ABCMeta):
    """Lightning's ``CheckpointIO``: how checkpoint files are written, read and removed.

    ``isinstance(obj, CheckpointIO)`` holds for Lightning's own IO objects too (any object with
    ``save_checkpoint``, ``load_checkpoint`` and ``remove_checkpoint``).
    """

    @classmethod
    def __subclasshook__(cls, other: type) -> bool:
        if cls is not CheckpointIO:
            return NotImplemented
        return all(any(name in vars(base) for base in other.__mro__) for name in _INTERFACE)

    @abc.abstractmethod
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        """Write ``checkpoint`` to ``path``."""

    @abc.abstractmethod
    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """Read the checkpoint at ``path``."""

    @abc.abstractmethod
    def remove_checkpoint(self, path: Any) -> None:
        """Delete the checkpoint at ``path``."""

    def teardown(self) -> None:  # noqa: B027 (a default that does nothing)
        """Release what the IO holds at the end of a run (nothing by default)."""


class TorchCheckpointIO(CheckpointIO):
    """geartrain's own IO: atomic writes, ``weights_only=True`` reads, only our own files removed."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(
                f"TorchCheckpointIO.save_checkpoint takes no storage_options (got {storage_options!r}): "
                "it writes a local file; give a CheckpointIO of your own for other storage"
            )
        files.write_checkpoint(checkpoint, path)  # atomic; its folder made if missing

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """Read ``path`` with ``torch.load(weights_only=True)``; ``weights_only=False`` is refused (not safe)."""
        if weights_only is False:
            raise ValueError(
                "TorchCheckpointIO.load_checkpoint(weights_only=False): geartrain reads checkpoints with "
                "weights_only=True only; load a file you trust with torch.load yourself"
            )
        from trainer.checkpoint.reader import read_checkpoint

        return read_checkpoint(path, map_location if map_location is not None else "cpu")

    def remove_checkpoint(self, path: Any) -> None:
        files.remove_checkpoint(path)


class _WrappingCheckpointIO(CheckpointIO):
    """An IO that hands the work to another one (:attr:`checkpoint_io`), set now or by the strategy later."""

    def __init__(self, checkpoint_io: CheckpointIO | None = None) -> None:
        self._checkpoint_io = checkpoint_io
        self._base_checkpoint_io_configured: bool = checkpoint_io is not None and (
            not isinstance(checkpoint_io, _WrappingCheckpointIO) or checkpoint_io._base_checkpoint_io_configured
        )

    @property
    def checkpoint_io(self) -> CheckpointIO | None:
        """The IO this one hands its work to."""
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, checkpoint_io: CheckpointIO) -> None:
        if self._checkpoint_io is None:
            self._checkpoint_io, self._base_checkpoint_io_configured = checkpoint_io, True
        elif isinstance(self._checkpoint_io, _WrappingCheckpointIO) and not self._base_checkpoint_io_configured:
            self._checkpoint_io.checkpoint_io = checkpoint_io
            self._base_checkpoint_io_configured = True

    def _base(self) -> CheckpointIO:
        if self._checkpoint_io is None:
            self._checkpoint_io, self._base_checkpoint_io_configured = TorchCheckpointIO(), True
        return self._checkpoint_io

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        self._base().save_checkpoint(checkpoint, path, storage_options)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        return self._base().load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path: Any) -> None:
        self._base().remove_checkpoint(path)


class AsyncCheckpointIO(_WrappingCheckpointIO):
    """Lightning's ``AsyncCheckpointIO``: the state copied into CPU memory in the caller, written in a thread.

    The thread is the writer's (:class:`~trainer.checkpoint.files.AsyncCheckpointWriter`, which keeps
    saves in order and re-raises a failure); :meth:`teardown`, at the end of every run, waits for the last.
    """

    def __init__(self, checkpoint_io: CheckpointIO | None = None) -> None:
        super().__init__(checkpoint_io)
        self._writer: files.AsyncCheckpointWriter | None = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if self._writer is None:
            self._writer = files.AsyncCheckpointWriter()
        # Fresh memory, not the writer's reused buffers: the wrapped IO may keep what it was given.
        snapshot = files.snapshot_state(checkpoint)
        base = self._base()
        self._writer.run(lambda: base.save_checkpoint(snapshot, path, storage_options))

    def remove_checkpoint(self, path: Any) -> None:
        self.wait()  # the file to remove may still be being written
        super().remove_checkpoint(path)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        self.wait()
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def wait(self) -> None:
        """Block until every write is done; re-raise a failed write's error."""
        if self._writer is not None:
            self._writer.wait()

    def teardown(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()


#: The types of ``strategy.checkpoint_io`` that mean geartrain's own writing and reading: no IO, or a plain
#: ``TorchCheckpointIO`` (a subclass is the user's).
DEFAULT_IO_TYPES: tuple[type, ...] = (type(None), TorchCheckpointIO)


def is_default_io(io: Any) -> bool:
    """Whether ``io`` is geartrain's own (:data:`DEFAULT_IO_TYPES`): the connector then writes and reads as it
    always does (links for ``last.ckpt``, asynchronous writes, sharded directories), else through the IO."""
    return type(io) in DEFAULT_IO_TYPES


def save_with(
    trainer: Any, state: dict[str, Any], path: Any, also_at: Any, replaces: Any, storage_options: Any = None
) -> None:
    """A save through the user's IO (``trainer.strategy.checkpoint_io``), on rank 0, then a barrier: ``state``
    written at ``path`` and at each ``also_at`` path (the ``last`` copy), then each file in ``replaces``
    removed through it, as Lightning's callbacks do."""
    io = trainer.strategy.checkpoint_io
    # Lightning's IO classes of two arguments are called as Lightning calls them: storage_options only if given.
    options = {} if storage_options is None else {"storage_options": storage_options}
    if trainer.is_global_zero:
        for target in (path, *also_at):
            io.save_checkpoint(state, os.fspath(target), **options)
        for old in replaces:
            io.remove_checkpoint(os.fspath(old))
    trainer.strategy.barrier("save_checkpoint")
