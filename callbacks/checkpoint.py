"""``ModelCheckpoint``: keep the last and the k best checkpoints of a run."""

from __future__ import annotations

import math
import os
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from callbacks._monitor import Monitor
from callbacks.base import Callback

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["ModelCheckpoint"]

_FIELD = re.compile(r"\{([^{}:]+)(:[^{}]*)?\}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+\-]")  # anything else (/, :, spaces, ...) becomes "_" in names


class ModelCheckpoint(Callback):
    """Save checkpoints during training; remember the best by a monitored metric.

    Every file is written atomically (temporary file, fsync, rename) by rank 0 only, so a crash
    never leaves a partial file under a checkpoint's name. The bookkeeping (which files are the k
    best) is part of each checkpoint, so a resumed run keeps ranking where it left off. When a save
    writes a top-k file and ``last.ckpt`` holds the same state, ``last.ckpt`` becomes a hard link to
    it (a copy where the filesystem has no links), and files pushed out of the top k are deleted
    only once the new file is on disk, so a failure at any point loses no checkpoint.

    Args:
        dirpath: folder for the files (default: ``<default_root_dir>/checkpoints``).
        filename: template such as ``"{epoch}-{step}-{val/acc:.4f}"``; names are the keys of
            ``trainer.callback_metrics`` plus ``epoch`` and ``step``, each written as ``name=value``.
            Characters other than letters, digits and ``._=+-`` (a ``/`` in ``val/acc``) become
            ``_``, so every metric name gives a valid file name (``epoch=3-step=40-val_acc=0.9500``).
        monitor: metric to rank checkpoints by; ``None`` keeps the newest ones.
        mode: ``"min"`` or ``"max"``: which direction of ``monitor`` is better.
        save_top_k: how many to keep; 0 keeps none (``save_last`` still works), -1 keeps all.
        save_last: also write ``last.ckpt`` at every save and at the end of fitting.
        every_n_train_steps: save every n optimizer steps (mid-epoch).
        every_n_epochs: save at the end of every n-th epoch (default 1 unless steps are given).
        save_weights_only: leave out optimizer, scheduler and loop state (cannot resume then).
        async_save: write in the background (``Trainer.save_checkpoint(..., async_=True)``): a save
            blocks training only while the state is copied into CPU memory, and a thread writes the
            file, places ``last.ckpt`` and removes the evicted top-k files, in that order. Costs one
            CPU copy of the state, kept between saves. Two writes never overlap; a failed write is
            raised (as :class:`~trainer.checkpoint.CheckpointError`) by the next save or at the end
            of fitting, with the bookkeeping rolled back to the files that are really on disk.

    A save whose monitored value was not updated since the previous ranked save (an epoch in which
    validation did not run) writes ``last.ckpt`` only. A monitor that is still missing after a
    validation pass is a typo and raises ``KeyError`` naming the logged metrics.

    Example:
        >>> cb = ModelCheckpoint(filename="{epoch}-{val/acc:.2f}", monitor="val/acc", mode="max")
        >>> cb.format_filename({"epoch": 3, "val/acc": 0.912})
        'epoch=3-val_acc=0.91.ckpt'
    """

    runs_in_fast_dev_run = False

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        filename: str = "{epoch}-{step}",
        monitor: str | None = None,
        mode: str = "min",
        save_top_k: int = 1,
        save_last: bool = False,
        every_n_train_steps: int | None = None,
        every_n_epochs: int | None = None,
        save_weights_only: bool = False,
        async_save: bool = False,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"ModelCheckpoint mode must be 'min' or 'max', got {mode!r}")
        if save_top_k < -1:
            raise ValueError(f"save_top_k must be >= -1, got {save_top_k}")
        if every_n_train_steps is not None and every_n_train_steps < 0:
            raise ValueError(f"every_n_train_steps must be >= 0, got {every_n_train_steps}")
        if every_n_epochs is not None and every_n_epochs < 0:
            raise ValueError(f"every_n_epochs must be >= 0, got {every_n_epochs}")
        if not filename or filename.endswith(".ckpt"):
            raise ValueError(f"filename must be a non-empty template without the .ckpt suffix, got {filename!r}")
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self.filename = filename
        self.monitor = monitor
        self.mode = mode
        self.save_top_k = save_top_k
        self.save_last = save_last
        self.every_n_train_steps = every_n_train_steps or 0
        self.every_n_epochs = every_n_epochs if every_n_epochs is not None else (0 if every_n_train_steps else 1)
        self.save_weights_only = save_weights_only
        self.async_save = async_save
        #: Kept checkpoint files and their scores (NaN without a monitor), oldest first.
        self.best_k_models: dict[str, float] = {}
        self.best_model_path = ""
        self.best_model_score: float | None = None
        self.last_model_path = ""
        self._monitor = Monitor("ModelCheckpoint", monitor) if monitor is not None else None
        self._last_saved_step = -1
        #: With async_save: the bookkeeping before the write in flight, to go back to if it fails.
        self._unconfirmed: dict[str, Any] | None = None

    @property
    @override
    def state_key(self) -> str:
        return (
            f"ModelCheckpoint[monitor={self.monitor},mode={self.mode},filename={self.filename},"
            f"every_n_train_steps={self.every_n_train_steps},every_n_epochs={self.every_n_epochs}]"
        )

    @override
    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = trainer.checkpointing.default_directory()

    @override
    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self._monitor is not None and not trainer.sanity_checking and trainer.stage == "fit":
            self._monitor.validated = True

    @override
    def on_train_batch_end(
        self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        n = self.every_n_train_steps
        if n and trainer.global_step % n == 0 and trainer.global_step != self._last_saved_step:
            self._save(trainer)

    @override
    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        n = self.every_n_epochs
        if n and (trainer.current_epoch + 1) % n == 0 and trainer.global_step != self._last_saved_step:
            self._save(trainer)

    @override
    def on_fit_end(self, trainer: Trainer, module: TrainModule) -> None:
        # The final state is always recoverable as last.ckpt, whatever the saving schedule.
        if self.save_last and trainer.global_step != self._last_saved_step:
            self._save(trainer, rank=False)
        self._confirm(trainer)  # the last write's failure surfaces here, with the bookkeeping rolled back
        if self._monitor is not None and self.save_top_k != 0 and not self._monitor.seen and trainer.is_global_zero:
            warnings.warn(
                f"ModelCheckpoint(monitor={self.monitor!r}): the metric was never logged during fit, "
                "so no best checkpoint was kept",
                stacklevel=2,
            )

    @override
    def on_exception(self, trainer: Trainer, module: TrainModule, exception: BaseException) -> None:
        # The run failed with a write in flight: settle the bookkeeping, and report (not raise) a
        # failed write so that the run's own exception is the one that propagates.
        try:
            self._confirm(trainer)
        except Exception as err:
            warnings.warn(f"ModelCheckpoint: the checkpoint write in flight failed too: {err}", stacklevel=2)

    # ----------------------------------------------------------------- saving
    def format_filename(self, metrics: dict[str, Any]) -> str:
        """Fill ``filename`` from ``metrics`` (a missing metric is written as ``nan``)."""

        def fill(match: re.Match[str]) -> str:
            name, spec = match.group(1), match.group(2) or ""
            value = metrics.get(name)
            if isinstance(value, torch.Tensor):
                value = value.item()
            text = "nan" if value is None else format(value, spec[1:])
            return f"{name}={text}"

        return _UNSAFE.sub("_", _FIELD.sub(fill, self.filename)) + ".ckpt"

    def _better(self, score: float, than: float) -> bool:
        return score < than if self.mode == "min" else score > than

    def _rank_key(self, score: float) -> float:
        """Scores as ``min`` ranks them; NaN counts as the worst possible."""
        if math.isnan(score):
            return math.inf
        return score if self.mode == "min" else -score

    def _plan_top_k(self, path: str, score: float | None) -> tuple[bool, list[str]]:
        """Whether a checkpoint at ``path`` with ``score`` joins the top k, and which files it evicts."""
        k = self.save_top_k
        if k == 0:
            return False, []
        others = {p: s for p, s in self.best_k_models.items() if p != path}
        if k == -1 or len(others) < k:
            return True, []
        if score is None:  # no monitor: the newest k
            return True, list(others)[: len(others) - k + 1]
        worst = max(others, key=lambda p: self._rank_key(others[p]))
        if self._rank_key(score) < self._rank_key(others[worst]):
            return True, [worst]
        return False, []

    def _save(self, trainer: Trainer, rank: bool = True) -> None:
        """One save: the top-k file if it ranks, then ``last.ckpt``; bookkeeping only once written."""
        assert self.dirpath is not None
        self._confirm(trainer)
        self._last_saved_step = trainer.global_step
        score: float | None = None
        ranked = rank and self.save_top_k != 0
        if ranked and self._monitor is not None:
            value = self._monitor.read(trainer)
            if value is None:  # not logged yet, or not updated since the last ranked save
                ranked = False
            else:
                score = float(value)
        keep, evict = False, list[str]()
        previous = self.state_dict()
        path = ""
        if ranked:
            metrics: dict[str, Any] = {
                **trainer.callback_metrics,
                "epoch": trainer.current_epoch,
                "step": trainer.global_step,
            }
            path = str(self.dirpath / self.format_filename(metrics))
            keep, evict = self._plan_top_k(path, score)
        # Update the bookkeeping first so the checkpoint holds it, and roll it back if a write fails.
        if keep:
            for old in evict:
                self.best_k_models.pop(old, None)
            self.best_k_models.pop(path, None)
            self.best_k_models[path] = math.nan if score is None else score
            if score is None:
                self.best_model_path = path
            else:
                best = min(self.best_k_models, key=lambda p: self._rank_key(self.best_k_models[p]))
                self.best_model_path = best
                self.best_model_score = self.best_k_models[best]
        if self.save_last:
            self.last_model_path = str(trainer.checkpointing.last_path(self.dirpath))
        # Same state in last.ckpt: a link to (or copy of) the top-k file, not a second serialisation.
        # The evicted files go only after the new ones are on disk (in the writer thread when async).
        also_at = [self.last_model_path] if self.save_last else []
        replaces = [old for old in evict if old not in (path, self.last_model_path)]
        try:
            if keep:
                trainer.save_checkpoint(
                    path, self.save_weights_only, async_=self.async_save, also_at=also_at, replaces=replaces
                )
            elif self.save_last:
                trainer.save_checkpoint(self.last_model_path, self.save_weights_only, async_=self.async_save)
        except BaseException:
            self.load_state_dict(previous)
            raise
        if self.async_save:
            self._unconfirmed = previous

    def _confirm(self, trainer: Trainer) -> None:
        """With ``async_save``: wait for the write in flight; if it failed, roll back and raise its error.

        The bookkeeping moved to the new file when the save was made (each checkpoint holds it);
        here it moves back if that file never reached the disk, so ``best_model_path`` and
        ``best_k_models`` name only files that exist.
        """
        previous, self._unconfirmed = self._unconfirmed, None
        if previous is None:
            return
        try:
            trainer.wait_for_checkpoints()
        except BaseException:
            self.load_state_dict(previous)
            raise

    # ----------------------------------------------------------------- state
    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "best_k_models": dict(self.best_k_models),
            "best_model_path": self.best_model_path,
            "best_model_score": self.best_model_score,
            "last_model_path": self.last_model_path,
            "dirpath": str(self.dirpath),
        }

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_k_models = dict(state.get("best_k_models", {}))
        self.best_model_path = state.get("best_model_path", "")
        self.best_model_score = state.get("best_model_score")
        self.last_model_path = state.get("last_model_path", "")
