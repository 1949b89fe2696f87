"""A run's checkpoint: what it holds (docs/checkpoints.md), its save and its restore, where ``last.ckpt`` lives.

The bytes are the writer's (:mod:`~trainer.checkpoint.files`) and the reader's, which file ``"last"``
means the resolver's (:mod:`~trainer.checkpoint.resolve`).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from callbacks.base import callback_states
from trainer.checkpoint import resume
from trainer.checkpoint.files import AsyncCheckpointWriter, remove_checkpoint, symlink, write_checkpoint
from trainer.checkpoint.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    LIGHTNING_LAYOUT_VERSION,
    is_geartrain_checkpoint,
    lightning_loops,
    merge_loops,
)
from trainer.checkpoint.plugin_io import DEFAULT_IO_TYPES, is_default_io, save_with
from trainer.checkpoint.reader import read_any, recognise
from trainer.checkpoint.resolve import last_files, resolve_ckpt_path
from trainer.common.errors import CheckpointError, UserError
from trainer.common.rng import rng_state, set_rng_state
from trainer.common.state_dict import to_plain
from trainer.data.stateful import checkpoint_loops, saved_states
from trainer.hparams import hparams_record

if TYPE_CHECKING:
    from collections.abc import Iterable

    from trainer.trainer import Trainer

__all__ = ["LAST_CHECKPOINT", "CheckpointConnector"]

#: File name of the checkpoint that always holds the newest state of a run.
LAST_CHECKPOINT = "last.ckpt"


class CheckpointConnector:
    """Dumps and restores one trainer's run (see the module docstring)."""

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer
        self._writer: AsyncCheckpointWriter | None = None  # made on the first asynchronous save
        #: The sampler's epoch order and the stateful loaders' states (trainer.data.stateful) saved in the
        #: checkpoint a run resumed from (None, []: none); the training loop takes them once.
        self.resume_epoch_rng: dict[str, Any] | None = None
        self.resume_loader_states: list[dict[str, Any]] = []
        #: :meth:`training_state` of a fit that ran in processes the strategy started (rank 0's),
        #: adopted by the caller; None otherwise.
        self.adopted: dict[str, Any] | None = None
        #: The checkpoint resumed from and how its training batches were formed (checked once, at start).
        self._resume_batches: tuple[Path, dict[str, Any] | None] | None = None
        #: Where a fit that stopped inside an epoch stood (:meth:`mark_resume_point`); None otherwise.
        self.resume_point: dict[str, Any] | None = None
        #: The file :meth:`save_last` wrote (the preemption checkpoint), which a Ctrl-C's line names.
        self.saved_last: Path | None = None
        #: This run's identity, written near the start of every checkpoint; a resume takes it from the
        #: file, so a run deletes only checkpoints of its own (``ModelCheckpoint``'s eviction).
        self.run_id: str = uuid.uuid4().hex

    # ----------------------------------------------------------------- where
    #: The last files ``ckpt_path="last"`` may mean in a folder (the resolver's; ``ModelCheckpoint`` asks it).
    last_files = staticmethod(last_files)

    def default_directory(self) -> Path:
        """``<default_root_dir>/checkpoints``: where checkpoints go unless a callback says otherwise."""
        return Path(self._trainer.default_root_dir) / "checkpoints"

    def last_path(self) -> Path:
        """``last.ckpt`` in the checkpoint callback's folder, else in :meth:`default_directory`."""
        directory = getattr(self._trainer.checkpoint_callback, "dirpath", None) or self.default_directory()
        return Path(directory) / LAST_CHECKPOINT

    # ----------------------------------------------------------------- dump
    @property
    def in_accumulation_window(self) -> bool:
        """Whether gradients of an unfinished accumulation window are waiting for their optimizer step.

        From a window's first backward until its optimizer step and ``zero_grad`` are done (hooks such
        as ``on_before_optimizer_step`` and ``on_before_zero_grad`` run inside it). A checkpoint written
        then would lose those gradients on resume, so :meth:`save` refuses, and ``ModelCheckpoint``
        waits for the window's end.
        """
        window = self._trainer.window
        return window.has_loss or window.nonfinite

    def rewind_open_window(self) -> int:
        """Drop the gradients of an unfinished accumulation window and rewind to the window's first batch.

        For a save after an exception raised inside the window (its ``training_step``, the optimizer
        step, clipping, ``zero_grad``): the checkpoint then resumes by training the whole window again
        from the same weights, instead of losing its gradients. Windows start at multiples of
        ``accumulate_grad_batches`` in an epoch. Returns the batch the window started at.
        """
        t = self._trainer
        for optimizer in t.optimizers:
            optimizer.zero_grad(set_to_none=True)
        t.window.has_loss = t.window.nonfinite = False
        k = max(int(t.accumulate_grad_batches), 1)
        t.progress.batch_in_epoch = (t.progress.batch_in_epoch // k) * k
        return t.progress.batch_in_epoch

    def state(self, weights_only: bool = False, sharded: bool = False) -> dict[str, Any]:
        """The one place where a checkpoint's content is assembled (docs/checkpoints.md).

        ``sharded``: model and optimizer state as this rank holds them (a sharded directory's content).
        """
        t = self._trainer
        assert t.module is not None
        point = None if weights_only else self.resume_point
        if sharded:
            model = t.strategy.sharded_model_state_dict()
        else:
            model = t.strategy.model_state_dict() if self.adopted is None else {**t.module.state_dict(keep_vars=False)}
        progress = t.progress.state_dict() if point is None else point["progress"]
        # Lightning's keys (trainer.checkpoint.format) beside geartrain's: Lightning reads this file too.
        state: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "run_id": self.run_id,  # among the first bytes of the file (format.is_geartrain_checkpoint)
            "epoch": t.current_epoch if point is None else progress["epoch"],
            "global_step": t.global_step,
            "pytorch-lightning_version": LIGHTNING_LAYOUT_VERSION,
            "state_dict": model,
            "loops": lightning_loops(progress, bool(getattr(t.module, "automatic_optimization", True))),
            "progress": progress,
            "config": to_plain(t.config),
            # hyper_parameters, hparams_unsaved (descriptions: load_from_checkpoint asks for them), hparams_name/_type
            **hparams_record(t.module),
        }
        if t.datamodule is not None:
            state.update(hparams_record(t.datamodule, "datamodule_"))
        if not weights_only:
            training = self.training_state(sharded)
            merge_loops(state["loops"], training.pop("loops", {}))  # the sampler's order, the loaders' states
            state.update(training)
            state["callbacks"] = callback_states(t.callbacks)
            mid_epoch = t.stage == "fit" and not t.progress.epoch_finished
            state["metrics"] = t.metric_router.state_dict(t.module, mid_epoch)
            if t.datamodule is not None:
                state["datamodule"] = t.hooks.datamodule(t.datamodule, "state_dict")  # profiled, as Lightning's
            if point is not None:
                resume.apply(state, point)
            if t.datamodule is not None:  # also under its class's name, where Lightning reads it (one object)
                state[type(t.datamodule).__qualname__] = state["datamodule"]
        t.hooks.callbacks_only("on_save_checkpoint", state)  # callbacks first (trainer/hook_order.py)
        t.metric_router.no_log("on_save_checkpoint", t.module.on_save_checkpoint)(state)  # as Lightning's: no self.log
        return state

    def mark_resume_point(self) -> None:
        """Training stops inside an epoch: every checkpoint until the next fit resumes from here.

        See :func:`trainer.checkpoint.resume.capture`. Every rank calls it at the same batch.
        """
        self.resume_point = resume.capture(self._trainer, self.training_state())

    def training_state(self, sharded: bool = False) -> dict[str, Any]:
        """Optimizers, schedulers, precision, every rank's RNG and the sampler's epoch order.

        After a fit that ran in processes the strategy started, the caller's strategy never set up
        the optimizers: their state comes from rank 0's end of the run (:attr:`adopted`), so
        ``save_checkpoint`` there writes what it would have written in the processes.
        """
        if self.adopted is not None:
            return dict(self.adopted)
        t = self._trainer
        optimizer_state = t.strategy.sharded_optimizer_state_dict if sharded else t.strategy.optimizer_state_dict
        state: dict[str, Any] = {
            "optimizer_states": [optimizer_state(opt) for opt in t.optimizers],
            "lr_schedulers": [cfg.scheduler.state_dict() for cfg in t.lr_scheduler_configs],
            # The kinds, so that resuming with another optimizer or scheduler is refused by name.
            "optimizer_types": resume.types_of(t.optimizers),
            # Parameter names in the by-index order of a full file, so it converts to a sharded directory.
            "optimizer_param_names": _param_names(t.module, t.optimizers) if t.module is not None else [],
            "lr_scheduler_types": resume.types_of([cfg.scheduler for cfg in t.lr_scheduler_configs]),
            "precision": t.strategy.precision.state_dict(),
            "rng": t.strategy.gather_object(rng_state()),  # one entry per rank
        }
        loops = checkpoint_loops(t.loaders.get("fit"))
        batches = resume.batch_geometry(t)
        if batches is not None:  # how the training batches were formed: a resume says what differs
            loops["batches"] = batches
        if loops:
            state["loops"] = loops
        return state

    def save(
        self,
        path: str | os.PathLike[str],
        weights_only: bool,
        async_: bool,
        also_at: Iterable[str | os.PathLike[str]],
        replaces: Iterable[str | os.PathLike[str]],
        storage_options: Any = None,
    ) -> None:
        """Write a checkpoint (rank 0 writes; every rank calls this). See ``Trainer.save_checkpoint``."""
        t = self._trainer
        if t.module is None:  # Lightning's error: there is nothing to save before an entry point attached a model
            raise AttributeError(
                "Saving a checkpoint is only possible if a model is attached to the Trainer. Did you call "
                "`Trainer.save_checkpoint()` before calling `Trainer.{fit,validate,test,predict}`?"
            )
        if not weights_only and self.in_accumulation_window:
            k = t.accumulate_grad_batches
            raise RuntimeError(
                f"save_checkpoint({str(path)!r}) was called inside an accumulation window "
                f"(accumulate_grad_batches={k}; batch {t.progress.batch_in_epoch} of epoch {t.progress.epoch}, "
                "gradients not yet applied): resuming from it would lose them. Save when "
                "trainer.checkpointing.in_accumulation_window is False (in on_train_batch_end after the "
                "window's optimizer step, or at an epoch's end), or pass weights_only=True"
            )
        if not is_default_io(t.strategy.checkpoint_io):  # the user's IO writes the full state (every rank gathers)
            return save_with(t, self.state(weights_only), path, also_at, replaces, storage_options)
        if async_ and self._writer is None:
            self._writer = AsyncCheckpointWriter()
        background = self._writer if async_ else None
        sharded = t.strategy.state_dict_type == "sharded" and self.adopted is None
        state = self.state(weights_only, sharded)
        self.wait()  # one save in flight at a time: an older asynchronous write must not land after this one
        if sharded:
            from trainer.checkpoint.sharded import save_sharded

            save_sharded(
                path, state, background=background.run if background else None, also_at=also_at, replaces=replaces
            )
        elif t.is_global_zero and background is not None:
            background.save(state, path, also_at, replaces)
        elif t.is_global_zero:
            write_checkpoint(state, path, also_at, replaces)
        t.strategy.barrier("save_checkpoint")

    def write(self, state: dict[str, Any], path: str | os.PathLike[str]) -> Path:
        """Write ``state`` to ``path`` from this process alone (no collective), through the one writer."""
        return write_checkpoint(state, path)

    def wrote(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` is a checkpoint of this run (its run id, or a sharded directory of ours): removable."""
        return is_geartrain_checkpoint(path, self.run_id)

    def link(self, target: str, link: str, replaces: Iterable[str] = ()) -> None:
        """``ModelCheckpoint(save_last="link")``: on rank 0, ``link`` made a symbolic link to ``target``, then
        the files ``replaces`` names removed (a kill in between leaves the link naming a checkpoint)."""
        if self._trainer.is_global_zero:
            symlink(target, link)
            for old in replaces:
                remove_checkpoint(old)

    def save_last(self) -> Path:
        """Write ``last.ckpt`` where ``ckpt_path="last"`` finds it (the preemption checkpoint)."""
        cb = self._trainer.checkpoint_callback
        own_last = getattr(cb, "_last_path", None)  # ModelCheckpoint's: a user's last.ckpt there is kept
        path = Path(own_last(self._trainer)) if own_last is not None else self.last_path()
        self._trainer.save_checkpoint(path)
        if cb is not None and hasattr(cb, "last_model_path"):
            cb.last_model_path = str(path)
        self.saved_last = path
        return path

    def wait(self) -> None:
        """Block until asynchronous writes are on disk; re-raise a failed write's error."""
        if self._writer is not None:
            self._writer.wait()

    def close(self) -> None:
        """At the end of every run: wait for the last asynchronous write, then free the writer's snapshot
        buffers (a CPU copy of the model, kept for reuse between saves, held until exit otherwise)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        if not is_default_io(self._trainer.strategy.checkpoint_io):  # an AsyncCheckpointIO's last write lands
            self._trainer.strategy.checkpoint_io.teardown()

    # ----------------------------------------------------------------- restore
    def restart_path(self) -> Path | None:
        """After an elastic restart, the last checkpoint to resume from (None: none was written yet)."""
        path = resolve_ckpt_path(self._trainer, "last")
        if path is not None and self._trainer.is_global_zero:
            print(f"restart {os.environ.get('TORCHELASTIC_RESTART_COUNT')}: resuming from {path}", flush=True)
        return path

    def restore(self, ckpt_path: str | os.PathLike[str], full: bool, stage: str | None = None) -> Path | None:
        """Load a checkpoint: weights always; with ``full``, everything needed to resume training.

        ``ckpt_path`` is resolved (:func:`~trainer.checkpoint.resolve.resolve_ckpt_path`, ``stage`` as there)
        and recorded as the run state's ``ckpt_path`` before anything is loaded; returns it (None: with
        ``stage``, ``"last"`` before any checkpoint exists, and training starts from scratch). A plain
        PyTorch state dict sets the weights only; a Lightning 2.x checkpoint resumes as ours.
        """
        t = self._trainer
        self.wait()
        path = resolve_ckpt_path(t, ckpt_path, stage)
        if path is None:
            if stage is not None:
                return None
            raise CheckpointError(f"ckpt_path={str(ckpt_path)!r}: no such checkpoint has been saved yet")
        t.run_state.ckpt_path = str(path)
        io = t.strategy.checkpoint_io
        if type(io) in DEFAULT_IO_TYPES:  # is_default_io, without a call into plugin_io on the resume walk
            state = read_any(path)
        else:  # the user's CheckpointIO reads the file, and ours recognises it
            state = recognise(io.load_checkpoint(str(path), weights_only=None), path)
        sharded = state.pop("sharded_directory", None)
        assert t.module is not None
        if state.get("plain_weights"):
            if full and t.is_global_zero:
                print(f"{path} is a plain state dict: training starts from its weights, with fresh optimizer state")
            self._load_weights(path, state["state_dict"])
            return path
        t.metric_router.no_log("on_load_checkpoint", t.module.on_load_checkpoint)(state)
        t.hooks.callbacks_only("on_load_checkpoint", state)
        if full:  # before anything is loaded: a mismatch is one message, not an error from inside torch
            resume.check_resumable(path, state, t)
        if sharded is not None:  # weights and optimizers in one read, resharded into this run's layout
            from trainer.checkpoint.sharded import load_sharded

            assert t.strategy.module is not None
            load_sharded(sharded, t.strategy.module, t.optimizers if full else (), strict=t.module.strict_loading)
        else:
            self._load_weights(path, state["state_dict"])
        if not full:
            return path
        if sharded is None and t.strategy.lightning_restore_optimizer:
            t.strategy.load_optimizer_state_dict(state)  # Lightning's hook: the whole checkpoint
        resume.load_schedulers(path, state["lr_schedulers"], t)
        t.strategy.precision.load_state_dict(state.get("precision", {}))
        t.progress.load_state_dict(state["progress"])
        if t.max_epochs not in (None, -1) and t.current_epoch > t.max_epochs:  # Lightning's check and words
            epochs = f"current_epoch={t.current_epoch}, but you have set Trainer(max_epochs={t.max_epochs})."
            raise UserError(f"You restored a checkpoint with {epochs}")
        self.run_id = str(state.get("run_id") or self.run_id)  # the run goes on (an older file: a new one)
        if "metrics" in state:
            t.metric_router.load_state_dict(state["metrics"])
        resume.load_callback_states(state.get("callbacks", {}), t)
        if t.datamodule is not None and "datamodule" in state:
            t.hooks.datamodule(t.datamodule, "load_state_dict", state["datamodule"])  # profiled, as Lightning's
        self.resume_epoch_rng = state.get("loops", {}).get("epoch_rng")
        self.resume_loader_states = saved_states(state.get("loops", {}))
        self._resume_batches = (path, state.get("loops", {}).get("batches"))
        rngs = state.get("rng", [])
        if rngs:
            set_rng_state(rngs[min(t.global_rank, len(rngs) - 1)])
        return path

    def take_resume_epoch_rng(self) -> dict[str, Any] | None:
        """The restored epoch order, once (the first epoch after a resume replays it)."""
        epoch_rng, self.resume_epoch_rng = self.resume_epoch_rng, None
        if self._resume_batches is not None:  # the first epoch after a resume: its loader is known now
            (path, saved), self._resume_batches = self._resume_batches, None
            resume.warn_if_batches_differ(path, saved, self._trainer)
        return epoch_rng

    def _load_weights(self, path: Path, state_dict: dict[str, Any]) -> None:
        """Load the weights as Lightning's Trainer does: strictly unless the module sets ``strict_loading = False``."""
        strict = getattr(self._trainer.module, "strict_loading", True)
        try:
            self._trainer.strategy.load_model_state_dict(state_dict, strict=strict)
        except CheckpointError as err:
            raise CheckpointError(f"Cannot load the weights in {path}. {err}") from err


def _param_names(module: Any, optimizers: Iterable[Any]) -> list[list[str]]:
    """Each optimizer's parameter names in the order ``optimizer.state_dict()`` numbers them (for the converter)."""
    by_id = {id(p): name for name, p in module.named_parameters()}
    return [[by_id.get(id(p), "") for group in opt.param_groups for p in group["params"]] for opt in optimizers]
