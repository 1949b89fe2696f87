"""``ModelCheckpoint``'s files as Lightning names and ranks them: templates, ``-vN`` versions, the last file,
the top k and its scores (Lightning's attributes), which files a save may delete.

The base of :class:`~callbacks.ModelCheckpoint` (which holds the options these methods read): users
override ``CHECKPOINT_NAME_LAST``, ``FILE_EXTENSION``, ``CHECKPOINT_JOIN_CHAR`` and
``CHECKPOINT_EQUALS_CHAR`` on a subclass, as in Lightning, and every name follows them. Beside it,
Lightning's default folder. How the files reach the disk (and the ``last`` link) is the trainer's
checkpoint room's.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from callbacks._checkpoint_schedule import SaveSchedule

if TYPE_CHECKING:
    from trainer.trainer import Trainer

__all__ = ["CheckpointNaming", "default_dirpath", "score_of"]

_FIELD = re.compile(r"\{([^{}:]+)(:[^{}]*)?\}")


def default_dirpath(trainer: Trainer) -> str:
    """Lightning's default folder: ``<save_dir>/<name>/<version>/checkpoints`` of the first logger
    (``version_N`` for a number), else ``<default_root_dir>/checkpoints``: each run its own folder."""
    if not trainer.loggers:
        return str(trainer.checkpointing.default_directory())
    logger: Any = trainer.loggers[0]  # a logger callback: name, version, save_dir
    save_dir = getattr(logger, "save_dir", None) or trainer.default_root_dir
    version = logger.version
    version = version if isinstance(version, str) else f"version_{version}"
    return os.path.join(save_dir, str(logger.name), version, "checkpoints")


def score_of(value: float | torch.Tensor) -> float:
    """A score as a Python number of the monitored value's kind: an integer (``step``) stays an int, so
    its tensor is an integer one and trackers store ``3``, as Lightning's scores (tensors as logged) do."""
    number = value.item() if isinstance(value, torch.Tensor) else value
    return number if isinstance(number, int) and not isinstance(number, bool) else float(number)


