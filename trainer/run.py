"""What one entry point (``fit``/``validate``/``test``/``predict``) does in every process.

:func:`launch` hands :func:`run_stage` to the strategy, which runs it here or in the processes it
starts (or joins). :func:`run_stage` sets up (data module, module, callbacks, strategy, optimizers,
a checkpoint to restore), runs the stage's loop and tears down, also after an exception. When the
stage ran in processes the strategy started, :func:`adopt` copies rank 0's end state into the
caller's trainer and module, so code after ``fit`` reads the same on every strategy.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import warnings
from collections.abc import Iterable, MutableMapping
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import callback_states
from trainer import arguments, loops
from trainer.common import lightning_shared
from trainer.common.env import STARTED_BY_LAUNCHER
from trainer.common.errors import Interrupted, Preempted, TunerExit
from trainer.common.loaders import shut_down_workers
from trainer.common.state_dict import load_module_state
from trainer.common.tree import apply_to_tensors
from trainer.data.loaders import resolve_loaders, results_per_loader
from trainer.hooks import is_overridden
from trainer.hparams import clean_namespace
from trainer.lazy import materialize_lazy
from trainer.loops.step import ManualOptimizer, manual_backward
from trainer.optim import check_optimization_mode, parse_optimizers
from trainer.options import check_checkpoint_folders
from trainer.state import TrainerFn, TrainerStatus

if TYPE_CHECKING:
    from trainer.module import DataModule, TrainModule
    from trainer.trainer import Trainer

__all__ = ["FITS_STARTED", "adopt", "default_ckpt_path", "final_state", "launch", "run_stage"]

#: How many ``fit`` calls this process has started (the ``geartrain`` command's Ctrl-C line reads it).
FITS_STARTED = [0]


def launch(trainer: Trainer, stage: str, module: TrainModule, *rest: Any) -> Any:
    """Run ``stage`` in every process the strategy uses; return rank 0's output."""
    from strategies.relaunch import current_launcher

    # Ranks started for another job (a sweep's previous one) or that have all ended: their group is left
    # now, so this stage never syncs over it, whatever its strategy (a one-process job's metrics would).
    current_launcher()
    state = trainer.run_state
    state.last_fn, state.status = stage, TrainerStatus.RUNNING
    if stage == "fit":
        FITS_STARTED[0] += 1
        # A new fit: the state adopted from an earlier one, and where an earlier one stopped, are stale.
        trainer.checkpointing.adopted = trainer.checkpointing.resume_point = None
    hparams = getattr(module, "hparams", None)
    if isinstance(hparams, MutableMapping):  # as Lightning's: what pickle cannot write leaves, with a warning
        clean_namespace(hparams)
    try:
        output, final = trainer.strategy.launch(run_stage, trainer, stage, module, *rest)
    except Interrupted as err:  # a signal stopped the processes the strategy started before they saved
        state.status = TrainerStatus.INTERRUPTED
        raise Interrupted(f"{err} ({trainer.preemption.newest_checkpoint(trainer)})", err.signal) from None
    except KeyboardInterrupt:
        # Lightning's ending: the run was torn down (on_exception ran), the process exits with status 1.
        # A Ctrl-C during fit does not get here: the run saves at the step and ends (trainer.preemption).
        state.status = TrainerStatus.INTERRUPTED
        if trainer.is_global_zero:
            print("\nDetected KeyboardInterrupt, attempting graceful shutdown ...", file=sys.stderr, flush=True)
        sys.exit(1)
    except BaseException:
        state.status = TrainerStatus.INTERRUPTED
        raise
    if final["pid"] != os.getpid():
        adopt(trainer, module, final)
    state.status = TrainerStatus.INTERRUPTED if trainer.preempted else TrainerStatus.FINISHED
    return output


