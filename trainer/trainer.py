"""The ``Trainer``: the front. It holds the options and wires module, data, strategy and callbacks.

Each of its jobs is a room of its own: hook dispatch (:mod:`trainer.hooks`), metric routing
(:mod:`trainer.metrics.routing`), checkpoint state (:mod:`trainer.checkpoint.connector`), preemption
(:mod:`trainer.preemption`), option checks and defaults (:mod:`trainer.options`), what one entry point
does in every process (:mod:`trainer.run`) and the loops (:mod:`trainer.loops`, whose docstrings are the
hook order). The loops reach the trainer through the attributes documented here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback
from strategies.accelerators import Accelerator
from strategies.environments import SLURMEnvironment
from strategies.registry import resolve_accelerator, resolve_strategy
from trainer import arguments, options, run
from trainer.attributes import TrainerAttributes
from trainer.checkpoint.connector import CheckpointConnector
from trainer.common.env import STARTED_BY_LAUNCHER
from trainer.common.errors import refuse_url
from trainer.data.loaders import split_datamodule
from trainer.data.microbatch import MicroBatcher
from trainer.hooks import HookDispatch
from trainer.metrics.results import results_table
from trainer.metrics.routing import MetricRouter
from trainer.module import DataModule, TrainModule
from trainer.plugins import split_plugins, trainer_precision, use_plugins
from trainer.preemption import Preemption
from trainer.profilers import Profiler, resolve_profiler
from trainer.run_state import RunState

if TYPE_CHECKING:
    from strategies.base import Strategy

__all__ = ["STARTED_BY_LAUNCHER", "Trainer"]


class Trainer(TrainerAttributes):
    """Runs the forward / loss / backward / step loop of a :class:`~trainer.TrainModule`.

    Lightning's arguments come first, in Lightning's order and with its defaults (``None`` means "the
    default"; ``docs/lightning.md`` lists where geartrain differs), then geartrain's own, keyword-only.

    Every argument is described in :data:`trainer.arguments.TRAINER_ARGS` (appended to this
    docstring, so ``help(Trainer)`` shows it).

    Example:
        >>> trainer = Trainer(max_epochs=1, enable_progress_bar=False, logger=False,
        ...                   enable_checkpointing=False)
        >>> trainer.global_step
        0
    """

    __doc__ = (__doc__ or "") + arguments.TRAINER_ARGS

    @arguments.defaults_from_env
    def __init__(
        self,
        accelerator: str | Accelerator = "auto",
        strategy: str | Strategy = "auto",
        devices: int | str | list[int] = "auto",
        num_nodes: int = 1,
        precision: str | int | None = None,
        logger: bool | Callback | Iterable[Callback] | None = None,
        callbacks: Callback | Iterable[Callback] | None = None,
        fast_dev_run: bool | int = False,
        max_epochs: int | None = None,
        min_epochs: int | None = None,
        max_steps: int = -1,
        min_steps: int | None = None,
        max_time: str | timedelta | dict[str, int] | None = None,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        overfit_batches: int | float = 0.0,
        val_check_interval: int | float | None = None,
        check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int | None = None,
        log_every_n_steps: int | None = None,
        enable_checkpointing: bool | None = None,
        enable_progress_bar: bool | None = None,
        enable_model_summary: bool | None = None,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
        deterministic: bool | str | None = None,
        benchmark: bool | None = None,
        inference_mode: bool = True,
        use_distributed_sampler: bool = True,
        profiler: Profiler | str | None = None,
        detect_anomaly: bool = False,
        barebones: bool = False,
        plugins: Any = None,
        sync_batchnorm: bool = False,
        reload_dataloaders_every_n_epochs: int = 0,
        default_root_dir: str | os.PathLike[str] | None = None,
        enable_autolog_hparams: bool = True,
        model_registry: str | None = None,
        *,
        on_nonfinite: str | None = None,
        max_nonfinite_in_a_row: int = 3,
        preemption_exit_code: int | None = 0,
        slurm_requeue: bool = True,
        config: Any = None,
        micro_batch_size: int | str | None = None,
        activation_checkpointing: Iterable[type[torch.nn.Module] | str] | None = None,
        compile: bool = False,
        compile_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        arguments.check_unsupported(model_registry, enable_autolog_hparams, barebones)
        given = split_plugins(plugins, precision, sync_batchnorm)
        sync_batchnorm = sync_batchnorm or given.layer_sync is not None
        switches = arguments.resolve_switches(
            barebones=barebones,
            logger=logger,
            enable_checkpointing=enable_checkpointing,
            enable_progress_bar=enable_progress_bar,
            enable_model_summary=enable_model_summary,
            num_sanity_val_steps=num_sanity_val_steps,
            log_every_n_steps=log_every_n_steps,
            fast_dev_run=fast_dev_run,
            detect_anomaly=detect_anomaly,
            profiler=profiler,
        )
        loop = options.loop_options(
            max_epochs=max_epochs,
            max_steps=max_steps,
            min_epochs=min_epochs,
            min_steps=min_steps,
            max_time=max_time,
            overfit_batches=overfit_batches,
            val_check_interval=val_check_interval,
            check_val_every_n_epoch=check_val_every_n_epoch,
            limit_train_batches=limit_train_batches,
            limit_val_batches=limit_val_batches,
            limit_test_batches=limit_test_batches,
            limit_predict_batches=limit_predict_batches,
            num_sanity_val_steps=switches.num_sanity_val_steps,
            fast_dev_run=fast_dev_run,
            log_every_n_steps=switches.log_every_n_steps,
        )
        self._gradient_clip_algorithm_given = gradient_clip_algorithm is not None  # see TrainModule.clip_gradients
        clip_algorithm = gradient_clip_algorithm or "norm"  # checked; the attribute keeps None, as Lightning's
        options.check_step_options(
            accumulate_grad_batches, gradient_clip_val, clip_algorithm, on_nonfinite, max_nonfinite_in_a_row
        )
        arguments.check_non_negative_int("reload_dataloaders_every_n_epochs", reload_dataloaders_every_n_epochs)
        arguments.check_devices_given(devices, accelerator)
        device_kind = resolve_accelerator(accelerator)  # before devices=, as Lightning: a missing GPU is named first
        self.strategy: Strategy = resolve_strategy(
            strategy,
            devices=arguments.resolve_devices(devices),
            num_nodes=num_nodes,
            precision=trainer_precision(precision),
            accelerator=device_kind,
        )
        if isinstance(accelerator, Accelerator):
            self.strategy.accelerator = accelerator  # trainer.accelerator is this object, as in Lightning
        use_plugins(self.strategy, given)
        arguments.check_sync_batchnorm(sync_batchnorm, self.strategy)
        self.barebones, self.detect_anomaly, self.sync_batchnorm = barebones, detect_anomaly, sync_batchnorm
        #: ``False``: multi-process strategies leave the dataloaders as given (no sharding sampler).
        self.use_distributed_sampler, self.inference_mode = use_distributed_sampler, inference_mode
        self.reload_dataloaders_every_n_epochs = reload_dataloaders_every_n_epochs
        self.accumulate_grad_batches = accumulate_grad_batches
        self.gradient_clip_val, self.gradient_clip_algorithm = gradient_clip_val, gradient_clip_algorithm
        self.on_nonfinite, self.max_nonfinite_in_a_row = on_nonfinite, max_nonfinite_in_a_row
        refuse_url(default_root_dir, "Trainer(default_root_dir)")
        # A string, as Lightning's; "~/runs" is the user's home (not a folder "~" in the working directory)
        self.default_root_dir = os.path.normpath(os.path.expanduser(os.fspath(default_root_dir or os.getcwd())))
        self.deterministic = deterministic
        self.config = config
        #: Splits training batches into micro-batches (``micro_batch_size``); None when not asked for.
        self.micro_batcher = MicroBatcher(micro_batch_size) if micro_batch_size is not None else None
        self.activation_checkpointing = options.resolve_classes(activation_checkpointing or ())
        self.compile = bool(compile)
        self.compile_kwargs: dict[str, Any] = dict(compile_kwargs or {})
        arguments.set_torch_flags(deterministic, benchmark)
        default_logger, loggers = arguments.resolve_logger(switches.logger)
        self.callbacks: list[Callback] = options.default_callbacks(
            [callbacks] if isinstance(callbacks, Callback) else list(callbacks or []),
            root=Path(self.default_root_dir),
            progress_bar=switches.enable_progress_bar,
            checkpointing=switches.enable_checkpointing,
            logger=default_logger,
            fast_dev_run=loop.fast_dev_run,
            model_summary=switches.enable_model_summary,
            loggers=loggers,
            max_time=max_time,
        )
        # The rooms (documented attributes the loops use).
        #: Times actions of the run (``Trainer(profiler=...)``); a PassThroughProfiler, never called, when None.
        self.profiler: Profiler = resolve_profiler(profiler)
        #: Everything the run changes as it goes, handed to the loops (see :mod:`trainer.run_state`).
        self.run_state = RunState(loop=loop, hooks=HookDispatch(self.callbacks, self))
        #: Where ``self.log`` values go: ``callback_metrics``, the progress bar, the loggers.
        self.metric_router = MetricRouter(self._to_loggers, self._is_sanity_checking)
        # TrainModule.log's back end, bound once: it runs every step.
        self._log = self.metric_router.log
        # TrainModule.log's shortcut for the per-step call (the router empties it, never replaces it).
        self._plain_log = self.metric_router.plain
        #: Checkpoint content, saving, restoring, and where ``last.ckpt`` lives.
        self.checkpointing = CheckpointConnector(self)
        #: SIGTERM/SIGUSR1 handling (``preemption_exit_code``, ``slurm_requeue``).
        self.preemption = Preemption(preemption_exit_code, slurm_requeue)
        if isinstance(given.cluster_environment, SLURMEnvironment):  # its requeue settings are the run's
            self.preemption.use_slurm_environment(given.cluster_environment)

    # ----------------------------------------------------------------- public state
    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far."""
        return self.progress.global_step

    @property
    def current_epoch(self) -> int:
        """The epoch in progress, from 0; after it ends, the count of finished epochs (as in Lightning).

        So after ``fit(max_epochs=3)`` it is 3. Callbacks' ``on_train_epoch_end`` still sees the
        epoch that is ending.
        """
        p = self.progress
        return p.epoch + 1 if p.epoch_finished and not self.in_train_epoch_end else p.epoch

    @property
    def should_stop(self) -> bool:
        """Set to True (e.g. by early stopping) to end training after the current step."""
        return self.run_state.progress.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self.run_state.progress.should_stop = bool(value)

    # ----------------------------------------------------------------- entry points
    def fit(
        self,
        model: TrainModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | os.PathLike[str] | None = None,
        weights_only: bool | None = None,
    ) -> None:
        """Train ``model``; ``ckpt_path`` (a file, ``"last"`` or ``"best"``) resumes a run exactly.

        ``train_dataloaders``: a loader, a list or dict of loaders (combined in Lightning's
        ``"max_size_cycle"`` mode), or a :class:`~trainer.DataModule`. ``weights_only`` is accepted
        for Lightning's sake: checkpoints are always loaded with ``weights_only=True``.
        """
        model = options.unwrap_compiled(model)
        options.check_module(model)
        options.resolve_max_epochs(self.run_state.loop)
        train_dataloaders, datamodule = split_datamodule(train_dataloaders, datamodule, "fit")
        run.launch(self, "fit", model, train_dataloaders, val_dataloaders, datamodule, ckpt_path)
        if self.preempted and self.preemption_exit_code is not None:
            raise SystemExit(self.preemption.exit_status(self))

    def validate(
        self,
        model: TrainModule | None = None,
        dataloaders: Any = None,
        ckpt_path: str | os.PathLike[str] | None = None,
        verbose: bool = True,
        datamodule: DataModule | None = None,
        weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """One pass over validation data; one dict of epoch values per dataloader (table if ``verbose``).

        ``ckpt_path``: a file, or ``"best"``/``"last"`` of the preceding ``fit``; None evaluates the
        module passed with its current weights, and without one (after ``fit``) the best checkpoint, with
        a warning, as Lightning.
        """
        return self._evaluate("validate", model, dataloaders, ckpt_path, verbose, datamodule)

    def test(
        self,
        model: TrainModule | None = None,
        dataloaders: Any = None,
        ckpt_path: str | os.PathLike[str] | None = None,
        verbose: bool = True,
        datamodule: DataModule | None = None,
        weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """One pass over test data; one dict of epoch values per dataloader (see :meth:`validate`)."""
        return self._evaluate("test", model, dataloaders, ckpt_path, verbose, datamodule)

    def predict(
        self,
        model: TrainModule | None = None,
        dataloaders: Any = None,
        datamodule: DataModule | None = None,
        return_predictions: bool | None = None,
        ckpt_path: str | os.PathLike[str] | None = None,
        weights_only: bool | None = None,
    ) -> list[Any] | None:
        """``predict_step``'s outputs in order: a list, one list per loader for several.

        ``return_predictions=False`` keeps nothing and returns None (for callbacks that write outputs).
        """
        dataloaders, datamodule = split_datamodule(dataloaders, datamodule, "predict")
        keep = return_predictions is None or bool(return_predictions)
        ckpt_path = run.default_ckpt_path(self, "predict", model, ckpt_path)
        module = self._module_for(model, "predict")
        outputs = run.launch(self, "predict", module, dataloaders, None, datamodule, ckpt_path, keep)
        if not keep or outputs is None:
            return None
        return list(outputs[0]) if len(outputs) == 1 else [list(out) for out in outputs]

    def _evaluate(
        self,
        stage: str,
        model: TrainModule | None,
        dataloaders: Any,
        ckpt_path: str | os.PathLike[str] | None,
        verbose: bool,
        datamodule: DataModule | None,
    ) -> list[dict[str, float]]:
        dataloaders, datamodule = split_datamodule(dataloaders, datamodule, stage)
        ckpt_path = run.default_ckpt_path(self, stage, model, ckpt_path)
        module = self._module_for(model, stage)
        results: list[dict[str, float]] = run.launch(self, stage, module, dataloaders, None, datamodule, ckpt_path)
        if verbose and results is not None and self.is_global_zero:
            print(results_table(stage, results))
        return results

    def save_checkpoint(
        self,
        filepath: str | os.PathLike[str],
        weights_only: bool | None = False,
        storage_options: Any = None,
        async_: bool = False,
        *,
        also_at: Iterable[str | os.PathLike[str]] = (),
        replaces: Iterable[str | os.PathLike[str]] = (),
    ) -> None:
        """Write a checkpoint of the run (rank 0 writes; every rank must call this).

        With ``async_=True`` the call returns once the state is copied into CPU memory and a
        background thread writes the file (see :class:`~trainer.checkpoint.files.AsyncCheckpointWriter`):
        training stalls for the copy instead of the write. Writes never overlap, and the trainer
        waits for the last one before a run ends or a checkpoint is read back.

        ``also_at``: the same file is also placed at these paths (hard link, else copy), and
        ``replaces``: these files are deleted, both only once the file is on disk, in that order
        (see :func:`~trainer.checkpoint.files.write_checkpoint`); a failed write deletes nothing.
        ``storage_options`` go to a checkpoint IO of the user's (``Trainer(plugins=[io])``).
        """
        if storage_options is not None and type(self.strategy.checkpoint_io).__name__ == "TorchCheckpointIO":
            raise ValueError(
                "save_checkpoint(storage_options=...): geartrain's own checkpoint IO writes a local file "
                "(atomically, loadable with weights_only=True) and takes no storage options; leave it None, or "
                "give Trainer(plugins=[a CheckpointIO of yours]) that takes them"
            )
        self.checkpointing.save(filepath, bool(weights_only), async_, also_at, replaces, storage_options)

    def wait_for_checkpoints(self) -> None:
        """Block until asynchronous checkpoint writes are on disk; re-raise a failed write's error."""
        self.checkpointing.wait()

    def log_metrics(self, metrics: Mapping[str, torch.Tensor | float], step: int | None = None) -> None:
        """Hand values computed outside ``self.log`` (learning rates, throughput) to the loggers.

        For callbacks: the values reach every logger exactly like logged metrics do, at x = ``step``
        (default: the index of the last optimizer step). They do not enter ``callback_metrics``.
        """
        values = {key: torch.as_tensor(value) for key, value in metrics.items()}
        # As a Lightning callback's logger.log_metrics call: the row carries no ``epoch`` of its own.
        self.metric_router.emit(values, max(self.global_step - 1, 0) if step is None else step, with_epoch=False)

    def run_trial(self, callback: Callback, steps: int, reload_dataloaders: bool = False) -> None:
        """Train ``steps`` steps with only ``callback`` listening, then restore the run exactly (finders use it:
        :func:`trainer.tuner.trial.run_trial`)."""
        from trainer.tuner.trial import run_trial

        run_trial(self, callback, steps, reload_dataloaders)

    def _to_loggers(self, metrics: dict[str, torch.Tensor], step: int, with_epoch: bool = True) -> None:
        epoch = {"epoch": torch.tensor(self.current_epoch)} if with_epoch else {}  # Lightning's rows carry it
        self.hooks.callbacks_only("on_log_metrics", {**epoch, **metrics}, step)

    def _is_sanity_checking(self) -> bool:
        return self.run_state.sanity_checking

    def _module_for(self, module: TrainModule | None, stage: str) -> TrainModule:
        module = options.unwrap_compiled(module) if module is not None else self.module
        if module is None:  # Lightning's error and words, so code catching its TypeError catches this
            msg = f"`Trainer.{stage}()` requires a `LightningModule` when it hasn't been passed in a previous run"
            raise TypeError(f"{msg}: pass the module, trainer.{stage}(model, ...)")
        options.check_is_module(module, stage)
        return module
