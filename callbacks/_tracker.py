"""What the loggers of remote experiment trackers share: :class:`RemoteLogger` (all four) and
:class:`TrackerLogger` (the two that resume a run, MLflow and W&B).

``RemoteLogger``, the base of ``CometLogger``, ``LitLogger`` and ``TrackerLogger``: the tracker's
``experiment`` opened on first use on rank 0 (a do-nothing one elsewhere), no local folder unless
the tracker keeps one, a copy for another process without the live experiment, and checkpoint files
uploaded once per modification time.

A tracker keeps a *run* under an id of its own. Three things make such a run outlive one process:

* **The run id is callback state.** :meth:`TrackerLogger.state_dict` holds it, so every checkpoint
  names the run it belongs to; ``ckpt_path=last`` after a crash (``kill -9``) continues that run
  instead of opening a new one. The run is created lazily, on first use, which is after the
  trainer restored callback state: a resumed fit never opens a stray run first.
* **No step twice.** The values logged between the last checkpoint and the crash are already in
  the tracker; the resumed fit computes them again, bitwise the same. Each tracker reports, once at
  resume, the last step it holds per metric key, and the resumed fit skips ``(key, step)`` pairs at
  or below it (only in that fit: a later ``validate`` at the final step is still written).
* **Checkpoints as artifacts** (``log_model``): ``"all"`` uploads each new or rewritten checkpoint
  file after every save, ``True`` uploads them when fitting ends (each save with ``save_top_k=-1``),
  ``False`` uploads nothing. A file is uploaded again only when its modification time changed.

Only rank 0 talks to the tracker; other ranks hold a do-nothing ``experiment``. The tracker's
package is imported when the logger is built, never by ``import callbacks``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from callbacks._logger import Logger, NoOpExperiment, run_hparams

if TYPE_CHECKING:
    from types import ModuleType

    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = [
    "CheckpointFile",
    "RemoteLogger",
    "TrackerLogger",
    "import_client",
    "import_tracker",
    "new_checkpoints",
    "run_context",
]

#: What ``log_model`` accepts (Lightning's values).
_LOG_MODEL = (True, False, "all")


def import_tracker(module: str, extra: str, logger: str) -> ModuleType:
    """Import a tracker's package, or fail with one line naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ModuleNotFoundError(
            f"callbacks.{logger} needs the {module!r} package: pip install 'geartrain[{extra}]'"
        ) from err


def import_client(module: str, requirement: str) -> ModuleType:
    """Import a tracker's client package that no extra of geartrain installs, or fail with Lightning's
    ``ModuleNotFoundError`` text (``Requirement 'comet-ml>=3.44.4' not met. HINT: ...``)."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ModuleNotFoundError(
            f"Requirement {requirement!r} not met. HINT: Try running `pip install -U {requirement!r}`"
        ) from err


class CheckpointFile:
    """A checkpoint file due for upload: ``path``, its ``mtime``, its ``score`` and aliases."""

    __slots__ = ("aliases", "mtime", "path", "score")

    def __init__(self, path: str, mtime: float, score: float | None, aliases: list[str]) -> None:
        self.path, self.mtime, self.score, self.aliases = path, mtime, score, aliases

    def metadata(self, checkpoint_callback: Any) -> dict[str, Any]:
        """What the tracker stores beside the file: its score, file name and the callback's settings."""
        settings = ("monitor", "mode", "save_last", "save_top_k", "save_weights_only")
        return {
            "score": self.score,
            "original_filename": Path(self.path).name,
            type(checkpoint_callback).__name__: {k: getattr(checkpoint_callback, k, None) for k in settings},
        }