def run_stage(
    trainer: Trainer,
    stage: str,
    module: TrainModule,
    loader: Iterable[Any] | None,
    val_loader: Iterable[Any] | None,
    datamodule: DataModule | None,
    ckpt_path: str | os.PathLike[str] | None,
    keep_predictions: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """Everything one entry point does, in every process: set up, run the loop, tear down.

    Returns ``(output, end state)``; :func:`launch` uses the end state when this ran elsewhere.
    Validation and test output one dict of values per loader, predict one list of outputs per loader.
    """
    t, state = trainer, trainer.run_state
    state.fn, state.module, state.datamodule = stage, module, datamodule
    state.last_fn, state.status, state.running_stage = (
        stage,
        TrainerStatus.RUNNING,
        "train" if stage == "fit" else stage,
    )
    # Prepared when first needed (``estimated_stepping_batches`` in configure_optimizers may ask first).
    for key in ("fit", "validate") if stage == "fit" else (stage,):
        state.loaders.pop(key, None)  # other stages' loaders stay readable (``trainer.test_dataloaders``)
    if stage == "fit":  # requested when needed (trainer/data/fit_loaders.py)
        state.val_loaders_epoch, state.num_val_batches, state.num_sanity_val_batches = -math.inf, [], []
    state.given_loaders, state.ckpt_path = {stage: loader}, None
    # Each entry point starts with no metrics, as Lightning's (a resumed fit restores its own).
    t.metric_router.restore(({}, {}, {}))
    t.metric_router.predicting = stage == "predict"  # self.log is refused there in Lightning's predict words
    if stage == "fit":
        t.checkpointing.resume_point = None
    module.trainer = t  # and its child modules of this kind, as in Lightning (configure_callbacks sees it)
    if datamodule is not None:
        datamodule.trainer = t
    _attach_module_callbacks(t, module)
    state.hooks.bind(module)
    t.strategy.setup_environment()
    lightning_shared.share(t.strategy.global_rank)  # Lightning's strategies set lightning_utilities' rank here
    if t.strategy.world_size > 1:
        # Rank 0's choice holds everywhere (a "last" that ranks started later could resolve otherwise).
        ckpt_path = t.strategy.broadcast(ckpt_path)
    try:
        _prepare_data(t, module, datamodule)
        # ``stage=`` by name, as Lightning passes it; data module, callbacks, module (trainer/hook_order.py)
        if datamodule is not None:
            state.hooks.datamodule(datamodule, "setup", stage=TrainerFn(stage))
        state.hooks.callbacks_only("setup", stage=TrainerFn(stage))
        if stage == "fit":  # the checkpoint folders are known now (ModelCheckpoint.setup)
            check_checkpoint_folders(t)
        state.hooks.module("setup", stage=TrainerFn(stage))
        # After the callbacks' setup: the loggers know their folder, where the report and traces go.
        t.profiler.global_rank = t.strategy.global_rank
        t.profiler._lightning_module = module  # as Lightning's trainer: the PyTorch profiler reads the stage's batches
        t.profiler.setup(stage, local_rank=t.strategy.local_rank, log_dir=t.log_dir)
        t.strategy.connect(module)  # a model-parallel strategy's device_mesh, for configure_model
        # Before the strategy wraps (or shards) the module, as Lightning; layers made here get the
        # precision's dtype ("64-true": float64), as Lightning's module_init_context gives them.
        # Each only where overridden (Lightning's rule: its is_overridden, which sees through wrappers).
        with t.strategy.precision.module_init_context():
            if is_overridden("configure_sharded_model", module):
                module.configure_sharded_model()
            if is_overridden("configure_model", module):
                module.configure_model()
        materialize_lazy(t, module, loader)  # lazy layers get their shapes before the strategy wraps them
        _apply_memory_options(t, module, stage)
        arguments.convert_sync_batchnorm(module, t.sync_batchnorm, t.strategy.world_size)
        t.strategy.setup(module)
        if t.compile:
            t.strategy.compile_model(**t.compile_kwargs)
        if stage == "fit":
            with t.profiler.profile("configure_optimizers"):
                _configure_optimizers(t, module)
        if ckpt_path is None and stage == "fit" and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
            ckpt_path = t.checkpointing.restart_path()
        if ckpt_path is not None:  # resolved and recorded in state.ckpt_path; "last" with none yet: nothing
            t.checkpointing.restore(ckpt_path, full=(stage == "fit"), stage=stage)
        if stage == "fit":
            if t.strategy.world_size > 1:  # each rank made its own: rank 0's names the run's files
                t.checkpointing.run_id = t.strategy.broadcast(t.checkpointing.run_id)
            t.preemption.install(t.strategy)
            state.given_loaders = {"fit": loader, "validate": val_loader}
            with arguments.anomaly_context(t.detect_anomaly):
                loops.fit_loop(t, state)
            t.strategy.sync_buffers()  # every rank keeps rank 0's buffers, also when fit ended without validating
            state.status = TrainerStatus.FINISHED
            return None, final_state(t, stage)
        module.zero_grad()  # as Lightning's stage starts (fit: after on_fit_start, in the fit loop)
        if stage != "predict":
            loops.evaluation.require_step(module, stage)
        if state.loop.limits[stage] in (0, 0.0):  # as Lightning: no data is requested and no loop runs
            return (None if stage == "predict" else []), final_state(t, stage)
        loaders = state.loaders[stage] = resolve_loaders(t, stage, loader)
        assert isinstance(loaders, list)
        if stage == "predict":
            return loops.predict_loop(t, state, keep_predictions), final_state(t, stage)
        metrics = {k: float(v) for k, v in loops.eval_loop(t, state, stage).items()}
        return results_per_loader(metrics, len(loaders), t.metric_router.loader_keys), final_state(t, stage)
    except Preempted:
        t.preemption.preempted = True
        state.status = TrainerStatus.INTERRUPTED
        return None, final_state(t, "fit")
    except TunerExit:  # a finder the Tuner hosted has its result: the stage ends here, as Lightning's
        state.status = TrainerStatus.FINISHED
        return None, final_state(t, stage)
    except BaseException as exc:
        state.status = TrainerStatus.INTERRUPTED
        state.hooks.callbacks_only("on_exception", exc)
        module.on_exception(exc)
        if datamodule is not None:
            datamodule.on_exception(exc)
        t.strategy.on_exception(exc)
        raise
    finally:
        state.running_stage = None
        t.preemption.restore()
        if datamodule is not None:
            state.hooks.datamodule(datamodule, "teardown", stage=TrainerFn(stage))
        state.hooks.callbacks_only(
            "teardown", stage=TrainerFn(stage)
        )  # data module, callbacks, module (trainer/hook_order.py)
        t.checkpointing.close()
        state.hooks.module("teardown", stage=TrainerFn(stage))
        t.strategy.teardown()
        for used in ("fit", "validate") if stage == "fit" else (stage,):  # as Lightning: no worker outlives its run
            shut_down_workers(state.loaders.get(used))
        t.profiler.describe()  # rank 0 prints the report and writes it to the log directory
        t.profiler.teardown(stage)
        state.fn = None


def default_ckpt_path(
    trainer: Trainer, stage: str, model: TrainModule | None, ckpt_path: str | os.PathLike[str] | None
) -> str | os.PathLike[str] | None:
    """Lightning's rule for ``validate``/``test``/``predict``: without a model and a ``ckpt_path``, after a run
    that connected a module, the best checkpoint of the previous ``fit`` is evaluated, said in Lightning's
    warning. With a model passed, its current weights are (None stays None)."""
    if ckpt_path is not None or model is not None or trainer.module is None:
        return ckpt_path
    if trainer.is_global_zero:
        warnings.warn(
            f"`.{stage}(ckpt_path=None)` was called without a model. The best model of the previous `fit` call will "
            f"be used. You can pass `.{stage}(ckpt_path='best')` to use the best model or `.{stage}(ckpt_path='last')` "
            "to use the last model. If you pass a value, this warning will be silenced.",
            stacklevel=4,
        )
    return "best"


def final_state(trainer: Trainer, stage: str) -> dict[str, Any]:
    """What :func:`adopt` needs, taken in every process before the strategy tears down."""
    t, state, cpu = trainer, trainer.run_state, torch.device("cpu")
    launched = os.environ.get(STARTED_BY_LAUNCHER) == "1"
    return {
        "pid": os.getpid(),
        "preempted": t.preempted,
        # Full weights, needed only when they travel back to the process that started this one
        # (under FSDP gathering them is a collective: every rank decides alike, from the env).
        "state_dict": t.strategy.model_state_dict() if stage == "fit" and launched else None,
        # What the caller's save_checkpoint needs beyond weights and counters (a collective: all ranks).
        "training_state": (
            apply_to_tensors(t.checkpointing.training_state(), lambda x: x.detach().to(cpu))
            if stage == "fit" and launched
            else None
        ),
        "resume_point": (
            apply_to_tensors(t.checkpointing.resume_point, lambda x: x.detach().to(cpu))
            if stage == "fit" and launched and t.checkpointing.resume_point is not None
            else None
        ),
        "run_id": t.checkpointing.run_id,
        "progress": state.progress.state_dict(),
        # Only where the stage ran in processes the strategy started (adopt reads them; Lightning calls no
        # callback's state_dict at a stage's end).
        "callbacks": callback_states(t.callbacks) if launched else {},
        "metrics": [
            {k: v.detach().to(cpu) for k, v in metrics.items()}
            for metrics in (t.callback_metrics, t.logged_metrics, t.metric_router.progress_bar_metrics)
        ],
    }


def adopt(trainer: Trainer, module: TrainModule, final: dict[str, Any]) -> None:
    """Copy rank 0's end state, returned from another process, into ``trainer`` and ``module``."""
    state = trainer.run_state
    if final["state_dict"] is not None:
        load_module_state(module, final["state_dict"])
    state.module = module
    module._trainer = trainer  # configure_optimizers (below) may read self.trainer, as in the workers
    if final["training_state"] is not None:
        trainer.checkpointing.adopted = final["training_state"]
        trainer.checkpointing.resume_point = final["resume_point"]
        _adopt_optimizers(trainer, module, final["training_state"])
    trainer.checkpointing.run_id = final["run_id"]
    trainer.preemption.preempted = final["preempted"]
    state.progress.load_state_dict(final["progress"])
    for cb in trainer.callbacks:
        if cb.state_key in final["callbacks"]:
            cb.load_state_dict(final["callbacks"][cb.state_key])
    router = trainer.metric_router
    router.callback_metrics, router.logged_metrics, router.progress_bar_metrics = final["metrics"]


def _adopt_optimizers(trainer: Trainer, module: TrainModule, state: dict[str, Any]) -> None:
    """The caller's ``trainer.optimizers`` and schedulers, as Lightning's are after fit: the module's own,
    holding rank 0's end state (the processes that trained them are gone)."""
    optimizers, schedulers = parse_optimizers(
        module.configure_optimizers(), module.automatic_optimization, is_overridden("lr_scheduler_step", module)
    )
    try:
        for opt, opt_state in zip(optimizers, state["optimizer_states"], strict=True):
            opt.load_state_dict(opt_state)
        for cfg, sched_state in zip(schedulers, state["lr_schedulers"], strict=True):
            cfg.scheduler.load_state_dict(sched_state)
    except (ValueError, KeyError) as err:
        warnings.warn(f"trainer.optimizers after fit: rank 0's optimizer state did not load here ({err})", stacklevel=3)
        return
    trainer.run_state.optimizers, trainer.run_state.lr_scheduler_configs = optimizers, schedulers


def _attach_module_callbacks(trainer: Trainer, module: TrainModule) -> None:
    """Add ``module.configure_callbacks()``: each replaces the trainer's callbacks of its type (Lightning's rule),
    and checkpoint callbacks go last, so they see what the others logged."""
    from callbacks.base import Callback
    from callbacks.checkpoint import ModelCheckpoint
    from trainer.hooks import HookDispatch

    extra = trainer.metric_router.no_log("configure_callbacks", module.configure_callbacks)()
    if not extra:
        return
    added = [extra] if isinstance(extra, Callback) else list(extra)
    replaced = {type(cb) for cb in added}
    callbacks = [cb for cb in trainer.callbacks if type(cb) not in replaced] + added
    callbacks.sort(key=lambda cb: isinstance(cb, ModelCheckpoint))  # stable: checkpointing last
    trainer.callbacks[:] = callbacks
    trainer.run_state.hooks = HookDispatch(trainer.callbacks, trainer)


def _prepare_data(trainer: Trainer, module: TrainModule, datamodule: DataModule | None) -> None:
    """``prepare_data`` on local rank 0 of each node (global rank 0 with ``prepare_data_per_node=False``),
    data module first, while the other processes wait at a barrier; ``setup`` then runs everywhere."""
    strategy = trainer.strategy
    for owner in (datamodule, module):
        if owner is None:
            continue
        rank = strategy.local_rank if owner.prepare_data_per_node else strategy.global_rank
        if rank == 0 and owner is datamodule:
            trainer.run_state.hooks.datamodule(owner, "prepare_data")  # profiled, as Lightning's
        elif rank == 0:
            owner.prepare_data()
    strategy.barrier("prepare_data")


def _apply_memory_options(trainer: Trainer, module: TrainModule, stage: str) -> None:
    """Activation checkpointing (before the strategy wraps the module) and micro-batching checks."""
    if trainer.activation_checkpointing:
        found = trainer.strategy.apply_activation_checkpointing(module, trainer.activation_checkpointing)
        if not found:
            names = ", ".join(c.__qualname__ for c in trainer.activation_checkpointing)
            warnings.warn(f"activation_checkpointing: {type(module).__name__} has no {names} submodule", stacklevel=2)
    if stage == "fit" and trainer.micro_batcher is not None and not module.automatic_optimization:
        raise ValueError("micro_batch_size needs automatic optimisation; split batches yourself in training_step")


def _configure_optimizers(trainer: Trainer, module: TrainModule) -> None:
    optimizers, schedulers = parse_optimizers(
        trainer.metric_router.no_log("configure_optimizers", module.configure_optimizers)(),
        module.automatic_optimization,
        is_overridden("lr_scheduler_step", module),
    )
    check_optimization_mode(module, optimizers, trainer.gradient_clip_val, trainer.accumulate_grad_batches)
    state = trainer.run_state
    state.optimizers = trainer.strategy.setup_optimizers(optimizers)
    state.lr_scheduler_configs = schedulers
    state.window.has_loss = state.window.nonfinite = False
    state.optimizer_handles = [ManualOptimizer(trainer, opt, state.window) for opt in state.optimizers]
    state.manual_backward = functools.partial(manual_backward, trainer)
