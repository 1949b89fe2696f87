"""The ``Trainer``: holds the options, wires module, data, strategy and callbacks, runs the loops.

The loops themselves live in :mod:`trainer.loops`; their docstrings are the hook order.
"""

from __future__ import annotations

import functools
import math
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback, overridden_hooks
from trainer import loops
from trainer.checkpoint import (
    FORMAT_NAME,
    FORMAT_VERSION,
    AsyncCheckpointWriter,
    CheckpointError,
    load_checkpoint,
    rng_state,
    set_rng_state,
    to_plain,
    write_checkpoint,
)
from trainer.common.env import STARTED_BY_LAUNCHER
from trainer.data import ResumableBatchSampler, add_worker_seeding, make_resumable
from trainer.metrics import MetricStore
from trainer.microbatch import MicroBatcher
from trainer.module import DataModule, TrainModule
from trainer.optim import SchedulerConfig, parse_optimizers
from trainer.progress import Progress
from trainer.utils import batch_size_of

if TYPE_CHECKING:
    from strategies.base import Strategy

__all__ = ["STARTED_BY_LAUNCHER", "Trainer"]

_LOADER_METHODS = {
    "fit": "train_dataloader",
    "validate": "val_dataloader",
    "test": "test_dataloader",
    "predict": "predict_dataloader",
}


