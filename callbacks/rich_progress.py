"""``RichProgressBar``: Lightning's progress bar drawn with ``rich`` (rank 0 only), its module's names.

Lightning's ``callbacks.progress.rich_progress`` under geartrain (its rich columns: ``_rich_columns.py``,
its theme: ``_rich_theme.py``). geartrain's own default bar is :class:`~callbacks.ProgressBar`. ``rich``
stays an optional import: without it this module imports, and building the bar raises Lightning's error.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from callbacks._bar_switch import BarSwitch
from callbacks._rich_theme import RichProgressBarTheme
from callbacks.progress import ProgressBar

#: Whether ``rich`` can be imported (Lightning's flag of the same name; a test may set it to False).
_RICH_AVAILABLE = importlib.util.find_spec("rich") is not None
#: An interactive interpreter redraws at once (nothing else would show the bar between prompts).
_IS_INTERACTIVE = hasattr(sys, "ps1") or bool(sys.flags.interactive)

if _RICH_AVAILABLE:
    from rich import get_console, reconfigure
    from rich.console import Console
    from rich.progress import Progress, Task, TaskID, TextColumn

    from callbacks._rich_columns import (
        BatchesProcessedColumn,
        CustomBarColumn,
        CustomInfiniteTask,
        CustomProgress,
        CustomTimeColumn,
        MetricsTextColumn,
        ProcessingSpeedColumn,
        _as_numbers,
    )

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = [
    "BatchesProcessedColumn",
    "CustomBarColumn",
    "CustomInfiniteTask",
    "CustomProgress",
    "CustomTimeColumn",
    "MetricsTextColumn",
    "ProcessingSpeedColumn",
    "Progress",
    "RichProgressBar",
    "RichProgressBarTheme",
]


class RichProgressBar(BarSwitch, ProgressBar):
    """Lightning's ``RichProgressBar``: training, sanity check, validation, test and predict bars drawn with rich.

    The bars are tasks of one rich progress object, :attr:`progress`, made at the first ``on_*_start``
    of a run and stopped at its end (or at an exception); each ``on_*_start`` makes a new one once the
    old one is stopped. During ``fit`` the training bar shows :meth:`get_metrics` (tensors as numbers,
    formatted by ``theme.metrics_format``); validation bars are hidden when their pass ends.

    Args:
        refresh_rate: redraws per second at most (Lightning's meaning); 0 turns the bars off.
        leave: keep each epoch's finished training bar on screen (a new progress object per epoch);
            otherwise one training bar is reset at each epoch.
        theme: the parts' styles and the metrics' format.
        console_kwargs: passed to rich's ``reconfigure`` (the global console the bars draw on).

    Raises:
        ModuleNotFoundError: ``rich`` is not installed.
    """

    def __init__(
        self,
        refresh_rate: int = 100,
        leave: bool = False,
        theme: RichProgressBarTheme = RichProgressBarTheme(),  # noqa: B008  (Lightning's default, shared)
        console_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not _RICH_AVAILABLE:
            raise ModuleNotFoundError(
                "`RichProgressBar` requires `rich` >= 10.2.2. Install it by running `pip install -U rich`."
            )
        super().__init__(refresh_rate=max(refresh_rate, 0), console_kwargs=console_kwargs)
        self._refresh_rate = refresh_rate
        self._leave = leave
        self._console: Console | None = None
        self._console_kwargs = dict(console_kwargs or {})
        self._enabled = True
        self.progress: CustomProgress | None = None
        self.train_progress_bar_id: TaskID | None = None
        self.val_sanity_progress_bar_id: TaskID | None = None
        self.val_progress_bar_id: TaskID | None = None
        self.test_progress_bar_id: TaskID | None = None
        self.predict_progress_bar_id: TaskID | None = None
        self._metric_component: MetricsTextColumn | None = None
        self._progress_stopped = False
        self.theme = theme

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (a checkpoint's or a spawned process's copy) without the live rich objects (thread locks)."""
        return {**vars(self), "progress": None, "_console": None, "_metric_component": None}

    # ----------------------------------------------------------------- state
    def _task(self, task_id: TaskID | None) -> Task:
        if self.progress is None or task_id is None:
            raise TypeError(f"{type(self).__name__}: that bar has not been made yet (it is made when its loop starts)")
        return self.progress.tasks[task_id]

    @property
    def train_progress_bar(self) -> Task:
        """The training bar's rich task."""
        return self._task(self.train_progress_bar_id)

    @property
    def val_sanity_check_bar(self) -> Task:
        """The sanity check bar's rich task."""
        return self._task(self.val_sanity_progress_bar_id)

    @property
    def val_progress_bar(self) -> Task:
        """The validation bar's rich task."""
        return self._task(self.val_progress_bar_id)

    @property
    def test_progress_bar(self) -> Task:
        """The test bar's rich task."""
        return self._task(self.test_progress_bar_id)

    def _reset_progress_bar_ids(self) -> None:
        self.train_progress_bar_id = self.val_sanity_progress_bar_id = self.val_progress_bar_id = None
        self.test_progress_bar_id = self.predict_progress_bar_id = None

    # ----------------------------------------------------------------- the progress object
    def configure_columns(self, trainer: Trainer) -> list[Any]:
        """The columns left of the metrics (override to change them): description, bar, count, time, speed."""
        return [
            TextColumn("[progress.description]{task.description}"),
            CustomBarColumn(
                complete_style=self.theme.progress_bar,
                finished_style=self.theme.progress_bar_finished,
                pulse_style=self.theme.progress_bar_pulse,
            ),
            BatchesProcessedColumn(style=self.theme.batch_progress),
            CustomTimeColumn(style=self.theme.time),
            ProcessingSpeedColumn(style=self.theme.processing_speed),
        ]

    def _init_progress(self, trainer: Trainer) -> None:
        """Make and start the progress object, unless it runs already (or the bar is off)."""
        if not self.is_enabled or (self.progress is not None and not self._progress_stopped):
            return
        self._reset_progress_bar_ids()
        reconfigure(**self._console_kwargs)
        self._console = console = get_console()
        live_stack = getattr(console, "_live_stack", None)  # rich >= 14.1: nested live displays
        while live_stack if live_stack is not None else getattr(console, "_live", None) is not None:
            console.clear_live()  # a live display left by an earlier run (an exception) would nest ours
        self._metric_component = MetricsTextColumn(
            trainer, self.theme.metrics, self.theme.metrics_text_delimiter, self.theme.metrics_format
        )
        self.progress = CustomProgress(
            *self.configure_columns(trainer),
            self._metric_component,
            auto_refresh=True,
            refresh_per_second=self.refresh_rate,
            disable=self.is_disabled,
            console=console,
        )
        self.progress.start()
        self._progress_stopped = False

    def _stop_progress(self) -> None:
        """Stop drawing (once); the next ``on_*_start`` makes a new progress object."""
        if self.progress is not None and not self._progress_stopped:
            self.progress.stop()
            self._progress_stopped = True

    def refresh(self, hard: bool = False) -> None:
        """Redraw now (``hard``, or in an interactive interpreter), else at the refresh thread's next tick."""
        if self.progress is not None:
            if hard or _IS_INTERACTIVE:
                self.progress.refresh()
            else:
                self.progress.soft_refresh()

    def _add_task(self, total_batches: int | float, description: str, visible: bool = True) -> TaskID:
        assert self.progress is not None
        styled = f"[{self.theme.description}]{description}" if self.theme.description else description
        return self.progress.add_task(styled, total=total_batches, visible=visible)

    def _hide(self, task_id: TaskID | None) -> None:
        if self.progress is not None and task_id is not None:
            self.progress.update(task_id, advance=0, visible=False)

    def _update(self, task_id: TaskID | None, current: int, visible: bool = True, hard: bool = False) -> None:
        if self.progress is not None and task_id is not None and self.is_enabled:
            self.progress.update(task_id, completed=current, visible=visible)
            self.refresh(hard=hard)

    def _get_train_description(self, current_epoch: int) -> str:
        """``Epoch 3/9`` (``/last`` with ``max_epochs``), padded to the validation description's width."""
        description = f"Epoch {current_epoch}"
        if self.trainer.max_epochs is not None:
            description += f"/{self.trainer.max_epochs - 1}"
        return description.ljust(len(self.validation_description))  # no flicker between the two bars

    @override
    def get_metrics(self, trainer: Trainer, pl_module: TrainModule) -> dict[str, int | str | float | dict[str, float]]:
        """:class:`~callbacks.ProgressBar`'s metrics, tensors as Python numbers."""
        return _as_numbers(super().get_metrics(trainer, pl_module))

    def _update_metrics(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self.is_enabled and self._metric_component is not None:
            self._metric_component.update(self.get_metrics(trainer, pl_module))

    # ----------------------------------------------------------------- hooks: starts and ends
    @override
    def on_sanity_check_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._hide(self.val_sanity_progress_bar_id)
        self.refresh()

    @override
    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._init_progress(trainer)

    # every loop's start makes the progress object (a new one after the previous run stopped its own)
    on_sanity_check_start = on_validation_start = on_test_start = on_predict_start = on_train_start

    @override
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self.is_enabled and self.val_progress_bar_id is not None and trainer.state.fn == "fit":
            self._hide(self.val_progress_bar_id)
            self.refresh()

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if trainer.state.fn == "fit":
            self._update_metrics(trainer, pl_module)
        self.reset_dataloader_idx_tracker()

    @override
    def on_test_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self.reset_dataloader_idx_tracker()

    on_predict_end = on_test_end

    @override
    def teardown(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        self._stop_progress()

    @override
    def on_exception(self, trainer: Trainer, pl_module: TrainModule, exception: BaseException) -> None:
        self._stop_progress()

    # ----------------------------------------------------------------- hooks: training
    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self.is_disabled:
            return
        total, description = self.total_train_batches, self._get_train_description(trainer.current_epoch)
        if self.train_progress_bar_id is not None and self._leave:
            self._stop_progress()  # the finished epoch's bar stays on screen; a new progress object below it
            self._init_progress(trainer)
        if self.progress is not None:
            if self.train_progress_bar_id is None:
                self.train_progress_bar_id = self._add_task(total, description)
            else:
                self.progress.reset(self.train_progress_bar_id, total=total, description=description, visible=True)
        self.refresh()

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.progress is None:  # off (or on another rank): nothing to do at any batch
            return
        if self.train_progress_bar_id is None and self.is_enabled:  # a run resumed within an epoch
            self.train_progress_bar_id = self._add_task(
                self.total_train_batches, self._get_train_description(trainer.current_epoch)
            )
        self._update(self.train_progress_bar_id, batch_idx + 1)
        self._update_metrics(trainer, pl_module)
        self.refresh()

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._update_metrics(trainer, pl_module)
        self.refresh()

    # ----------------------------------------------------------------- hooks: evaluation
    def _new_eval_bar(self, old: TaskID | None, total: int | float, description: str, visible: bool = True) -> TaskID:
        self._hide(old)
        task_id = self._add_task(total, description, visible=visible)
        self.refresh()
        return task_id

    @override
    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.is_disabled or not self.has_dataloader_changed(dataloader_idx):
            return
        total = self.total_val_batches_current_dataloader
        if trainer.sanity_checking:
            self.val_sanity_progress_bar_id = self._new_eval_bar(
                self.val_sanity_progress_bar_id, total, self.sanity_check_description, visible=False
            )
        else:
            self.val_progress_bar_id = self._new_eval_bar(
                self.val_progress_bar_id, total, self.validation_description, visible=False
            )

    @override
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.is_enabled:
            bar = self.val_sanity_progress_bar_id if trainer.sanity_checking else self.val_progress_bar_id
            self._update(bar, batch_idx + 1)

    @override
    def on_test_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.is_disabled or not self.has_dataloader_changed(dataloader_idx):
            return
        total = self.total_test_batches_current_dataloader
        self.test_progress_bar_id = self._new_eval_bar(self.test_progress_bar_id, total, self.test_description)

    @override
    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._update(self.test_progress_bar_id, batch_idx + 1)

    @override
    def on_predict_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.is_disabled or not self.has_dataloader_changed(dataloader_idx):
            return
        total = self.total_predict_batches_current_dataloader
        self.predict_progress_bar_id = self._new_eval_bar(self.predict_progress_bar_id, total, self.predict_description)

    @override
    def on_predict_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._update(self.predict_progress_bar_id, batch_idx + 1)