class RemoteLogger(Logger):
    """Base of the remote trackers' loggers (see the module docstring).

    A subclass opens its tracker's object in :meth:`_open_run` and uploads a checkpoint file in
    :meth:`_upload_checkpoint`; :meth:`_upload_new` hands it the files not uploaded yet.
    """

    def __init__(self, log_model: bool | str = False, prefix: str = "") -> None:
        super().__init__(None, "", None, prefix)
        self._log_model = log_model
        #: The tracker's object (run, experiment), once opened in this process.
        self._experiment: Any = None
        #: checkpoint path -> mtime of the copy uploaded.
        self._logged_model_time: dict[str, float] = {}

    def _open_run(self) -> Any:
        """Open (or resume) the run; return the tracker's object."""
        raise NotImplementedError

    def _upload_checkpoint(self, checkpoint: CheckpointFile, checkpoint_callback: Any) -> None:
        raise NotImplementedError

    @property
    def experiment(self) -> Any:
        """The tracker's object (opened on first use); a do-nothing stand-in off rank 0."""
        if not self._writes:
            return NoOpExperiment()
        if self._experiment is None:
            self._experiment = self._open_run()
        return self._experiment

    @property
    @override
    def root_dir(self) -> str | None:
        """``None``, as Lightning's: the files live in the tracker."""
        return None

    @property
    @override
    def log_dir(self) -> str | None:
        """``None``, as Lightning's: the files live in the tracker (``trainer.log_dir`` is then its ``save_dir``)."""
        return None

    @override
    def __getstate__(self) -> dict[str, Any]:
        """A copy for another process (``ddp_spawn``): without the experiment (a live connection), opened again there."""
        state = self.__dict__.copy()
        state["_experiment"] = None
        return state

    def _upload_new(self, checkpoint_callback: Any) -> None:
        """Upload the files of ``checkpoint_callback`` not uploaded yet, or rewritten since (rank 0 only)."""
        if not self._writes:
            return
        for checkpoint in new_checkpoints(checkpoint_callback, self._logged_model_time):
            self._upload_checkpoint(checkpoint, checkpoint_callback)
            self._logged_model_time[checkpoint.path] = checkpoint.mtime


class TrackerLogger(RemoteLogger):
    """Base of :class:`~callbacks.MLFlowLogger` and :class:`~callbacks.WandbLogger` (see the module docstring).

    A subclass opens or resumes (when ``_run_id`` is set) its run in :meth:`_open_run`, writes in
    :meth:`_write_metrics`, uploads in :meth:`_upload_checkpoint`, and reports what a resumed run
    holds in :meth:`_last_steps`.
    """

    def __init__(self, log_model: bool | str = False, prefix: str = "") -> None:
        if log_model not in _LOG_MODEL:
            raise ValueError(f"log_model must be True, False or 'all', got {log_model!r}")
        super().__init__(log_model, prefix)
        #: The run's id: given, restored from a checkpoint, or the tracker's once the run is open.
        self._run_id: str | None = None
        #: The id the user gave (``run_id=``/``id=``): a checkpoint's run never replaces it.
        self._given_run_id: str | None = None
        #: ``log_model=True``: the checkpoint callbacks whose files go up when fitting ends.
        self._checkpoint_callbacks: list[Any] = []
        #: After a resume: metric key -> the last step the tracker already holds (skipped up to it).
        self._replay: dict[str, int] | None = None
        self._resumed = False
        #: Under the ``geartrain`` command: the run directory (absolute), which names a new run.
        self._run_dir: str | None = None

    # ----------------------------------------------------------------- for subclasses
    def _write_metrics(self, metrics: dict[str, float], step: int | None) -> None:
        raise NotImplementedError

    def _last_steps(self) -> dict[str, int]:
        """Metric name in the tracker -> the last step the (resumed) run already holds."""
        return {}

    def _tracker_key(self, key: str) -> str:
        """The name the tracker holds the metric ``key`` under (the key itself, unless the tracker refuses it)."""
        return key

    def _record_run_context(self, context: dict[str, str], config: dict[str, Any] | None) -> None:
        """Record where the run's files are (``context``) and the resolved config of the ``geartrain`` command."""

    @override
    def __getstate__(self) -> dict[str, Any]:
        """Also without the checkpoint callbacks it would upload for."""
        state = super().__getstate__()
        state["_checkpoint_callbacks"] = []
        return state

    # ----------------------------------------------------------------- Lightning's logger methods
    @override
    def log_metrics(self, metrics: Mapping[str, float | torch.Tensor], step: int | None = None) -> None:
        if not self._writes:
            return
        values = {k: float(v) for k, v in self._with_prefix(metrics).items() if not isinstance(v, str)}
        if self._replay and step is not None:
            values = {k: v for k, v in values.items() if step > self._replay.get(self._tracker_key(k), -1)}
            if not values:
                return
        self._write_metrics(values, step)

    @override
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        if not self._writes or self._log_model is False:
            return
        if self._log_model == "all" or getattr(checkpoint_callback, "save_top_k", None) == -1:
            self._upload_new(checkpoint_callback)
        elif not any(cb is checkpoint_callback for cb in self._checkpoint_callbacks):
            self._checkpoint_callbacks.append(checkpoint_callback)

    def _upload_pending(self) -> None:
        for checkpoint_callback in self._checkpoint_callbacks:
            self._upload_new(checkpoint_callback)

    # ----------------------------------------------------------------- checkpoint state
    @override
    def state_dict(self) -> dict[str, Any]:
        # The id only once the run exists: asking for it must not open a run on a checkpoint save.
        return {"run_id": self._run_id} if self._writes and self._run_id is not None else {}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        run_id = state_dict.get("run_id")
        if run_id is None:
            return
        if run_id != self._run_id and (self._given_run_id is not None or self._is_open()):
            # The user named a run (run_id=/id=), or this logger already writes to one: that one stays.
            print(
                f"{type(self).__name__}: not resuming the checkpoint's run {run_id}: this logger writes to run {self._run_id}"
            )
            return
        self._run_id = str(run_id)
        self._resumed = True

    def _is_open(self) -> bool:
        """Whether the tracker's run object exists in this process."""
        return self._experiment is not None

    # ----------------------------------------------------------------- as a callback
    @override
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        self._writes = trainer.is_global_zero
        if trainer.config is not None:
            self._run_dir = os.path.abspath(trainer.default_root_dir)

    def _default_run_name(self) -> str | None:
        """The run directory's path from the working directory (``outputs/2026-01-02/10-11-12``), else absolute."""
        if self._run_dir is None:
            return None
        relative = os.path.relpath(self._run_dir)
        return self._run_dir if relative.startswith("..") else relative

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not self._writes:
            return
        if self._resumed:
            self._replay = self._last_steps()
        context, config = run_context(trainer)
        self._record_run_context(context, config)
        if config is None:
            hparams = run_hparams(pl_module, trainer)
            if hparams:
                self.log_hyperparams(hparams)

    @override
    def on_log_metrics(
        self, trainer: Trainer, pl_module: TrainModule, metrics: dict[str, torch.Tensor], step: int
    ) -> None:
        if not self._writes:
            return
        # As Lightning: the trainer's rows carry ``epoch`` beside the values (an evaluation step's do not).
        values = {key: float(value) for key, value in metrics.items()}
        self.log_metrics(metrics=values, step=step)

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._replay = None

    @override
    def on_exception(self, trainer: Trainer, pl_module: TrainModule, exception: BaseException) -> None:
        self._replay = None
        super().on_exception(trainer, pl_module, exception)


