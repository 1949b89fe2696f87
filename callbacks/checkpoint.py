"""``ModelCheckpoint``: keep the last and the k best checkpoints of a run."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["ModelCheckpoint"]

_FIELD = re.compile(r"\{([^{}:]+)(:[^{}]*)?\}")


class ModelCheckpoint(Callback):
    """Save checkpoints during training; remember the best by a monitored metric.

    Args:
        dirpath: folder for the files (default: ``<default_root_dir>/checkpoints``).
        filename: template such as ``"{epoch}-{step}-{val/acc:.4f}"``; names are the keys of
            ``trainer.callback_metrics`` plus ``epoch`` and ``step``. A ``/`` in a metric name becomes
            ``_`` in the file name.
        monitor: metric to rank checkpoints by; ``None`` keeps the latest ones.
        mode: ``"min"`` or ``"max"``: which direction of ``monitor`` is better.
        save_top_k: how many to keep; 0 keeps none (``save_last`` still works), -1 keeps all.
        save_last: also write ``last.ckpt`` at every save.
        every_n_train_steps: save every n optimizer steps (mid-epoch).
        every_n_epochs: save at the end of every n-th epoch (default 1 unless steps are given).
        save_weights_only: leave out optimizer, scheduler and loop state (cannot resume then).
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
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"ModelCheckpoint mode must be 'min' or 'max', got {mode!r}")
        if save_top_k < -1:
            raise ValueError(f"save_top_k must be >= -1, got {save_top_k}")
        if every_n_train_steps is not None and every_n_train_steps < 1:
            raise ValueError(f"every_n_train_steps must be >= 1, got {every_n_train_steps}")
        if every_n_epochs is not None and every_n_epochs < 0:
            raise ValueError(f"every_n_epochs must be >= 0, got {every_n_epochs}")
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self.filename = filename
        self.monitor = monitor
        self.mode = mode
        self.save_top_k = save_top_k
        self.save_last = save_last
        self.every_n_train_steps = every_n_train_steps
        self.every_n_epochs = every_n_epochs if every_n_epochs is not None else (0 if every_n_train_steps else 1)
        self.save_weights_only = save_weights_only
        self.best_k_models: dict[str, float] = {}
        self.best_model_path = ""
        self.best_model_score: float | None = None
        self.last_model_path = ""
        self._last_saved_step = -1

    @property
    def state_key(self) -> str:
        return f"ModelCheckpoint[monitor={self.monitor},mode={self.mode},dirpath={self.dirpath}]"

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = trainer.default_root_dir / "checkpoints"

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        n = self.every_n_train_steps
        if n and trainer.global_step % n == 0 and trainer.global_step != self._last_saved_step:
            self._save(trainer)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        n = self.every_n_epochs
        if n and (trainer.current_epoch + 1) % n == 0 and trainer.global_step != self._last_saved_step:
            self._save(trainer)

    def on_fit_end(self, trainer: Trainer, module: TrainModule) -> None:
        # The final state is always recoverable as last.ckpt, whatever the saving schedule.
        if self.save_last and trainer.global_step != self._last_saved_step:
            self._save(trainer)

    # ----------------------------------------------------------------- saving
    def format_filename(self, metrics: dict[str, Any]) -> str:
        """Fill ``filename`` from ``metrics`` (missing metrics are left out of the name)."""

        def fill(match: re.Match[str]) -> str:
            name, spec = match.group(1), match.group(2) or ""
            value = metrics.get(name)
            if value is None:
                return f"{name.replace('/', '_')}=nan"
            if isinstance(value, torch.Tensor):
                value = value.item()
            return f"{name.replace('/', '_')}={format(value, spec[1:])}"

        return _FIELD.sub(fill, self.filename).replace("/", "_") + ".ckpt"

    def _current_score(self, trainer: Trainer) -> float | None:
        if self.monitor is None:
            return None
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            logged = ", ".join(sorted(trainer.callback_metrics)) or "nothing"
            raise KeyError(f"ModelCheckpoint(monitor={self.monitor!r}): that metric was not logged (logged: {logged})")
        return float(value)

    def _is_better(self, score: float, than: float) -> bool:
        return score < than if self.mode == "min" else score > than

    def _save(self, trainer: Trainer) -> None:
        assert self.dirpath is not None
        self._last_saved_step = trainer.global_step
        score = self._current_score(trainer)
        metrics: dict[str, Any] = {
            **trainer.callback_metrics,
            "epoch": trainer.current_epoch,
            "step": trainer.global_step,
        }
        to_write: list[Path] = []
        to_delete: list[str] = []
        if self.save_top_k != 0:
            path = self.dirpath / self.format_filename(metrics)
            rank = math.nan if score is None else score
            if score is not None and math.isnan(score):
                rank = math.inf if self.mode == "min" else -math.inf
            if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
                keep = True
            elif score is None:  # no monitor: keep the newest k
                keep = True
                to_delete.append(next(iter(self.best_k_models)))
            else:
                worst = (
                    max(self.best_k_models, key=self.best_k_models.__getitem__)
                    if self.mode == "min"
                    else min(self.best_k_models, key=self.best_k_models.__getitem__)
                )
                keep = self._is_better(rank, self.best_k_models[worst])
                if keep:
                    to_delete.append(worst)
            if keep:
                for old in to_delete:
                    self.best_k_models.pop(old, None)
                self.best_k_models[str(path)] = rank
                to_write.append(path)
                if score is None:
                    self.best_model_path = str(path)
                else:
                    best = (min if self.mode == "min" else max)(self.best_k_models, key=self.best_k_models.__getitem__)
                    self.best_model_path = best
                    self.best_model_score = self.best_k_models[best]
            else:
                to_delete = []
        if self.save_last:
            to_write.append(self.dirpath / "last.ckpt")
            self.last_model_path = str(self.dirpath / "last.ckpt")
        for path in to_write:
            trainer.save_checkpoint(path, weights_only=self.save_weights_only)
        if trainer.is_global_zero:
            for old in to_delete:
                if old not in self.best_k_models and Path(old).exists() and old not in map(str, to_write):
                    Path(old).unlink()

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            "best_k_models": dict(self.best_k_models),
            "best_model_path": self.best_model_path,
            "best_model_score": self.best_model_score,
            "last_model_path": self.last_model_path,
            "dirpath": str(self.dirpath),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_k_models = dict(state.get("best_k_models", {}))
        self.best_model_path = state.get("best_model_path", "")
        self.best_model_score = state.get("best_model_score")
        self.last_model_path = state.get("last_model_path", "")