class _Score:
    """One of Lightning's score attributes: a number kept in ``_<name>`` (:func:`score_of`), handed out
    as a 0-d tensor (a metric compares as it was logged); a float or tensor may be assigned, ``None`` for none yet."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc
        self._attr = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._attr = f"_{name}"

    def __get__(self, checkpoint: object, owner: type | None = None) -> Any:
        if checkpoint is None:
            return self
        value = getattr(checkpoint, self._attr)
        return None if value is None else torch.tensor(value)

    def __set__(self, checkpoint: object, value: float | torch.Tensor | None) -> None:
        setattr(checkpoint, self._attr, None if value is None else score_of(value))


class CheckpointNaming(SaveSchedule):
    """Lightning's naming and ranking of checkpoint files, for :class:`~callbacks.ModelCheckpoint` (on its schedule)."""

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    STARTING_VERSION = 1

    dirpath: str | None
    filename: str
    mode: str
    save_top_k: int
    auto_insert_metric_name: bool
    enable_version_counter: bool

    def _init_files(self) -> None:
        """No file kept or written yet (set by the callback's constructor, once ``mode`` is known)."""
        #: Kept checkpoint files and their scores (NaN without a monitor), oldest first.
        #: (Scores are kept as floats; Lightning's attributes hand them out as 0-d tensors: ``_Score``.)
        self._best_k: dict[str, float] = {}
        self.best_model_path = ""
        self._best_model_score: float | None = None
        self.last_model_path = ""
        #: The worst of the kept files once ``save_top_k`` are kept, and its score (Lightning's names).
        self.kth_best_model_path = ""
        self._kth_value: float = math.inf if self.mode == "min" else -math.inf
        #: The monitored value of the newest ranked save (NaN read as the worst: +inf for min, -inf for max).
        self._current_score: float | None = None
        #: The files this callback wrote in this process: removable without looking inside them.
        self._written: set[str] = set()

    def _find_last_checkpoints(self, trainer: Trainer) -> set[str]:
        """The last files ``ckpt_path="last"`` may mean (Lightning's method): ``last.ckpt``,
        ``last-v1.ckpt``, ... in ``dirpath``, this run's folder only; the trainer's resolver finds them."""
        return trainer.checkpointing.last_files(self.dirpath, self.CHECKPOINT_NAME_LAST, self.FILE_EXTENSION)

    def format_filename(self, metrics: dict[str, Any]) -> str:
        """``filename`` filled from ``metrics`` (:meth:`_fill`), with ``FILE_EXTENSION``."""
        return self._fill(self.filename, metrics) + self.FILE_EXTENSION

    def format_checkpoint_name(
        self, metrics: dict[str, Any], filename: str | None = None, ver: int | None = None, prefix: str = ""
    ) -> str:
        """Lightning's name for :meth:`format_filename`, as a path in ``dirpath`` (``-v<ver>`` appended if given)."""
        name = self._fill(filename or self.filename, metrics)
        name = f"{prefix}{self.CHECKPOINT_JOIN_CHAR}{name}" if prefix else name
        name += f"{self.CHECKPOINT_JOIN_CHAR}v{ver}" if ver is not None else ""
        return str(Path(self.dirpath or ".") / (name + self.FILE_EXTENSION))

    def _name_metrics(self, trainer: Trainer) -> dict[str, Any]:
        """What a save's names are filled from: the logged metrics, and the save's epoch and step."""
        return {**trainer.callback_metrics, "epoch": trainer.current_epoch, "step": trainer.global_step}

    def _fill(self, template: str, metrics: dict[str, Any]) -> str:
        """``template`` with every ``{name[:spec]}`` filled from ``metrics`` (``0`` where missing, as Lightning's).

        A field becomes ``name=value`` (``auto_insert_metric_name``) or ``value``; characters other than
        letters, digits and ``._=+-`` become ``_``, so every metric name gives a valid file name.
        """
        equals = self.CHECKPOINT_EQUALS_CHAR

        def fill(match: re.Match[str]) -> str:
            name, spec = match.group(1), match.group(2) or ""
            value = metrics.get(name)
            if isinstance(value, torch.Tensor):
                value = value.item()
            text = format(0 if value is None else value, spec[1:])  # a metric not logged (yet) reads 0, as in Lightning
            return f"{name}{equals}{text}" if self.auto_insert_metric_name else text

        return re.sub(rf"[^A-Za-z0-9._=+\-{re.escape(equals)}]", "_", _FIELD.sub(fill, template))

    def _rank_key(self, score: float) -> float:
        """Scores as ``min`` ranks them; NaN counts as the worst possible."""
        if math.isnan(score):
            return math.inf
        return score if self.mode == "min" else -score

    def _plan_top_k(self, score: float | None) -> tuple[bool, list[str]]:
        """Whether a new checkpoint with ``score`` joins the ``save_top_k`` kept, and which files it evicts.

        ``score`` None (no monitor) keeps the newest ``save_top_k``.
        """
        k, others = self.save_top_k, self._best_k  # never 0 here: such a callback ranks nothing
        if k == -1 or len(others) < k:
            return True, []
        if score is None:
            return True, list(others)[: len(others) - k + 1]
        worst = max(others, key=lambda p: self._rank_key(others[p]))
        if self._rank_key(score) < self._rank_key(others[worst]):
            return True, [worst]
        return False, []

    def _free_path(self, path: str, free: Sequence[str] = ()) -> str:
        """``path``, or with ``-v1``, ``-v2``, ... (Lightning's version counter) when a file, a link or a kept
        checkpoint has that name already; the names ``free`` lists do not count (the files a save evicts)."""
        if not self.enable_version_counter:
            return path
        stem, suffix = os.path.splitext(path)
        candidate, version = path, self.STARTING_VERSION
        while candidate not in free and (candidate in self._best_k or os.path.lexists(candidate)):
            candidate = f"{stem}{self.CHECKPOINT_JOIN_CHAR}v{version}{suffix}"
            version += 1
        return candidate

    def _read_score(self, trainer: Trainer) -> float | None:
        """The monitored value as a score; None when it is not logged yet, or not updated since the last
        ranked save. ``epoch`` and ``step`` are the trainer's unless logged, and a NaN is the worst score
        there can be, as in Lightning."""
        if self._monitor is None:
            logged = trainer.callback_metrics.get(str(self.monitor))
            if logged is not None:
                return int(logged)
            return trainer.current_epoch if self.monitor == "epoch" else trainer.global_step
        value = self._monitor.read(trainer)
        score = None if value is None else score_of(value)
        if score is not None and math.isnan(score):
            return math.inf if self.mode == "min" else -math.inf
        return score

    def _last_path(self, trainer: Trainer) -> str:
        """Where ``save_last`` writes: ``CHECKPOINT_NAME_LAST`` (a template too) + ``FILE_EXTENSION`` in ``dirpath``.

        ``last.ckpt`` by default, the file ``ckpt_path="last"`` resumes from; each save replaces this
        run's last file (atomically). A file already there that this run did not write (a user's
        own ``last.ckpt``, another run's) is kept, as Lightning keeps it: this run's is
        ``last-v1.ckpt`` (the first free version), said once. Rank 0 looks, every rank follows.
        """
        path = self.format_checkpoint_name(self._name_metrics(trainer), filename=self.CHECKPOINT_NAME_LAST)
        ours = (self.last_model_path, *self._written)  # an earlier save may have moved past another's file
        if not self.enable_version_counter or path in ours:
            return path
        free = self._free_path(path, free=ours)
        if trainer.world_size > 1:
            free = trainer.strategy.broadcast(free)  # rank 0's view of the folder holds everywhere
        if free not in (path, *ours) and trainer.is_global_zero:
            warnings.warn(
                f"ModelCheckpoint: {path} was not written by this run; it is kept, and this run's last "
                f"checkpoint is {free} (as Lightning). Resume this run with ckpt_path={free!r} or "
                f'ckpt_path="last" (the newest last file of {self.dirpath})',
                UserWarning,
                stacklevel=3,
            )
        return free

    def _say(self, trainer: Trainer, score: float | None, path: str | None) -> None:
        """``verbose``: one line per ranked save, worded as Lightning's."""
        where = f"Epoch {trainer.current_epoch:d}, global step {trainer.global_step:d}: "
        if path is None:
            print(f"{where}{self.monitor!r} was not in top {self.save_top_k}")
        elif score is None:
            print(f"{where}saving model to {path!r}")
        else:
            best = min([score, *self._best_k.values()], key=self._rank_key)
            print(
                f"{where}{self.monitor!r} reached {score:0.5f} (best {best:0.5f}), saving model to {path!r} "
                f"as top {self.save_top_k}"
            )

    def to_yaml(self, filepath: str | os.PathLike[str] | None = None) -> None:
        """Write ``best_k_models`` (path: score) as YAML, by default to ``<dirpath>/best_k_models.yaml``."""
        import yaml

        if filepath is None:
            assert self.dirpath, "to_yaml() needs a filepath before the dirpath is known (setup)"
            filepath = os.path.join(self.dirpath, "best_k_models.yaml")
        with open(filepath, "w") as f:
            yaml.dump(dict(self._best_k), f)  # plain numbers, an integer score as one (Lightning's .item())

    def _keep(self, path: str, score: float | None, evict: list[str]) -> None:
        """Record ``path`` among the kept files (``evict`` out) and the best and k-th of them, as Lightning's attributes."""
        for old in (*evict, path):  # path too: it goes to the end, the newest
            self._best_k.pop(old, None)
        self._best_k[path] = math.nan if score is None else score
        if score is None:
            self.best_model_path = path
        else:
            self._current_score = score
            best = min(self._best_k, key=lambda p: self._rank_key(self._best_k[p]))
            self.best_model_path = best
            self._best_model_score = self._best_k[best]
            if self.save_top_k == -1 or len(self._best_k) == self.save_top_k:
                kth = max(self._best_k, key=lambda p: self._rank_key(self._best_k[p]))
                self.kth_best_model_path, self._kth_value = kth, self._best_k[kth]

    def _removable(self, trainer: Trainer, old: str) -> bool:
        """Whether a file the bookkeeping names may be deleted: only a checkpoint this run wrote.

        As Lightning: inside this callback's folder, and never the checkpoint this run resumed from.
        Beyond Lightning: the bookkeeping comes from a checkpoint file, which anyone can write, so it
        is not trusted: a file this callback wrote in this process, or else one that is on disk a
        geartrain checkpoint of this run (its run id, which a resume takes over: the earlier attempts'
        files), a link in the folder (removing it removes no data); never a user's file, checkpoint
        of Lightning's or of another run, or not.
        """
        resumed = trainer.ckpt_path
        if resumed is not None and os.path.realpath(old) == os.path.realpath(resumed):
            return False
        if self.dirpath is None:
            return False
        folder = Path(os.path.realpath(self.dirpath))
        if folder not in Path(os.path.realpath(os.path.dirname(old) or ".")).joinpath("x").parents:
            return False
        return old in self._written or os.path.islink(old) or trainer.checkpointing.wrote(old)

    @property
    def best_k_models(self) -> dict[str, torch.Tensor]:
        """Kept checkpoint files and their scores, oldest first; empty without a monitor, as Lightning's
        (nothing is ranked: ``best_model_path`` is the newest save)."""
        if self.monitor is None:
            return {}
        return {path: torch.tensor(score) for path, score in self._best_k.items()}

    @best_k_models.setter
    def best_k_models(self, value: Mapping[str, float | torch.Tensor]) -> None:
        self._best_k = {path: score_of(score) for path, score in value.items()}

    best_model_score = _Score("The best kept file's score (``best_model_score.item()`` as in Lightning programs).")
    kth_value = _Score("The worst kept file's score once ``save_top_k`` are kept (+/-inf before).")
    current_score = _Score("The monitored value of the newest ranked save.")