def run_context(trainer: Trainer) -> tuple[dict[str, str], dict[str, Any] | None]:
    """Where a ``geartrain`` run keeps its files, and its resolved config (``None`` outside the command).

    The tags lead from a run in the tracker back to its run directory and checkpoints.
    """
    if trainer.config is None:
        return {}, None
    from trainer.common.state_dict import to_plain

    context = {"geartrain.run_dir": os.path.abspath(trainer.default_root_dir)}
    checkpoint = trainer.checkpoint_callback
    dirpath = getattr(checkpoint, "dirpath", None)
    if dirpath is not None:
        context["geartrain.checkpoint_dir"] = os.path.abspath(dirpath)
    plain = to_plain(trainer.config)
    return context, plain if isinstance(plain, dict) else None


def new_checkpoints(checkpoint_callback: Any, logged: dict[str, float]) -> list[CheckpointFile]:
    """The checkpoint files of ``checkpoint_callback`` not uploaded yet (or rewritten since), oldest first.

    A file not on disk yet (an ``async_save`` in flight) is left for the next call.
    """
    scores: dict[str, float | int | None] = {}
    last = getattr(checkpoint_callback, "last_model_path", "")
    if last:
        current = getattr(checkpoint_callback, "current_score", None)
        scores[last] = None if current is None else _number(current)
    best = getattr(checkpoint_callback, "best_model_path", "")
    if best:
        score = getattr(checkpoint_callback, "best_model_score", None)
        scores[best] = None if score is None else _number(score)
    for path, score in (getattr(checkpoint_callback, "best_k_models", None) or {}).items():
        scores[path] = None if score is None else _number(score)
    found = []
    for path, score in scores.items():
        try:
            mtime = os.path.getmtime(path)
        except OSError:
            continue
        if logged.get(path) != mtime:
            aliases = ["latest", "best"] if path == best else ["latest"]
            found.append(CheckpointFile(path, mtime, score, aliases))
    return sorted(found, key=lambda c: c.mtime)


def _number(value: Any) -> float | int:
    """A score as a plain Python number of its own kind (an int stays an int), which trackers store as JSON."""
    number = value.item() if isinstance(value, torch.Tensor) else value
    return number if isinstance(number, (int, float)) else float(number)
