"""Lightning's read-only ``Trainer`` attributes, as properties over the state the trainer already holds.

A Lightning user reads ``trainer.logger``, ``trainer.state.fn``, ``trainer.validating``,
``trainer.estimated_stepping_batches``, ``trainer.val_dataloaders`` ... in callbacks and modules. None
of them is stored twice: each is worked out from the callbacks, the strategy, the prepared loaders
(``trainer.loaders``) or the run's counters. :class:`TrainerAttributes` is a mixin of
:class:`~trainer.Trainer`; ``trainer.state`` is a :class:`~trainer.state.TrainerState`.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from trainer.run_state import Reads
from trainer.state import RunningStage, TrainerFn, TrainerState, TrainerStatus

if TYPE_CHECKING:
    from callbacks.base import Callback
    from strategies.base import Strategy
    from trainer.hooks import HookDispatch
    from trainer.loops.step import ManualOptimizer, Window
    from trainer.metrics.routing import MetricRouter
    from trainer.module import DataModule, TrainModule
    from trainer.optim import SchedulerConfig
    from trainer.preemption import Preemption
    from trainer.progress import Progress
    from trainer.run_state import RunState

__all__ = ["TrainerAttributes"]


class TrainerAttributes:
    """Lightning's ``Trainer`` properties (mixed into :class:`~trainer.Trainer`)."""

    if TYPE_CHECKING:
        callbacks: list[Callback]
        strategy: Strategy
        run_state: RunState
        preemption: Preemption
        metric_router: MetricRouter
        default_root_dir: str
        accumulate_grad_batches: int

    # ----------------------------------------------------------------- the run state, read
    # Each reads a field of ``run_state`` (or of the loop options in force); see trainer/run_state.py.
    max_epochs: Reads[int | None] = Reads(
        "loop", "max_epochs", doc="Training stops after this many epochs (-1: no limit)."
    )
    max_steps: Reads[int] = Reads(
        "loop", "max_steps", doc="Training stops after this many optimizer steps (-1: no limit)."
    )
    min_epochs: Reads[int] = Reads("loop", "min_epochs", doc="``should_stop`` waits until this many epochs are done.")
    min_steps: Reads[int] = Reads("loop", "min_steps", doc="``should_stop`` waits until this many steps are done.")
    val_check_batch: Reads[float | None] = Reads(
        "val_check_batch", doc="Training batches between validations in the epoch (inf: at its end only)."
    )
    check_val_every_n_epoch: Reads[int | None] = Reads(
        "loop", "check_val_every_n_epoch", doc="Validate every n epochs."
    )
    #: ``limit_*_batches`` by stage (``"fit"``, ``"validate"``, ``"test"``, ``"predict"``).
    limits: Reads[dict[str, int | float | None]] = Reads("loop", "limits", doc="``limit_*_batches`` by stage.")
    log_every_n_steps: Reads[int] = Reads("loop", "log_every_n_steps", doc="Step values reach the loggers this often.")
    overfit_batches: Reads[int | float] = Reads(
        "loop", "overfit_batches", doc="Train and validate on this many batches."
    )
    hooks: Reads[HookDispatch] = Reads(
        "hooks", doc="Calls the module's and the callbacks' hooks: ``trainer.hooks('on_fit_start')``."
    )
    progress: Reads[Progress] = Reads("progress", doc="Every counter of the run, saved and restored whole.")
    window: Reads[Window] = Reads("window", doc="The accumulation window in progress.")
    module: Reads[TrainModule | None] = Reads("module", doc="The module of the entry point running or last run.")
    datamodule: Reads[DataModule | None] = Reads(
        "datamodule",
        settable=True,  # a plain attribute in Lightning; an entry point sets it again from its own argument
        doc="The data module of the entry point, if any.",
    )
    optimizers: Reads[list[torch.optim.Optimizer]] = Reads("optimizers", settable=True, doc="The optimizers, prepared.")
    lr_scheduler_configs: Reads[list[SchedulerConfig]] = Reads(
        "lr_scheduler_configs", settable=True, doc="The schedulers with their interval, frequency and monitor."
    )
    optimizer_handles: Reads[list[ManualOptimizer]] = Reads(
        "optimizer_handles", doc="What ``self.optimizers()`` returns under manual optimisation."
    )
    loaders: Reads[dict[str, Any]] = Reads("loaders", doc="The dataloaders by stage, prepared for the strategy.")
    given_loaders: Reads[dict[str, Any]] = Reads("given_loaders", doc="The dataloaders passed to the entry point.")
    stage: Reads[str | None] = Reads("fn", doc="The entry point running (``'fit'``, ``'validate'``, ...), else None.")
    last_fn: Reads[str | None] = Reads("last_fn", doc="The entry point running or last run.")
    status: Reads[TrainerStatus] = Reads("status", doc="Whether the run is going, finished or was interrupted.")
    running_stage: Reads[str | None] = Reads("running_stage", doc="The loop running now (``'train'``, ...).")
    sanity_checking: Reads[bool] = Reads("sanity_checking", doc="True during the sanity check.")
    in_train_epoch_end: Reads[bool] = Reads("in_train_epoch_end", doc="True while callbacks' on_train_epoch_end runs.")
    is_last_batch: Reads[bool] = Reads("is_last_batch", doc="True while the last batch of an epoch trains.")
    ckpt_path: Reads[str | None] = Reads("ckpt_path", doc="The checkpoint the last entry point loaded, else None.")
    num_training_batches: Reads[float] = Reads("num_training_batches", doc="Training batches per epoch.")
    num_val_batches: Reads[list[float]] = Reads("num_val_batches", doc="Validation batches, per loader.")
    num_test_batches: Reads[list[float]] = Reads("num_test_batches", doc="Test batches, per loader.")
    num_predict_batches: Reads[list[float]] = Reads("num_predict_batches", doc="Predict batches, per loader.")
    num_sanity_val_batches: Reads[list[float]] = Reads("num_sanity_val_batches", doc="Sanity-check batches.")

    # ----------------------------------------------------------------- state
    @property
    def state(self) -> TrainerState:
        """Lightning's ``TrainerState``: entry point, loop and status."""
        fn = TrainerFn(self.run_state.last_fn) if self.run_state.last_fn is not None else None
        stage = RunningStage(self.run_state.running_stage) if self.run_state.running_stage is not None else None
        return TrainerState(status=self.run_state.status, fn=fn, stage=stage)

    @property
    def training(self) -> bool:
        """The training loop is running (not its validation)."""
        return self.run_state.running_stage == "train"

    @property
    def validating(self) -> bool:
        """A validation loop is running (in ``fit`` or ``validate``; not the sanity check)."""
        return self.run_state.running_stage == "validate"

    @property
    def testing(self) -> bool:
        """The test loop is running."""
        return self.run_state.running_stage == "test"

    @property
    def predicting(self) -> bool:
        """The predict loop is running."""
        return self.run_state.running_stage == "predict"

    @property
    def evaluating(self) -> bool:
        """Validation, test or the sanity check is running."""
        return self.run_state.running_stage in ("validate", "test", "sanity_check")

    @property
    def interrupted(self) -> bool:
        """The last run ended with an exception or a preemption signal."""
        return self.run_state.status == TrainerStatus.INTERRUPTED

    @property
    def received_sigterm(self) -> bool:
        """SIGTERM arrived during the run (the preemption handler noted it)."""
        return self.preemption.signal == signal.SIGTERM

    # ----------------------------------------------------------------- metrics, processes, paths
    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """Latest value of everything logged (tensors), read by checkpointing and early stopping."""
        return self.metric_router.callback_metrics

    @property
    def logged_metrics(self) -> dict[str, torch.Tensor]:
        """Latest values handed to the loggers."""
        return self.metric_router.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """Latest values logged with ``prog_bar=True``, as Python numbers (Lightning's: the bar shows them)."""
        return {
            key: value.item() if isinstance(value, torch.Tensor) else value
            for key, value in self.metric_router.progress_bar_metrics.items()
        }

    @property
    def preempted(self) -> bool:
        """True when the last run stopped for a signal (SIGTERM, SIGUSR1, Ctrl-C) after saving ``last.ckpt``."""
        return self.preemption.preempted

    @property
    def preemption_exit_code(self) -> int | None:
        """The exit code after a preemption checkpoint (``None``: ``fit`` returns)."""
        return self.preemption.exit_code

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

    def _limit(self, stage: str) -> int | float:
        limit = self.run_state.loop.limits[stage]
        return 1.0 if limit is None else limit

    @property
    def limit_train_batches(self) -> int | float:
        """Training batches per epoch in force: a count, or a fraction (1.0: all), as Lightning's attribute."""
        return self._limit("fit")

    @property
    def limit_val_batches(self) -> int | float:
        """Validation batches in force: a count, or a fraction (1.0: all)."""
        return self._limit("validate")

    @property
    def limit_test_batches(self) -> int | float:
        """Test batches in force: a count, or a fraction (1.0: all)."""
        return self._limit("test")

    @property
    def limit_predict_batches(self) -> int | float:
        """Prediction batches in force: a count, or a fraction (1.0: all)."""
        return self._limit("predict")

    @property
    def num_sanity_val_steps(self) -> int | float:
        """Validation batches of the sanity check: ``float("inf")`` for all of them (``-1`` given), as Lightning's."""
        steps = self.run_state.loop.num_sanity_val_steps
        return float("inf") if steps == -1 else steps

    @property
    def log_dir(self) -> str:
        """Where loggers write, by Lightning's rule: the first logger's ``log_dir`` for a TensorBoard or CSV
        logger, its ``save_dir`` for any other (W&B, MLflow, a stand-in such as a ``Mock``); ``default_root_dir``
        without a logger, or when that folder is None (Lightning answers None) or not a path."""
        from callbacks.csv_logger import CSVLogger
        from callbacks.tensorboard import TensorBoardLogger

        loggers = self.loggers
        first = loggers[0] if loggers else None
        tb_or_csv = isinstance(first, (TensorBoardLogger, CSVLogger))
        folder = getattr(first, "log_dir" if tb_or_csv else "save_dir", None)
        return os.fspath(folder if isinstance(folder, (str, os.PathLike)) else self.default_root_dir)

    @property
    def checkpoint_callback(self) -> Callback | None:
        """The first callback that saves checkpoints (has ``best_model_path``), if any."""
        for cb in self.callbacks:
            if hasattr(cb, "best_model_path"):
                return cb
        return None

    # ----------------------------------------------------------------- module and callbacks
    @property
    def model(self) -> TrainModule | None:
        """The user's module (Lightning's ``trainer.model``; the strategy's wrapper stays internal)."""
        return self.lightning_module

    @property
    def lightning_module(self) -> TrainModule | None:
        """The user's module: the run's, else (before any run) the one ``trainer.strategy.connect`` was given."""
        module = self.run_state.module
        return module if module is not None else self.strategy.lightning_module

    @property
    def loggers(self) -> list[Callback]:
        """The logger callbacks (TensorBoard, CSV, ...), in order."""
        return [cb for cb in self.callbacks if getattr(cb, "is_logger", False)]

    @loggers.setter
    def loggers(self, loggers: Iterable[Callback] | None) -> None:
        """Replace the loggers (Lightning lets code assign them): they take the first one's place
        among the callbacks (the front when there was none); ``None`` or ``[]`` removes them."""
        new = list(loggers or [])
        wrong = [type(lg).__name__ for lg in new if not getattr(lg, "is_logger", False)]
        if wrong:
            raise TypeError(f"trainer.loggers takes loggers (subclasses of Logger); got {', '.join(wrong)}")
        old = [i for i, cb in enumerate(self.callbacks) if getattr(cb, "is_logger", False)]
        at = old[0] if old else 0
        rest = [cb for cb in self.callbacks if not getattr(cb, "is_logger", False)]
        # In place: the hook dispatch holds this list.
        self.callbacks[:] = rest[:at] + new + rest[at:]

    @property
    def logger(self) -> Callback | None:
        """The first logger callback, or None."""
        loggers = self.loggers
        return loggers[0] if loggers else None

    @logger.setter
    def logger(self, logger: Callback | None) -> None:
        self.loggers = [logger] if logger else []

    @property
    def checkpoint_callbacks(self) -> list[Callback]:
        """Every callback that saves checkpoints: a :class:`~callbacks.Checkpoint` (Lightning's rule; a stand-in
        logger, a ``Mock``, has every attribute but is not one)."""
        from callbacks.base import Checkpoint

        return [cb for cb in self.callbacks if isinstance(cb, Checkpoint)]

    @property
    def early_stopping_callbacks(self) -> list[Callback]:
        """Every :class:`~callbacks.EarlyStopping`."""
        from callbacks.early_stopping import EarlyStopping

        return [cb for cb in self.callbacks if isinstance(cb, EarlyStopping)]

    @property
    def early_stopping_callback(self) -> Callback | None:
        """The first :class:`~callbacks.EarlyStopping`, or None."""
        found = self.early_stopping_callbacks
        return found[0] if found else None

    @property
    def progress_bar_callback(self) -> Callback | None:
        """The :class:`~callbacks.ProgressBar`, or None."""
        from callbacks.progress import ProgressBar

        return next((cb for cb in self.callbacks if isinstance(cb, ProgressBar)), None)

    # ----------------------------------------------------------------- devices and processes
    @property
    def num_devices(self) -> int:
        """Devices (processes) per node."""
        ids = getattr(self.strategy, "device_ids", None)
        if isinstance(ids, list) and ids:
            return len(ids)
        return int(getattr(self.strategy, "num_processes", 1))

    @property
    def device_ids(self) -> list[int]:
        """Indices of this node's devices."""
        ids = getattr(self.strategy, "device_ids", None)
        return list(ids) if isinstance(ids, list) and ids else list(range(self.num_devices))

    @property
    def num_nodes(self) -> int:
        """Machines taking part."""
        return int(getattr(self.strategy, "num_nodes", 1))

    @property
    def precision_plugin(self) -> Any:
        """The strategy's precision object (Lightning's ``trainer.precision_plugin``)."""
        return self.strategy.precision

    @property
    def scaler(self) -> Any:
        """The fp16 ``GradScaler`` in use, else None."""
        return getattr(self.strategy.precision, "scaler", None)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """``num_replicas`` and ``rank`` of this process's data shard; None on one process (as Lightning)."""
        return getattr(self.strategy, "distributed_sampler_kwargs", None)

    @property
    def accelerator(self) -> Any:
        """Lightning's accelerator object for the device in use (``trainer.strategy.accelerator``)."""
        return self.strategy.accelerator

    @property
    def local_rank(self) -> int:
        """This process's rank on its machine."""
        return self.strategy.local_rank

    @property
    def node_rank(self) -> int:
        """This machine's rank (torchrun's ``GROUP_RANK``, ``NODE_RANK``, Slurm's ``SLURM_NODEID``)."""
        for name in ("NODE_RANK", "GROUP_RANK", "SLURM_NODEID"):
            if name in os.environ:
                return int(os.environ[name])
        return 0

    @property
    def precision(self) -> str:
        """The precision's name (``"32-true"``, ``"16-mixed"``, ``"bf16-mixed"``, ``"bf16-true"``)."""
        return str(self.strategy.precision.name)

    @property
    def val_check_interval(self) -> int | float:
        """When validation runs in an epoch: a fraction of it, or every that many batches (default 1.0, as Lightning)."""
        interval = self.run_state.loop.val_check_interval
        return 1.0 if interval is None else interval

    # ----------------------------------------------------------------- data
    @property
    def train_dataloader(self) -> Any:
        """The training loader(s) of the last ``fit``, prepared for the strategy (a list/dict for several).

        As in Lightning, a loader the trainer did not need to change is the one given; the loop itself
        iterates a copy whose batch sampler can resume mid-epoch (:mod:`trainer.data.resumable`).
        """
        from trainer.data.combined import tree_unflatten
        from trainer.data.resumable import shown_loader

        loader = self.run_state.loaders.get("fit")
        combined = getattr(loader, "loaders", None)
        if combined is not None and getattr(loader, "spec", None) is not None:  # a nested collection
            return tree_unflatten(list(combined), loader.spec)  # type: ignore[union-attr]
        if combined is not None:
            shown = [shown_loader(one) for one in combined]
            keys = getattr(loader, "keys", None)
            return shown if keys is None else dict(zip(keys, shown))
        return shown_loader(loader)

    @property
    def val_dataloaders(self) -> Any:
        """The validation loader (a list when several), prepared for the strategy."""
        return _one_or_list(self.run_state.loaders.get("validate"))

    @property
    def test_dataloaders(self) -> Any:
        """The test loader (a list when several)."""
        return _one_or_list(self.run_state.loaders.get("test"))

    @property
    def predict_dataloaders(self) -> Any:
        """The predict loader (a list when several)."""
        return _one_or_list(self.run_state.loaders.get("predict"))

    @property
    def fast_dev_run(self) -> bool | int:
        """Lightning's value: ``False`` when off, ``True`` for one batch per stage, else the number of batches."""
        n = self.run_state.loop.fast_dev_run
        return True if n == 1 else n if n else False

    @property
    def enable_validation(self) -> bool:
        """Whether ``fit`` validates: validation data, a ``validation_step`` and a limit above 0."""
        from trainer.hooks import is_overridden

        module = self.run_state.module
        if module is None or not is_overridden("validation_step", module):
            return False
        if self.run_state.loop.limits["validate"] in (0, 0.0):
            return False
        from trainer.data.fit_loaders import has_val_data

        return has_val_data(self.run_state)

    @property
    def estimated_stepping_batches(self) -> float:
        """Optimizer steps the fit will take: epochs x batches / accumulation, capped by ``max_steps``.

        Usable in ``configure_optimizers`` (e.g. for ``OneCycleLR``): the training loader is prepared
        then, if it was not yet. ``inf`` when neither a length nor ``max_steps`` bounds it.
        """
        if self.run_state.loop.max_epochs in (None, -1):
            return math.inf if self.run_state.loop.max_steps == -1 else self.run_state.loop.max_steps
        loader = self._fit_loader()
        from trainer.loops.iteration import num_batches

        total = num_batches(loader, self.run_state.loop.limits["fit"]) if loader is not None else math.inf
        if math.isinf(total):
            return math.inf if self.run_state.loop.max_steps == -1 else self.run_state.loop.max_steps
        steps = math.ceil(total / self.accumulate_grad_batches) * max(int(self.run_state.loop.max_epochs), 1)
        return min(steps, self.run_state.loop.max_steps) if self.run_state.loop.max_steps != -1 else steps

    def _fit_loader(self) -> Iterable[Any] | None:
        """The prepared training loader; resolved now (and kept for the fit) inside ``fit`` if not yet."""
        if (
            "fit" not in self.run_state.loaders
            and self.run_state.last_fn == "fit"
            and self.run_state.status == TrainerStatus.RUNNING
        ):
            from trainer.data.loaders import resolve_loaders

            self.run_state.loaders["fit"] = resolve_loaders(self, "fit", self.run_state.given_loaders.get("fit"))  # type: ignore[arg-type]
        loader = self.run_state.loaders.get("fit")
        return loader if loader is not None else None

    # ----------------------------------------------------------------- helpers
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the process of global rank 0 only."""
        if self.strategy.is_global_zero:
            print(*args, **kwargs)

    @contextlib.contextmanager
    def init_module(self, empty_init: bool | None = None) -> Iterator[None]:
        """Build modules inside this block directly on the strategy's device, in the precision's dtype
        (``"bf16-true"``: bfloat16 parameters), as Lightning's ``init_module``.

        ``empty_init=True`` skips the weights' initialisation (for weights a checkpoint will overwrite), as
        Lightning's; ``None`` and ``False`` initialise them, so the module holds what it would hold built
        anywhere else (:meth:`~strategies.base.Strategy.tensor_init_context`).
        """
        with self.strategy.tensor_init_context(empty_init):
            yield


def _one_or_list(loaders: list[Any] | None) -> Any:
    if loaders is None:
        return None
    return loaders[0] if len(loaders) == 1 else list(loaders)
