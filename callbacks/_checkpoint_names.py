"""File names of ``ModelCheckpoint`` as Lightning's: its class attributes, templates, versions, the last file.

A mixin of :class:`~callbacks.ModelCheckpoint` (which holds the state these methods read): users
override ``CHECKPOINT_NAME_LAST``, ``FILE_EXTENSION``, ``CHECKPOINT_JOIN_CHAR`` and
``CHECKPOINT_EQUALS_CHAR`` on a subclass, as in Lightning, and every name follows them.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from callbacks._checkpoint_files import fill_template, free_path, rank_key

if TYPE_CHECKING:
    from callbacks._monitor import Monitor
    from trainer.trainer import Trainer

__all__ = ["CheckpointNaming"]


class CheckpointNaming:
    """Lightning's naming of checkpoint files, for :class:`~callbacks.ModelCheckpoint`."""

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    STARTING_VERSION = 1

    dirpath: str | None
    filename: str
    monitor: str | None
    mode: str
    auto_insert_metric_name: bool
    enable_version_counter: bool
    _best_k: dict[str, float]
    _monitor: Monitor | None
    _written: set[str]
    last_model_path: str

    def _find_last_checkpoints(self, trainer: Trainer) -> set[str]:
        """The last files ``ckpt_path="last"`` may mean (Lightning's method): ``last.ckpt``,
        ``last-v1.ckpt``, ... in ``dirpath``, this run's folder only; the trainer's resolver finds them."""
        found: set[str] = trainer.checkpointing.last_files(self.dirpath, self.CHECKPOINT_NAME_LAST, self.FILE_EXTENSION)
        return found

    def format_filename(self, metrics: dict[str, Any]) -> str:
        """Fill ``filename`` from ``metrics`` (a missing metric is written as ``nan``).

        With ``auto_insert_metric_name=False`` a field gives its value only (``"{epoch}"`` -> ``3``).
        """
        return self._fill(self.filename, metrics) + self.FILE_EXTENSION

    def format_checkpoint_name(
        self, metrics: dict[str, Any], filename: str | None = None, ver: int | None = None, prefix: str = ""
    ) -> str:
        """Lightning's name for :meth:`format_filename`, as a path in ``dirpath`` (``-v<ver>`` appended if given)."""
        name = self._fill(filename or self.filename, metrics)
        name = f"{prefix}{self.CHECKPOINT_JOIN_CHAR}{name}" if prefix else name
        name += f"{self.CHECKPOINT_JOIN_CHAR}v{ver}" if ver is not None else ""
        return str(Path(self.dirpath or ".") / (name + self.FILE_EXTENSION))

    def _rank_key(self, score: float) -> float:
        """Scores as ``min`` ranks them; NaN counts as the worst possible."""
        return rank_key(score, self.mode)

    def _free_path(self, path: str, reuse: Sequence[str] = ()) -> str:
        """``path``, or with ``-v1``, ``-v2``, ... when a file (or a kept checkpoint) has that name already.

        ``reuse``: the files this save evicts; met on the way, such a name is taken (Lightning's counter).
        """
        if not self.enable_version_counter:
            return path

        def taken(p: str) -> bool:
            return p not in reuse and (p in self._best_k or os.path.exists(p))

        return free_path(path, taken, self.STARTING_VERSION, self.CHECKPOINT_JOIN_CHAR)

    def _read_monitor(self, trainer: Trainer) -> Any:
        """The monitored value: ``epoch`` and ``step`` are the trainer's unless logged, as in Lightning."""
        if self._monitor is not None:
            return self._monitor.read(trainer)
        logged = trainer.callback_metrics.get(str(self.monitor))
        if logged is not None:
            return int(logged)
        return trainer.current_epoch if self.monitor == "epoch" else trainer.global_step

    def _last_path(self, trainer: Trainer) -> str:
        """Where ``save_last`` writes: ``CHECKPOINT_NAME_LAST`` (a template too) + ``FILE_EXTENSION`` in ``dirpath``.

        ``last.ckpt`` by default, the file ``ckpt_path="last"`` resumes from; each save replaces this
        run's last file (atomically). A file already there that this run did not write (a user's
        own ``last.ckpt``, another run's) is kept, as Lightning keeps it: this run's is
        ``last-v1.ckpt`` (the first free version), said once. Rank 0 looks, every rank follows.
        """
        if self.CHECKPOINT_NAME_LAST == "last" and self.FILE_EXTENSION == ".ckpt":
            path = str(trainer.checkpointing.last_path(self.dirpath))
        else:
            metrics = {**trainer.callback_metrics, "epoch": trainer.current_epoch, "step": trainer.global_step}
            name = self._fill(self.CHECKPOINT_NAME_LAST, metrics)
            path = str(Path(self.dirpath or ".") / (name + self.FILE_EXTENSION))
        if not self.enable_version_counter or path in (self.last_model_path, *self._written):
            return path
        stem = os.path.splitext(path)[0]
        if os.path.dirname(self.last_model_path) == os.path.dirname(path) and self.last_model_path.startswith(
            f"{stem}{self.CHECKPOINT_JOIN_CHAR}v"
        ):
            return self.last_model_path  # already moved past another's file by an earlier save

        def taken(p: str) -> bool:
            return p not in self._written and os.path.lexists(p)

        free = free_path(path, taken, self.STARTING_VERSION, self.CHECKPOINT_JOIN_CHAR)
        if trainer.world_size > 1:
            free = trainer.strategy.broadcast(free)  # rank 0's view of the folder holds everywhere
        if free != path and trainer.is_global_zero:
            warnings.warn(
                f"ModelCheckpoint: {path} was not written by this run; it is kept, and this run's last "
                f"checkpoint is {free} (as Lightning). Resume this run with ckpt_path={free!r} or "
                f'ckpt_path="last" (the newest last file of {self.dirpath})',
                UserWarning,
                stacklevel=3,
            )
        return free

    def _fill(self, template: str, metrics: dict[str, Any]) -> str:
        return fill_template(template, metrics, self.auto_insert_metric_name, self.CHECKPOINT_EQUALS_CHAR)

    def to_yaml(self, filepath: str | os.PathLike[str] | None = None) -> None:
        """Write ``best_k_models`` (path: score) as YAML, by default to ``<dirpath>/best_k_models.yaml``."""
        import yaml

        if filepath is None:
            assert self.dirpath, "to_yaml() needs a filepath before the dirpath is known (setup)"
            filepath = os.path.join(self.dirpath, "best_k_models.yaml")
        with open(filepath, "w") as f:
            yaml.dump({path: float(score) for path, score in self._best_k.items()}, f)