class Trainer:
    """Runs the forward / loss / backward / step loop of a :class:`~trainer.TrainModule`.

    Args:
        strategy: ``"auto"``, ``"single"``, ``"dp"``, ``"ddp"``, ``"amp"``, ``"fsdp"`` or an instance.
        devices: devices (processes) per node for multi-device strategies; ``"auto"`` for all.
        num_nodes: machines taking part.
        precision: ``"32-true"``, ``"16-mixed"``, ``"bf16-mixed"``, ``"bf16-true"``; ``None`` keeps
            the strategy's default (float32, mixed for ``"amp"``).
        max_epochs: stop after this many epochs; ``-1`` for no limit. If ``max_epochs`` is ``None``
            and ``max_steps`` is ``-1``, training runs 1000 epochs (Lightning's rule).
        max_steps: stop after this many optimizer steps; ``-1`` for no limit.
        accumulate_grad_batches: micro-batches per optimizer step; the loss is divided by it.
        gradient_clip_val: clip gradients to this total norm (or value); ``None`` disables.
        gradient_clip_algorithm: ``"norm"`` or ``"value"``.
        val_check_interval: validate every this many training batches (int) or fraction of an epoch
            (float); ``None`` means once at the end of the epoch.
        check_val_every_n_epoch: validate only in every n-th epoch.
        limit_train_batches: use only this many (int) or this fraction (float) of training batches.
        limit_val_batches: the same for validation (``limit_test_batches``, ``limit_predict_batches``
            likewise).
        num_sanity_val_steps: validation batches run before training to catch bugs early (not logged).
        fast_dev_run: ``True`` (1) or n: run n batches of each stage once, without loggers and
            checkpoints, to check that the code runs.
        log_every_n_steps: how often step-level values go to the loggers.
        callbacks: extra callbacks, run in the order given after the defaults.
        default_root_dir: where default loggers and checkpoints write.
        deterministic: ask torch for deterministic algorithms (errors where none exists).
        enable_progress_bar: add a :class:`~callbacks.ProgressBar` unless one is given.
        enable_checkpointing: add a :class:`~callbacks.ModelCheckpoint` (last) unless one is given.
        logger: add a :class:`~callbacks.TensorBoardLogger` unless a logger callback is given.
        on_nonfinite: what a NaN/inf training loss does: ``"raise"`` (naming epoch, step and batch),
            ``"skip"`` (drop that optimizer step: gradients zeroed, no scheduler move, counted in
            ``train/nonfinite_skipped``), ``"warn"``, or ``None`` (no check; the check reads the loss
            on the host, one device sync per step, so it is off unless asked for).
        max_nonfinite_in_a_row: with ``"skip"``, raise after this many skipped steps in a row.
        preemption_exit_code: on SIGTERM or SIGUSR1 the trainer finishes the optimizer step, saves
            ``last.ckpt`` and exits the process with this code; ``None`` returns from ``fit`` instead
            (``trainer.preempted`` tells).
        slurm_requeue: on SIGUSR1 under Slurm (``SLURM_JOB_ID`` set), ask Slurm to requeue the job
            (``scontrol requeue``) after saving.
        config: the resolved run configuration (Hydra's), saved in checkpoints and as hparams.
        micro_batch_size: split every training batch into micro-batches of this many samples and
            accumulate, so the step equals the whole batch's; ``"auto"`` halves it on out-of-memory
            and retries the batch (see :mod:`trainer.microbatch`). ``None``: no splitting.
        activation_checkpointing: module classes (or their dotted paths) whose activations are
            recomputed in backward instead of stored (see ``Strategy.apply_activation_checkpointing``).
        compile: run the module's forward through ``torch.compile`` (on any strategy, through
            :meth:`~strategies.Strategy.compile_model`). The module object and its ``state_dict``
            keys stay as they are, so checkpoints carry no ``_orig_mod.`` prefixes. What is compiled is
            the module's ``__call__``: steps that call ``self(x)`` run compiled.
        compile_kwargs: keyword arguments for ``torch.compile`` (``mode``, ``backend``, ``dynamic``, ...).

    Example:
        >>> trainer = Trainer(max_epochs=1, enable_progress_bar=False, logger=False,
        ...                   enable_checkpointing=False)
        >>> trainer.global_step
        0
    """

    def __init__(
        self,
        *,
        strategy: str | Strategy = "auto",
        devices: int | str = "auto",
        num_nodes: int = 1,
        precision: str | None = None,
        max_epochs: int | None = None,
        max_steps: int = -1,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
        val_check_interval: int | float | None = None,
        check_val_every_n_epoch: int = 1,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        num_sanity_val_steps: int = 2,
        fast_dev_run: bool | int = False,
        log_every_n_steps: int = 50,
        callbacks: Iterable[Callback] | None = None,
        default_root_dir: str | os.PathLike[str] = ".",
        deterministic: bool = False,
        enable_progress_bar: bool = True,
        enable_checkpointing: bool = True,
        logger: bool = True,
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
        _check_positive_int("accumulate_grad_batches", accumulate_grad_batches)
        _check_positive_int("log_every_n_steps", log_every_n_steps)
        _check_positive_int("check_val_every_n_epoch", check_val_every_n_epoch)
        if gradient_clip_algorithm not in ("norm", "value"):
            raise ValueError(f"gradient_clip_algorithm must be 'norm' or 'value', got {gradient_clip_algorithm!r}")
        if gradient_clip_val is not None and gradient_clip_val <= 0:
            raise ValueError(f"gradient_clip_val must be > 0 or None, got {gradient_clip_val}")
        if max_epochs is None and max_steps == -1:
            max_epochs = 1000  # Lightning's rule; -1 means "no limit" explicitly
        if max_epochs is not None and max_epochs < -1:
            raise ValueError(f"max_epochs must be >= -1 or None, got {max_epochs}")
        if max_steps < -1:
            raise ValueError(f"max_steps must be >= -1, got {max_steps}")
        if val_check_interval is not None:
            if isinstance(val_check_interval, float) and not 0.0 < val_check_interval <= 1.0:
                raise ValueError(f"val_check_interval as a fraction must be in (0, 1], got {val_check_interval}")
            if isinstance(val_check_interval, int) and val_check_interval < 1:
                raise ValueError(f"val_check_interval as a batch count must be >= 1, got {val_check_interval}")
        for name, limit in (
            ("limit_train_batches", limit_train_batches),
            ("limit_val_batches", limit_val_batches),
            ("limit_test_batches", limit_test_batches),
            ("limit_predict_batches", limit_predict_batches),
        ):
            _check_limit(name, limit)

        if on_nonfinite not in (None, "raise", "skip", "warn"):
            raise ValueError(f"on_nonfinite must be 'raise', 'skip', 'warn' or None, got {on_nonfinite!r}")
        _check_positive_int("max_nonfinite_in_a_row", max_nonfinite_in_a_row)
        self.on_nonfinite = on_nonfinite
        self.max_nonfinite_in_a_row = max_nonfinite_in_a_row
        self.preemption_exit_code = preemption_exit_code
        self.slurm_requeue = slurm_requeue
        self.preempted = False
        self._preempt_signal: int | None = None
        # Set per fit: whether ranks must agree on a preemption (one collective per step).
        self._preempt_agree = False
        self._next_preempt_check = 0
        self._preempt_checked_at: tuple[float, int] | None = None
        self._resume_epoch_rng: dict[str, Any] | None = None

        self.fast_dev_run = int(fast_dev_run)
        if self.fast_dev_run < 0:
            raise ValueError(f"fast_dev_run must be a bool or a positive int, got {fast_dev_run}")
        if self.fast_dev_run:
            n = self.fast_dev_run
            max_epochs, max_steps = 1, n
            limit_train_batches = limit_val_batches = limit_test_batches = limit_predict_batches = n
            num_sanity_val_steps, val_check_interval, check_val_every_n_epoch = 0, None, 1
            log_every_n_steps = 1

        # Imported here: strategies import trainer.utils, so a module-level import would be circular.
        from strategies.registry import resolve_strategy

        self.strategy: Strategy = resolve_strategy(strategy, devices=devices, num_nodes=num_nodes, precision=precision)
        self.max_epochs = max_epochs
        self.max_steps = max_steps
        self.accumulate_grad_batches = accumulate_grad_batches
        self.gradient_clip_val = gradient_clip_val
        self.gradient_clip_algorithm = gradient_clip_algorithm
        self.val_check_interval = val_check_interval
        self.check_val_every_n_epoch = check_val_every_n_epoch
        self.limits: dict[str, int | float | None] = {
            "fit": limit_train_batches,
            "validate": limit_val_batches,
            "test": limit_test_batches,
            "predict": limit_predict_batches,
        }
        self.num_sanity_val_steps = num_sanity_val_steps
        self.log_every_n_steps = log_every_n_steps
        self.default_root_dir = Path(default_root_dir)
        self.deterministic = deterministic
        self.config = config
        self._micro_batcher = MicroBatcher(micro_batch_size) if micro_batch_size is not None else None
        self.activation_checkpointing = _resolve_classes(activation_checkpointing or ())
        self.compile = bool(compile)
        self.compile_kwargs: dict[str, Any] = dict(compile_kwargs or {})
        if deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)

        self.callbacks: list[Callback] = self._default_callbacks(
            list(callbacks or []), enable_progress_bar, enable_checkpointing, logger
        )
        self._hooks = overridden_hooks(self.callbacks)

        self.progress = Progress()
        self.module: TrainModule | None = None
        self.datamodule: DataModule | None = None
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_scheduler_configs: list[SchedulerConfig] = []
        self._optimizer_handles: list[loops.ManualOptimizer] = []
        #: Latest value of everything logged (tensors), read by checkpointing and early stopping.
        self.callback_metrics: dict[str, torch.Tensor] = {}
        #: Latest values handed to the loggers.
        self.logged_metrics: dict[str, torch.Tensor] = {}
        #: Latest values logged with ``prog_bar=True``.
        self.progress_bar_metrics: dict[str, torch.Tensor] = {}
        self.stage: str | None = None
        self.sanity_checking = False
        self._store: MetricStore | None = None
        self._log_defaults = (True, False)
        self._current_batch: Any = None
        self._epoch_keys: set[str] = set()  # callback_metrics keys updated in this training epoch
        self._batch_size_cache: tuple[Any, int] = (None, 1)  # (batch, its size); see _current_batch_size
        self._checkpoint_writer: AsyncCheckpointWriter | None = None  # made on the first async save
        self._window_has_loss = False  # a micro-batch of the current accumulation window had a loss
        self._window_nonfinite = False  # ... had a non-finite loss (on_nonfinite="skip")
        self.num_training_batches: float = math.inf
        self.num_val_batches: float = 0
        self._loaders: dict[str, Iterable[Any] | None] = {}
        #: hook name -> (module's bound hook or None, callbacks' bound hooks); reset per run.
        self._dispatch: dict[str, tuple[Callable[..., Any] | None, tuple[Callable[..., Any], ...]]] = {}

    # ----------------------------------------------------------------- public state
    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far."""
        return self.progress.global_step

    @property
    def current_epoch(self) -> int:
        """The epoch in progress, from 0."""
        return self.progress.epoch

    @property
    def should_stop(self) -> bool:
        """Set to True (e.g. by early stopping) to end training after the current step."""
        return self.progress.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self.progress.should_stop = bool(value)

    @property
    def is_global_zero(self) -> bool:
        """True on the process that writes logs and checkpoints."""
        return self.strategy.is_global_zero

    @property
    def world_size(self) -> int:
        """Number of training processes."""
        return self.strategy.world_size

    @property
    def global_rank(self) -> int:
        """This process's rank."""
        return self.strategy.global_rank

    @property
    def log_dir(self) -> Path:
        """Where loggers write: the first logger callback's directory, else ``default_root_dir``."""
        for cb in self.callbacks:
            log_dir = getattr(cb, "log_dir", None)
            if log_dir is not None:
                return Path(log_dir)
        return self.default_root_dir

    @property
    def checkpoint_callback(self) -> Callback | None:
        """The first callback that saves checkpoints (has ``best_model_path``), if any."""
        for cb in self.callbacks:
            if hasattr(cb, "best_model_path"):
                return cb
        return None

    # ----------------------------------------------------------------- entry points
    def fit(
        self,
        module: TrainModule,
        train_dataloaders: Iterable[Any] | None = None,
        val_dataloaders: Iterable[Any] | None = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | os.PathLike[str] | None = None,
    ) -> None:
        """Train ``module``; ``ckpt_path`` (a file, or ``"last"``) resumes a run exactly where it was."""
        _check_module(module)
        self._launch("fit", module, train_dataloaders, val_dataloaders, datamodule, ckpt_path)
        if self.preempted and self.preemption_exit_code is not None:
            raise SystemExit(self.preemption_exit_code)

    def validate(
        self,
        module: TrainModule | None = None,
        dataloaders: Iterable[Any] | None = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | os.PathLike[str] | None = None,
    ) -> dict[str, float]:
        """Run one pass over validation data; return the epoch-level metrics."""
        result: dict[str, float] = self._launch(
            "validate", self._module_for(module), dataloaders, None, datamodule, ckpt_path
        )
        return result

    def test(
        self,
        module: TrainModule | None = None,
        dataloaders: Iterable[Any] | None = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | os.PathLike[str] | None = None,
    ) -> dict[str, float]:
        """Run one pass over test data; return the epoch-level metrics."""
        result: dict[str, float] = self._launch(
            "test", self._module_for(module), dataloaders, None, datamodule, ckpt_path
        )
        return result

    def predict(
        self,
        module: TrainModule | None = None,
        dataloaders: Iterable[Any] | None = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | os.PathLike[str] | None = None,
    ) -> list[Any]:
        """Return ``predict_step``'s output for every batch, in order."""
        result: list[Any] = self._launch("predict", self._module_for(module), dataloaders, None, datamodule, ckpt_path)
        return result

    def save_checkpoint(
        self,
        path: str | os.PathLike[str],
        weights_only: bool = False,
        async_: bool = False,
        *,
        also_at: Iterable[str | os.PathLike[str]] = (),
        replaces: Iterable[str | os.PathLike[str]] = (),
    ) -> None:
        """Write a checkpoint of the run (rank 0 writes; every rank must call this).

        With ``async_=True`` the call returns once the state is copied into CPU memory and a
        background thread writes the file (see :class:`~trainer.checkpoint.AsyncCheckpointWriter`):
        training stalls for the copy instead of the write. Writes never overlap, and the trainer
        waits for the last one before a run ends or a checkpoint is read back.

        ``also_at``: the same file is also placed at these paths (hard link, else copy), and
        ``replaces``: these files are deleted, both only once the file is on disk, in that order
        (see :func:`~trainer.checkpoint.write_checkpoint`); a failed write deletes nothing.
        """
        state = self._checkpoint_state(weights_only)
        if self.is_global_zero:
            if async_:
                if self._checkpoint_writer is None:
                    self._checkpoint_writer = AsyncCheckpointWriter()
                self._checkpoint_writer.save(state, path, also_at, replaces)
            else:
                self.wait_for_checkpoints()  # an older asynchronous write must not land after this one
                write_checkpoint(state, path, also_at, replaces)
        self.strategy.barrier("save_checkpoint")

    def wait_for_checkpoints(self) -> None:
        """Block until asynchronous checkpoint writes are on disk; re-raise a failed write's error."""
        if self._checkpoint_writer is not None:
            self._checkpoint_writer.wait()

    def _close_checkpoint_writer(self) -> None:
        """Wait for the last asynchronous write, then free the writer's CPU copy of the state.

        Called at the end of every run: the writer keeps its snapshot buffers for reuse between
        saves, and would otherwise hold a copy of the model in host memory until the process exits.
        """
        writer, self._checkpoint_writer = self._checkpoint_writer, None
        if writer is not None:
            writer.close()

    # ----------------------------------------------------------------- the run
    def _launch(self, stage: str, module: TrainModule, *rest: Any) -> Any:
        """Run ``stage`` in every process the strategy uses; return rank 0's output.

        When the stage ran in processes the strategy started, this process's trainer and module
        adopt rank 0's end state (weights, metrics, progress, callback states), so code after
        ``fit`` reads the same on every strategy.
        """
        try:
            output, final = self.strategy.launch(self._run, stage, module, *rest)
        except loops.Preempted:  # the processes the strategy started were stopped by a signal
            self.preempted = True
            return None
        if final["pid"] != os.getpid():
            self._adopt(module, final)
        return output

    def _final_state(self, stage: str) -> dict[str, Any]:
        """What :meth:`_adopt` needs, taken in every process before the strategy tears down."""
        cpu = torch.device("cpu")
        return {
            "pid": os.getpid(),
            "preempted": self.preempted,
            # Full weights, needed only when they travel back to the process that started this one
            # (under FSDP gathering them is a collective: every rank decides alike, from the env).
            "state_dict": (
                self.strategy.model_state_dict()
                if stage == "fit" and os.environ.get(STARTED_BY_LAUNCHER) == "1"
                else None
            ),
            "progress": self.progress.state_dict(),
            "callbacks": {cb.state_key: cb.state_dict() for cb in self.callbacks},
            "metrics": [
                {k: v.detach().to(cpu) for k, v in metrics.items()}
                for metrics in (self.callback_metrics, self.logged_metrics, self.progress_bar_metrics)
            ],
        }

    def _adopt(self, module: TrainModule, final: dict[str, Any]) -> None:
        """Copy rank 0's end state, returned from another process, into this trainer and ``module``."""
        if final["state_dict"] is not None:
            from trainer.checkpoint import load_module_state

            load_module_state(module, final["state_dict"])
        self.module = module
        self.preempted = final["preempted"]
        self.progress.load_state_dict(final["progress"])
        for cb in self.callbacks:
            if cb.state_key in final["callbacks"]:
                cb.load_state_dict(final["callbacks"][cb.state_key])
        self.callback_metrics, self.logged_metrics, self.progress_bar_metrics = final["metrics"]

    def _run(
        self,
        stage: str,
        module: TrainModule,
        loader: Iterable[Any] | None,
        val_loader: Iterable[Any] | None,
        datamodule: DataModule | None,
        ckpt_path: str | os.PathLike[str] | None,
    ) -> Any:
        """Everything one entry point does, in every process: set up, run the loop, tear down.

        Returns ``(output, end state)``; :meth:`_launch` uses the end state when this ran elsewhere.
        """
        self.stage = stage
        self.module = module
        self.datamodule = datamodule
        self._dispatch = {}
        module._trainer = self
        self.strategy.setup_environment()
        try:
            if datamodule is not None:
                datamodule.prepare_data()
                datamodule.setup(stage)
            module.setup(stage)
            self._call_callbacks("setup", stage)
            self._apply_memory_options(module, stage)
            self.strategy.setup(module)
            if self.compile:
                self.strategy.compile_model(**self.compile_kwargs)
            if stage == "fit":
                self._configure_optimizers(module)
            if ckpt_path is None and stage == "fit" and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
                ckpt_path = self._restart_checkpoint()
            if ckpt_path is not None:
                self._restore(ckpt_path, full=(stage == "fit"))
            if stage == "fit":
                self._install_preemption_handlers()
                self._loaders = {
                    "fit": make_resumable(self._loader("fit", loader)),
                    "validate": self._loader("validate", val_loader, required=False),
                }
                loops.fit_loop(self)
                return None, self._final_state(stage)
            self._loaders = {stage: self._loader(stage, loader)}
            if stage == "predict":
                return loops.predict_loop(self), self._final_state(stage)
            metrics = loops.eval_loop(self, stage)
            return {k: float(v) for k, v in metrics.items()}, self._final_state(stage)
        except loops.Preempted:
            self.preempted = True
            return None, self._final_state("fit")
        except BaseException as exc:
            self._call_callbacks("on_exception", exc)
            raise
        finally:
            self._restore_signal_handlers()
            self._call_callbacks("teardown", stage)
            self._close_checkpoint_writer()
            module.teardown(stage)
            if datamodule is not None:
                datamodule.teardown(stage)
            self.strategy.teardown()
            self._store = None
            self.stage = None

    def _apply_memory_options(self, module: TrainModule, stage: str) -> None:
        """Activation checkpointing (before the strategy wraps the module) and micro-batching checks."""
        if self.activation_checkpointing:
            found = self.strategy.apply_activation_checkpointing(module, self.activation_checkpointing)
            if not found:
                names = ", ".join(c.__qualname__ for c in self.activation_checkpointing)
                warnings.warn(
                    f"activation_checkpointing: {type(module).__name__} has no {names} submodule", stacklevel=2
                )
        if stage == "fit" and self._micro_batcher is not None and not module.automatic_optimization:
            raise ValueError("micro_batch_size needs automatic optimisation; split batches yourself in training_step")

    def _configure_optimizers(self, module: TrainModule) -> None:
        optimizers, schedulers = parse_optimizers(module.configure_optimizers())
        if module.automatic_optimization and len(optimizers) > 1:
            raise ValueError(
                f"configure_optimizers() returned {len(optimizers)} optimizers; automatic optimisation "
                "steps one. Set `automatic_optimization = False` and step them in training_step."
            )
        self.optimizers = self.strategy.setup_optimizers(optimizers)
        self.lr_scheduler_configs = schedulers
        self._optimizer_handles = [loops.ManualOptimizer(self, opt) for opt in self.optimizers]

    def _module_for(self, module: TrainModule | None) -> TrainModule:
        module = module if module is not None else self.module
        if module is None:
            raise ValueError("Pass a module: this trainer has not been fitted on one")
        return module

    # ----------------------------------------------------------------- data
    def _loader(self, stage: str, explicit: Iterable[Any] | None, required: bool = True) -> Iterable[Any] | None:
        """The dataloader for ``stage``: given explicitly, else the datamodule's, else the module's."""
        method = _LOADER_METHODS[stage]
        loader = explicit
        for source in (self.datamodule, self.module):
            if loader is not None:
                break
            fn = getattr(source, method, None) if source is not None else None
            if fn is not None:
                try:
                    loader = fn()
                except NotImplementedError:
                    loader = None
        if loader is None:
            if required:
                raise ValueError(
                    f"No data for {stage}: pass dataloaders to trainer.{stage}(...), a datamodule "
                    f"defining {method}(), or define {method}() on the module"
                )
            return None
        if isinstance(loader, (list, tuple)):
            raise TypeError(
                f"{method}: one dataloader is supported per stage, got a {type(loader).__name__} of {len(loader)}"
            )
        return add_worker_seeding(
            self.strategy.process_dataloader(loader, train=(stage == "fit")), self.strategy.global_rank
        )

    def _num_batches(self, stage: str, loader: Iterable[Any]) -> float:
        """Batches the stage will use: the loader's length cut by ``limit_*`` (inf if unsized)."""
        try:
            total: float = len(loader)  # type: ignore[arg-type]
        except TypeError:
            total = math.inf
        limit = self.limits[stage]
        if limit is None:
            return total
        if isinstance(limit, float):
            if math.isinf(total):
                if limit == 1.0:
                    return total
                raise ValueError(f"A fractional limit ({limit}) needs a dataloader with a length")
            return int(total * limit)
        return min(total, limit)

    # ----------------------------------------------------------------- hooks and logging
    def _call_module(self, hook: str, *args: Any) -> Any:
        assert self.module is not None
        return getattr(self.module, hook)(*args)

    def _call_callbacks(self, hook: str, *args: Any) -> None:
        for cb in self._hooks[hook]:
            getattr(cb, hook)(self, self.module, *args)

    def _hook(self, hook: str, *args: Any) -> Any:
        """Call the module's ``hook`` and then every callback overriding it.

        Runs several times per step, so the callables are resolved once per run (:meth:`_resolve_hook`)
        and a hook that neither the module nor any callback overrides costs one dict lookup.
        """
        try:
            module_fn, callback_fns = self._dispatch[hook]
        except KeyError:
            module_fn, callback_fns = self._dispatch[hook] = self._resolve_hook(hook)
        out = module_fn(*args) if module_fn is not None else None
        for fn in callback_fns:
            fn(*args)
        return out

    def _overridden(self, hook: str) -> bool:
        """Whether the module or a callback does something in ``hook`` (so :meth:`_hook` must be called)."""
        try:
            module_fn, callback_fns = self._dispatch[hook]
        except KeyError:
            module_fn, callback_fns = self._dispatch[hook] = self._resolve_hook(hook)
        return module_fn is not None or bool(callback_fns)

    def _resolve_hook(self, hook: str) -> tuple[Callable[..., Any] | None, tuple[Callable[..., Any], ...]]:
        """The module's ``hook`` (None where it keeps TrainModule's empty default) and the callbacks' ones."""
        module = self.module
        assert module is not None
        fn = getattr(module, hook)
        if getattr(fn, "__func__", None) is getattr(TrainModule, hook, None):
            fn = None  # TrainModule's hooks do nothing; skipping the call changes nothing
        callback_fns = tuple(functools.partial(getattr(cb, hook), self, module) for cb in self._hooks.get(hook, ()))
        return fn, callback_fns

    def _log(
        self,
        name: str,
        value: Any,
        on_step: bool | None,
        on_epoch: bool | None,
        prog_bar: bool,
        sync_dist: bool,
        reduce_fx: str,
        batch_size: int | None,
    ) -> None:
        """Back end of ``TrainModule.log`` (arguments in its order)."""
        store = self._store
        if store is None:
            raise RuntimeError(
                f"self.log({name!r}) was called outside the steps and hooks of fit/validate/test "
                "(logging is not supported in predict or in setup hooks)"
            )
        if on_step is None:
            on_step = self._log_defaults[0]
        if on_epoch is None:
            on_epoch = self._log_defaults[1]
        if not (on_step or on_epoch):
            raise ValueError(f"self.log({name!r}): on_step and on_epoch are both False, nothing would be logged")
        size = self._current_batch_size if batch_size is None else lambda: batch_size
        key = store.log(name, value, on_step, on_epoch, prog_bar, sync_dist, reduce_fx, size)
        if key is not None:
            self._remember_one(key, store.pending_step[key], store.prog_bar_keys())

    def _current_batch_size(self) -> int:
        """``batch_size_of`` the current batch, worked out once per batch however many values are logged."""
        batch = self._current_batch
        cached_batch, size = self._batch_size_cache
        if cached_batch is not batch:
            size = batch_size_of(batch)
            self._batch_size_cache = (batch, size)
        return size

    def _remember(self, values: Mapping[str, torch.Tensor], store: MetricStore) -> None:
        """Make ``values`` visible in ``callback_metrics`` (and the progress bar)."""
        if not values:
            return
        prog_bar = store.prog_bar_keys()
        for key, value in values.items():
            self._remember_one(key, value, prog_bar)

    def _remember_one(self, key: str, value: torch.Tensor, prog_bar: set[str]) -> None:
        self.callback_metrics[key] = value
        base = key.removesuffix("_step").removesuffix("_epoch")
        if base != key:
            self.callback_metrics[base] = value
        self._epoch_keys.add(key)
        self._epoch_keys.add(base)
        if key in prog_bar:
            self.progress_bar_metrics[key] = value

    def log_metrics(self, metrics: Mapping[str, torch.Tensor | float], step: int | None = None) -> None:
        """Hand values computed outside ``self.log`` (learning rates, throughput) to the loggers.

        For callbacks: the values reach every logger exactly like logged metrics do, at x = ``step``
        (default: the index of the last optimizer step). They do not enter ``callback_metrics``.
        """
        values = {key: torch.as_tensor(value) for key, value in metrics.items()}
        self._emit(values, max(self.global_step - 1, 0) if step is None else step)

    def _emit(self, metrics: dict[str, torch.Tensor], step: int) -> None:
        """Hand ``metrics`` to the loggers (callbacks overriding ``on_log_metrics``); rank 0 only."""
        if not metrics:
            return
        self.logged_metrics.update(metrics)
        if self.sanity_checking:
            return
        self._call_callbacks("on_log_metrics", metrics, step)

    # ----------------------------------------------------------------- checkpoints
    def _checkpoint_state(self, weights_only: bool = False) -> dict[str, Any]:
        """The one place where a checkpoint's content is assembled (DESIGN.md, "Checkpoints")."""
        assert self.module is not None
        state: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "state_dict": self.strategy.model_state_dict(),
            "progress": self.progress.state_dict(),
            "hparams": to_plain(self.module.hparams),
            "config": to_plain(self.config),
        }
        if not weights_only:
            state["optimizers"] = [self.strategy.optimizer_state_dict(opt) for opt in self.optimizers]
            state["lr_schedulers"] = [cfg.scheduler.state_dict() for cfg in self.lr_scheduler_configs]
            state["precision"] = self.strategy.precision.state_dict()
            state["callbacks"] = {cb.state_key: cb.state_dict() for cb in self.callbacks}
            state["rng"] = self.strategy.gather_object(rng_state())  # one entry per rank
            sampler = getattr(self._loaders.get("fit"), "batch_sampler", None)
            if isinstance(sampler, ResumableBatchSampler) and sampler.epoch_rng is not None:
                state["loops"] = {"epoch_rng": sampler.epoch_rng}
            if self.datamodule is not None:
                state["datamodule"] = self.datamodule.state_dict()
        self.module.on_save_checkpoint(state)
        self._call_callbacks("on_save_checkpoint", state)
        return state

    def _restart_checkpoint(self) -> Path | None:
        """After an elastic restart, the last checkpoint to resume from (None: none was written yet)."""
        try:
            path = self._resolve_ckpt_path("last")
        except CheckpointError:
            return None
        if self.is_global_zero:
            print(f"restart {os.environ.get('TORCHELASTIC_RESTART_COUNT')}: resuming from {path}", flush=True)
        return path

    def _resolve_ckpt_path(self, ckpt_path: str | os.PathLike[str]) -> Path:
        if str(ckpt_path) in ("last", "best"):
            cb = self.checkpoint_callback
            attr = "last_model_path" if str(ckpt_path) == "last" else "best_model_path"
            found = getattr(cb, attr, None) if cb is not None else None
            if not found and str(ckpt_path) == "last" and cb is not None:
                candidate = Path(getattr(cb, "dirpath", self.default_root_dir)) / "last.ckpt"
                found = str(candidate) if candidate.exists() else None
            if not found:
                raise CheckpointError(f"ckpt_path={str(ckpt_path)!r}: no such checkpoint has been saved yet")
            return Path(found)
        return Path(ckpt_path)

    def _restore(self, ckpt_path: str | os.PathLike[str], full: bool) -> None:
        """Load a checkpoint: weights always; with ``full``, everything needed to resume training.

        A plain PyTorch state dict file (``torch.save(model.state_dict())``, ``module.`` prefixes
        and all) sets the weights only: for evaluation, or to start training from them.
        """
        self.wait_for_checkpoints()
        path = self._resolve_ckpt_path(ckpt_path)
        state = load_checkpoint(path, plain_weights=True)
        assert self.module is not None
        if state.get("plain_weights"):
            if full and self.is_global_zero:
                print(f"{path} is a plain state dict: training starts from its weights, with fresh optimizer state")
            self._load_weights(path, state["state_dict"])
            return
        self.module.on_load_checkpoint(state)
        self._call_callbacks("on_load_checkpoint", state)
        self._load_weights(path, state["state_dict"])
        if not full:
            return
        if "optimizers" not in state:
            raise CheckpointError(f"{path} holds weights only; it cannot resume training")
        if len(state["optimizers"]) != len(self.optimizers):
            raise CheckpointError(
                f"{path} has {len(state['optimizers'])} optimizer states, the module configures {len(self.optimizers)}"
            )
        for opt, opt_state in zip(self.optimizers, state["optimizers"]):
            self.strategy.load_optimizer_state_dict(opt, opt_state)
        for cfg, sched_state in zip(self.lr_scheduler_configs, state["lr_schedulers"]):
            cfg.scheduler.load_state_dict(sched_state)
        self.strategy.precision.load_state_dict(state.get("precision", {}))
        self.progress.load_state_dict(state["progress"])
        for cb in self.callbacks:
            if cb.state_key in state.get("callbacks", {}):
                cb.load_state_dict(state["callbacks"][cb.state_key])
        if self.datamodule is not None and "datamodule" in state:
            self.datamodule.load_state_dict(state["datamodule"])
        self._resume_epoch_rng = state.get("loops", {}).get("epoch_rng")
        rngs = state.get("rng", [])
        if rngs:
            set_rng_state(rngs[min(self.global_rank, len(rngs) - 1)])

    def _load_weights(self, path: Path, state_dict: dict[str, Any]) -> None:
        try:
            self.strategy.load_model_state_dict(state_dict)
        except CheckpointError as err:
            raise CheckpointError(f"Cannot load the weights in {path}. {err}") from err

    # ----------------------------------------------------------------- preemption
    def _install_preemption_handlers(self) -> None:
        """On SIGTERM/SIGUSR1, only note the signal: the loop acts on it after the optimizer step."""
        self._previous_handlers: dict[int, Any] = {}
        # Worked out once: in one process the loop's per-step check is a plain attribute test.
        self._preempt_agree = self.strategy.world_size > 1
        self._next_preempt_check = 0  # under several processes: the global step of the next agreement
        self._preempt_checked_at = None  # (time, global step) of the last agreement
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread

        def note(signum: int, frame: Any) -> None:
            self._preempt_signal = signum

        for sig in (signal.SIGTERM, getattr(signal, "SIGUSR1", None)):
            if sig is not None:
                self._previous_handlers[sig] = signal.signal(sig, note)

    def _restore_signal_handlers(self) -> None:
        for sig, handler in getattr(self, "_previous_handlers", {}).items():
            signal.signal(sig, handler)
        self._previous_handlers = {}

    def _preemption_requested(self) -> bool:
        """True when a signal arrived here or (under several processes) on any rank, on every rank alike."""
        requested = self._preempt_signal is not None
        if self._preempt_agree:
            # One small collective, at a step every rank agreed on, so that every rank stops after the
            # same step. It also agrees on the next such step: each rank proposes as many steps as it
            # ran in PREEMPT_CHECK_SECONDS since the last agreement, and the largest proposal wins.
            from trainer.loops import PREEMPT_CHECK_MAX_STEPS, PREEMPT_CHECK_SECONDS

            step, now = self.progress.global_step, time.monotonic()
            proposal = 1  # the first agreement of a run (fresh or resumed) comes before any measurement
            if self._preempt_checked_at is not None:
                last_time, last_step = self._preempt_checked_at
                rate = (step - last_step) / max(now - last_time, 1e-6)
                proposal = min(max(int(rate * PREEMPT_CHECK_SECONDS), 1), PREEMPT_CHECK_MAX_STEPS)
            flag = torch.tensor(
                [self._preempt_signal or 0, proposal], dtype=torch.int64, device=self.strategy.root_device
            )
            signal_any, interval = (int(v) for v in self.strategy.reduce(flag, "max").tolist())
            self._preempt_signal = signal_any or None
            self._preempt_checked_at = (now, step)
            self._next_preempt_check = step + interval
            requested = self._preempt_signal is not None
        return requested

    def _save_for_preemption(self) -> Path:
        """Write ``last.ckpt`` where ``ckpt_path="last"`` finds it; requeue under Slurm on SIGUSR1."""
        cb = self.checkpoint_callback
        dirpath = getattr(cb, "dirpath", None) or self.default_root_dir / "checkpoints"
        path = Path(dirpath) / "last.ckpt"
        self.save_checkpoint(path)
        if cb is not None and hasattr(cb, "last_model_path"):
            cb.last_model_path = str(path)
        job = os.environ.get("SLURM_JOB_ID")
        usr1 = getattr(signal, "SIGUSR1", None)
        if self.slurm_requeue and job and self._preempt_signal == usr1 and self.is_global_zero:
            import subprocess

            result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, check=False)
            if result.returncode != 0:
                warnings.warn(f"scontrol requeue {job} failed: {result.stderr.strip()}", stacklevel=2)
        return path

    # ----------------------------------------------------------------- defaults
    def _default_callbacks(
        self, given: list[Callback], progress_bar: bool, checkpointing: bool, logger: bool
    ) -> list[Callback]:
        """Prepend the default progress bar, logger and checkpoint unless the user gave their own."""
        import callbacks as cbs

        kinds = {type(cb) for cb in given}
        defaults: list[Callback] = []
        if progress_bar and not any(issubclass(k, cbs.ProgressBar) for k in kinds):
            defaults.append(cbs.ProgressBar())
        if logger and not any(getattr(k, "is_logger", False) for k in kinds):
            defaults.append(cbs.TensorBoardLogger(save_dir=self.default_root_dir))
        if checkpointing and not any(issubclass(k, cbs.ModelCheckpoint) for k in kinds):
            defaults.append(cbs.ModelCheckpoint(dirpath=self.default_root_dir / "checkpoints", save_last=True))
        chosen = defaults + given
        if self.fast_dev_run:
            dropped = [type(cb).__name__ for cb in chosen if not cb.runs_in_fast_dev_run]
            if dropped:
                warnings.warn(f"fast_dev_run: leaving out {', '.join(dropped)}", stacklevel=3)
            chosen = [cb for cb in chosen if cb.runs_in_fast_dev_run]
        return chosen


