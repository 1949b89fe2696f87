"""``ModelCheckpoint``: keep the last and the k best checkpoints of a run."""

from __future__ import annotations

import os
import warnings
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, get_type_hints

import torch
from typing_extensions import override

from callbacks._checkpoint_files import CheckpointNaming, default_dirpath
from callbacks._monitor import Monitor
from trainer.common.errors import UserError, refuse_url

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["ModelCheckpoint"]

#: Monitors that need no logging, as in Lightning: the epoch and the global step of the save.
_BUILT_IN = ("epoch", "step")


class ModelCheckpoint(CheckpointNaming):
    """Save checkpoints during training; remember the best by a monitored metric.

    Files are written atomically by rank 0; the bookkeeping (which files are the k best) is part of
    each checkpoint, so a resumed run keeps ranking where it left off. A ``last.ckpt`` holding a top-k
    file's state is a hard link to it, and files pushed out of the top k are deleted only once the
    new file is on disk, so a failure at any point loses no checkpoint.

    Args:
        dirpath: folder for the files (default: ``<default_root_dir>/checkpoints``).
        filename: template such as ``"{epoch}-{step}-{val/acc:.4f}"`` (default ``"{epoch}-{step}"``);
            names are the keys of ``trainer.callback_metrics`` plus ``epoch`` and ``step``, each
            written as ``name=value``. Characters other than letters, digits and ``._=+-`` (a ``/``
            in ``val/acc``) become ``_``, so every metric name gives a valid file name
            (``epoch=3-step=40-val_acc=0.9500``; Lightning would make a sub-folder ``val``).
        monitor: metric to rank checkpoints by; ``None`` keeps the newest ones.
        verbose: print a line at every ranked save (rank 0).
        save_last: also write ``last.ckpt`` at every save and at the end of fitting; ``"link"``
            makes it a symbolic link to the file a save wrote (a full file when none was written;
            a hard link with ``async_save``).
        save_top_k: how many to keep; 0 keeps none (``save_last`` still works), -1 keeps all.
        save_on_exception: when fitting fails, save a checkpoint named by ``filename`` (and
            ``last.ckpt``) before the exception propagates.
        save_weights_only: leave out optimizer, scheduler and loop state (cannot resume then).
        mode: ``"min"`` or ``"max"``: which direction of ``monitor`` is better.
        auto_insert_metric_name: ``False`` writes a field's value alone (``"e{epoch:02d}"`` -> ``e03``).
        every_n_train_steps: save every n optimizer steps (mid-epoch).
        train_time_interval: save when this much time (a ``timedelta``) passed since the last
            such save, checked after every batch; rank 0's clock decides.
        every_n_epochs: save at the end of every n-th epoch (default 1 unless steps or a time
            interval are given).
        save_on_train_epoch_end: ``False`` saves after every validation pass of fitting (also in the
            middle of an epoch); ``True`` at each training epoch's end (after its validation); ``None``
            (Lightning's default) after every validation pass where validation runs other than once
            at each epoch's end (``val_check_interval`` below an epoch, ``check_val_every_n_epoch`` > 1),
            else at each training epoch's end.
        enable_version_counter: a name already on disk or kept gets ``-v1``, ``-v2``, ... instead of
            replacing that file (``last.ckpt`` is always replaced: a resume finds it there).
        async_save: write in a thread (``Trainer.save_checkpoint(..., async_=True)``): a save blocks
            training only while the state is copied into CPU memory (one copy, kept between saves).
            Writes never overlap; a failed write is raised (a ``CheckpointError``) by the next save or
            at the end of fitting, with the bookkeeping rolled back to the files really on disk.
        missing_monitor: what a ``monitor`` still missing after a validation pass does. ``"raise"``
            (Lightning's behaviour): :class:`~trainer.errors.MetricNotLoggedError`, a ``KeyError``
            naming the metrics that were logged. ``"warn"``: say so once and keep only
            ``last.ckpt`` (which needs ``save_last=True``); the ``geartrain`` default callbacks use
            this, so a project that logs other metrics than the default job still trains.

    A save whose monitored value was not updated since the previous ranked save (an epoch in which
    validation did not run) writes ``last.ckpt`` only.

    Example:
        >>> cb = ModelCheckpoint(filename="{epoch}-{val/acc:.2f}", monitor="val/acc", mode="max")
        >>> cb.format_filename({"epoch": 3, "val/acc": 0.912})
        'epoch=3-val_acc=0.91.ckpt'
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | Literal["link"] | None = None,
        save_top_k: int = 1,
        save_on_exception: bool = False,
        save_weights_only: bool = False,
        mode: str = "min",
        auto_insert_metric_name: bool = True,
        every_n_train_steps: int | None = None,
        train_time_interval: timedelta | None = None,
        every_n_epochs: int | None = None,
        save_on_train_epoch_end: bool | None = None,
        enable_version_counter: bool = True,
        async_save: bool = False,
        missing_monitor: str = "raise",
    ) -> None:
        filename = "{epoch}-{step}" if filename is None else filename
        # UserError: a ValueError that is also Lightning's MisconfigurationException, worded as Lightning's.
        if mode not in ("min", "max"):
            raise UserError(f"ModelCheckpoint: `mode` can be min, max but got {mode}")
        if missing_monitor not in ("raise", "warn"):
            raise ValueError(f"ModelCheckpoint missing_monitor must be 'raise' or 'warn', got {missing_monitor!r}")
        for name, value, least in (
            ("save_top_k", save_top_k, -1),
            ("every_n_train_steps", every_n_train_steps, 0),
            ("every_n_epochs", every_n_epochs, 0),
        ):
            if value is not None and value < least:
                raise UserError(f"ModelCheckpoint: invalid value for {name}={value}. Must be >= {least}")
        if save_last not in (None, True, False, "link"):
            raise ValueError(f"save_last must be True, False, None or 'link', got {save_last!r}")
        if monitor is None and save_top_k not in (-1, 0, 1):
            raise UserError(
                f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None) is not a valid configuration. No quantity "
                "for top_k to track: pass monitor= a logged metric, or save_top_k=-1 (keep every save) or 1 (the newest)."
            )
        schedules = {
            "every_n_train_steps": every_n_train_steps,
            "every_n_epochs": every_n_epochs,
            "train_time_interval": train_time_interval,
        }
        given = [name for name, value in schedules.items() if value]
        if len(given) > 1:
            raise UserError(
                f"ModelCheckpoint: {' and '.join(given)} are mutually exclusive (as in Lightning); pick one. "
                f"Combination of parameters every_n_train_steps={every_n_train_steps}, every_n_epochs={every_n_epochs} "
                f"and train_time_interval={train_time_interval} should be mutually exclusive."
            )
        if not filename or filename.endswith(".ckpt"):
            raise ValueError(f"filename must be a non-empty template without the .ckpt suffix, got {filename!r}")
        refuse_url(dirpath, "ModelCheckpoint(dirpath)")
        # As Lightning: ``~`` expanded, links resolved, kept as a str.
        self.dirpath: str | None = os.path.realpath(os.path.expanduser(dirpath)) if dirpath is not None else None
        self.filename = filename
        self.monitor = monitor
        self.verbose = verbose
        self.mode = mode
        self.save_top_k = save_top_k
        self.save_last = save_last or False
        self.save_on_exception = save_on_exception
        self.auto_insert_metric_name = auto_insert_metric_name
        self.every_n_train_steps = every_n_train_steps or 0
        self.train_time_interval = train_time_interval
        self.every_n_epochs = (
            every_n_epochs if every_n_epochs is not None else (0 if every_n_train_steps or train_time_interval else 1)
        )
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.enable_version_counter = enable_version_counter
        self.save_weights_only = save_weights_only
        self.async_save = async_save
        self._link_only_path = ""  # save_last="link": the unranked checkpoint last.ckpt names, if any
        self._init_files()
        self.missing_monitor = missing_monitor
        kept = "only last.ckpt is kept" if save_last else "no checkpoint is kept (save_last=False)"
        self._monitor = (
            Monitor(self, monitor, on_missing=missing_monitor, consequence=f"no best checkpoint: {kept}")
            if monitor is not None and monitor not in _BUILT_IN
            else None
        )
        #: With async_save: the bookkeeping before the write in flight, to go back to if it fails.
        self._unconfirmed: dict[str, Any] | None = None

    @property
    @override
    def state_key(self) -> str:
        """Lightning's key: the class name and the options that tell two ``ModelCheckpoint`` apart."""
        options = {
            "monitor": self.monitor,
            "mode": self.mode,
            "every_n_train_steps": self.every_n_train_steps,
            "every_n_epochs": self.every_n_epochs,
            "train_time_interval": self.train_time_interval,
        }
        return f"{type(self).__qualname__}{options!r}"

    @override
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = default_dirpath(trainer)
        if trainer.world_size > 1:
            # Rank 0's folder on every rank, as Lightning: a folder named after the time or the rank
            # (a time-stamped default_root_dir) would scatter one checkpoint's shards over several.
            self.dirpath = trainer.strategy.broadcast(self.dirpath)

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if trainer.fast_dev_run:  # as Lightning: kept in the callbacks, saves nothing
            return
        # The final state is always recoverable as last.ckpt, whatever the saving schedule; also
        # when only a validation pass or an epoch's end (early stopping's count) came after the last save.
        if self.save_last and (trainer.global_step != self._last_saved_step or self._stale):
            self._save(trainer, rank=False)
        self._confirm(trainer)  # the last write's failure surfaces here, with the bookkeeping rolled back
        if self._monitor is not None and self.save_top_k != 0:
            self._monitor.warn_if_never_seen(trainer, "no best checkpoint was kept")

    @override
    def on_exception(self, trainer: Trainer, pl_module: TrainModule, exception: BaseException) -> None:
        # The run failed with a write in flight: settle the bookkeeping, and report (not raise) a
        # failed write so that the run's own exception is the one that propagates.
        try:
            self._confirm(trainer)
            if (
                self.save_on_exception
                and trainer.stage == "fit"
                and not trainer.sanity_checking
                and trainer.global_step != self._last_saved_step
                and self.dirpath is not None
            ):
                if trainer.checkpointing.in_accumulation_window:
                    # Saved as Lightning saves it, but resuming at the window's first batch: the window's
                    # gradients are not in a checkpoint, so the resume trains the window again.
                    start = trainer.checkpointing.rewind_open_window()
                    if trainer.is_global_zero:
                        print(
                            f"ModelCheckpoint: {type(exception).__name__} raised inside an accumulation window; "
                            f"its gradients are dropped and the checkpoint resumes at its first batch ({start})"
                        )
                path = self._save(trainer, rank=False, exception_file=True)
                self._confirm(trainer)
                if trainer.is_global_zero:
                    print(f"ModelCheckpoint: {type(exception).__name__} raised; saved {path}")
        except Exception as err:
            warnings.warn(f"ModelCheckpoint: the checkpoint write in flight failed too: {err}", stacklevel=2)

    # ----------------------------------------------------------------- saving
    def _save(self, trainer: Trainer, rank: bool = True, exception_file: bool = False) -> str:
        """One save: the top-k file if it ranks, then ``last.ckpt``; none under ``fast_dev_run`` (Lightning's rule).

        Returns the file of its own name it wrote ("" when it wrote none, or ``last.ckpt`` alone).
        """
        if trainer.fast_dev_run:
            return ""
        assert self.dirpath is not None
        if trainer.checkpointing.in_accumulation_window:
            self._deferred = True  # saved by on_train_batch_end at the window's end
            return ""
        self._confirm(trainer)
        self._deferred = self._stale = False
        self._last_saved_step = trainer.global_step
        ranked = rank and self.save_top_k != 0
        score = self._read_score(trainer) if ranked and self.monitor is not None else None
        ranked = ranked and (self.monitor is None or score is not None)
        keep, evict = self._plan_top_k(score) if ranked else (False, [])
        links = self.save_last == "link" and not self.async_save
        # "link" with sharded directories: a save that keeps no file writes a checkpoint of its own name
        # for last.ckpt to link to, so last.ckpt never becomes a real folder a later link cannot replace.
        sharded = getattr(trainer.strategy, "state_dict_type", "full") == "sharded"
        link_only = links and sharded and not (keep or exception_file)
        named = keep or exception_file or link_only  # a file of its own name (else last.ckpt alone)
        # Named as a new file (no kept name): as in Lightning, the version counter may give it the name
        # of a file it evicts, never that of a file it keeps.
        path = self._free_path(self.format_checkpoint_name(self._name_metrics(trainer)), free=evict) if named else ""
        if ranked and self.verbose and trainer.is_global_zero:
            self._say(trainer, score, path if keep else None)
        # This class's own state, not an override's: Lightning calls state_dict() only to write a checkpoint.
        # The bookkeeping is updated first so the checkpoint holds it, and rolled back if a write fails.
        previous = ModelCheckpoint.state_dict(self)
        if keep:
            self._keep(path, score, evict)
        previous_last = self.last_model_path
        if self.save_last:
            self.last_model_path = self._last_path(trainer)
        # Removed only once the new files are on disk (in the writer thread when async), never a file kept
        # or just written: the evicted files; a last file whose name changed (CHECKPOINT_NAME_LAST with a
        # field), as Lightning; with "link", the file last.ckpt linked to alone (relinked first: a kill in
        # between leaves last.ckpt naming a checkpoint).
        doomed = [*evict, previous_last, self._link_only_path if links and named else ""]
        replaces = [
            old
            for old in doomed
            if old and old not in (path, self.last_model_path, *self._best_k) and self._removable(trainer, old)
        ]
        try:
            if links and named:  # last.ckpt: a symbolic link to the file just written
                trainer.save_checkpoint(path, self.save_weights_only)
                trainer.checkpointing.link(path, self.last_model_path, replaces)
                self._link_only_path = path if link_only else ""
            elif named or self.save_last:
                # last.ckpt beside a named file: the same state as a hard link (placed by the writer thread
                # once the file is on disk, with async_save), not a second serialisation.
                trainer.save_checkpoint(
                    path or self.last_model_path,
                    self.save_weights_only,
                    async_=self.async_save,
                    also_at=[self.last_model_path] if named and self.save_last else [],
                    replaces=replaces,
                )
        except BaseException:
            ModelCheckpoint.load_state_dict(self, previous)
            raise
        self._written.update([path] if named else [])
        self._written.update([self.last_model_path] if self.save_last else [])
        for logger in trainer.loggers:  # Lightning's logger.after_save_checkpoint(self)
            if hasattr(logger, "after_save_checkpoint"):
                logger.after_save_checkpoint(self)
        if self.async_save:
            self._unconfirmed = previous
        return path

    def _confirm(self, trainer: Trainer) -> None:
        """With ``async_save``: wait for the write in flight; if it failed, roll the bookkeeping back and raise."""
        previous, self._unconfirmed = self._unconfirmed, None
        if previous is None:
            return
        try:
            trainer.wait_for_checkpoints()
        except BaseException:
            ModelCheckpoint.load_state_dict(self, previous)
            raise

    # ----------------------------------------------------------------- state
    @override
    def state_dict(self) -> dict[str, Any]:
        # Lightning's entries (its ModelCheckpoint restores from them), then the schedule's. Scores are
        # 0-d tensors, as Lightning's (CheckpointNaming's properties): a metric compares as it was logged.
        return {
            "monitor": self.monitor,
            "best_model_score": self.best_model_score,
            "best_model_path": self.best_model_path,
            "current_score": self.current_score,
            "dirpath": str(self.dirpath),
            "best_k_models": {path: torch.tensor(value) for path, value in self._best_k.items()},
            "kth_best_model_path": self.kth_best_model_path,
            "kth_value": self.kth_value,
            "last_model_path": self.last_model_path,
            **self.schedule_state(),
        }

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved_dir = state.get("dirpath")
        if saved_dir in (None, "None") or self.dirpath is None or saved_dir == self.dirpath:
            self.best_k_models = dict(state.get("best_k_models", {}))
            self.best_model_score = state.get("best_model_score")
            self.last_model_path = state.get("last_model_path", "")
            self.current_score = state.get("current_score", self.current_score)
            self.kth_best_model_path = state.get("kth_best_model_path", self.kth_best_model_path)
            self.kth_value = state.get("kth_value", self.kth_value)
        else:
            # As Lightning: the files ranked there are another folder's (a run resumed into a new dirpath);
            # ranking them here would delete them.
            warnings.warn(
                f"The dirpath has changed from {saved_dir!r} to {self.dirpath!r} (ModelCheckpoint), therefore "
                "`best_model_score`, `kth_best_model_path`, `kth_value`, `last_model_path` and `best_k_models` "
                "won't be reloaded. Only `best_model_path` will be reloaded.",
                UserWarning,
                stacklevel=2,
            )
        self.best_model_path = state.get("best_model_path", "")
        self.load_schedule_state(state)


# Types, not strings, in the constructor's signature (this module postpones annotations): tools that
# build a parser from it, as Lightning's CLI does for ``save_last``, get the union itself.
ModelCheckpoint.__init__.__annotations__.update(get_type_hints(ModelCheckpoint.__init__))