def _resolve_classes(classes: Iterable[type[torch.nn.Module] | str]) -> tuple[type[torch.nn.Module], ...]:
    """Classes from classes or dotted paths (``"examples.gpt.Block"``, as Hydra configs give them)."""
    if isinstance(classes, str):
        classes = [classes]
    resolved = []
    for cls in classes:
        if isinstance(cls, str):
            from hydra.utils import get_class

            try:
                cls = get_class(cls)
            except Exception as err:
                raise ValueError(f"activation_checkpointing: cannot import class {cls!r}: {err}") from err
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            raise TypeError(f"activation_checkpointing takes nn.Module classes or their paths, got {cls!r}")
        resolved.append(cls)
    return tuple(resolved)


def _check_positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_limit(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be an int (batches), a float in [0, 1] (fraction) or None, got {value!r}")
    if isinstance(value, float) and not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} as a fraction must be in [0, 1], got {value}")
    if isinstance(value, int) and value < 0:
        raise ValueError(f"{name} as a batch count must be >= 0, got {value}")


def _check_module(module: Any) -> None:
    if not isinstance(module, TrainModule):
        raise TypeError(f"Trainer.fit needs a TrainModule, got {type(module).__name__}")
    if type(module).training_step is TrainModule.training_step:
        raise NotImplementedError(
            f"{type(module).__name__} does not define training_step(self, batch, batch_idx); "
            "the trainer has nothing to train"
        )
