"""The ``rich`` parts of :class:`~callbacks.rich_progress.RichProgressBar`: its columns and progress object.

Lightning's names (``CustomProgress``, ``CustomBarColumn``, ``BatchesProcessedColumn``, ``CustomTimeColumn``,
``ProcessingSpeedColumn``, ``MetricsTextColumn``, ``CustomInfiniteTask``), which
``callbacks/rich_progress.py`` imports (and a subclass or a test replaces) there. Imported only when
``rich`` is installed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
from rich.console import RenderableType
from rich.live import _RefreshThread as _RichRefreshThread
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID
from rich.progress_bar import ProgressBar as _RichBar
from rich.style import Style
from rich.text import Text
from typing_extensions import override

if TYPE_CHECKING:
    from trainer.trainer import Trainer

__all__ = [
    "BatchesProcessedColumn",
    "CustomBarColumn",
    "CustomInfiniteTask",
    "CustomProgress",
    "CustomTimeColumn",
    "MetricsTextColumn",
    "ProcessingSpeedColumn",
]


class CustomBarColumn(BarColumn):
    """The bar column, pulsing (instead of failing) for a loader without a length (an infinite total)."""

    @override
    def render(self, task: Task) -> _RichBar:
        total, completed = task.total or 0.0, task.completed
        unknown = not task.started or not math.isfinite(total)
        return _RichBar(
            total=max(0.0, total),
            completed=max(0.0, completed),
            width=None if self.bar_width is None else max(1, self.bar_width),
            pulse=unknown,
            animation_time=task.get_time(),
            style=self.style,
            complete_style=self.complete_style,
            finished_style=self.finished_style,
            pulse_style=self.pulse_style,
        )


@dataclass
class CustomInfiniteTask(Task):
    """A task with an infinite total (an ``IterableDataset``): no time remaining is estimated."""

    @property
    def time_remaining(self) -> float | None:
        """Unknown: the total is."""
        return None


class _OnDemandRefresh(_RichRefreshThread):
    """rich's refresh thread, redrawing only after :meth:`CustomProgress.soft_refresh` asked for it.

    rich's own thread redraws at every tick; a training loop updates the bar at every batch, so a redraw
    that nobody asked for would only take time from the loop.
    """

    def __init__(self, live: Any, refresh_per_second: float) -> None:
        self.refresh_cond = False
        super().__init__(live, refresh_per_second)

    @override
    def run(self) -> None:
        while not self.done.wait(1 / self.refresh_per_second):
            if self.refresh_cond:
                self.refresh_cond = False
                with self.live._lock:
                    if not self.done.is_set():
                        self.live.refresh()


class CustomProgress(Progress):
    """rich's ``Progress`` with tasks of infinite total and a refresh thread that redraws on request."""

    @override
    def start(self) -> None:
        live = self.live
        if not live.auto_refresh:
            super().start()
            return
        live.auto_refresh = False  # rich would start its own thread: ours replaces it
        super().start()
        live.auto_refresh = True
        if live._started and not live._nested:
            live._refresh_thread = _OnDemandRefresh(live, live.refresh_per_second)
            live._refresh_thread.start()

    @override
    def stop(self) -> None:
        thread = self.live._refresh_thread
        super().stop()
        if thread is not None:
            thread.stop()
            thread.join()

    def soft_refresh(self) -> None:
        """Ask the refresh thread for a redraw at its next tick (a no-op without one)."""
        thread = self.live._refresh_thread
        if isinstance(thread, _OnDemandRefresh):
            thread.refresh_cond = True

    @override
    def add_task(
        self,
        description: str,
        start: bool = True,
        total: float | None = 100.0,
        completed: int = 0,
        visible: bool = True,
        **fields: Any,
    ) -> TaskID:
        if total is None or math.isfinite(total):
            return super().add_task(description, start, total, completed, visible, **fields)
        with self._lock:
            task_id = self._task_index
            self._tasks[task_id] = CustomInfiniteTask(
                task_id,
                description,
                total,
                completed,
                visible=visible,
                fields=fields,
                _get_time=self.get_time,
                _lock=self._lock,
            )
            if start:
                self.start_task(task_id)
            self._task_index = TaskID(int(task_id) + 1)
        self.refresh()
        return task_id


class CustomTimeColumn(ProgressColumn):
    """``elapsed • remaining`` (``-:--:--`` when unknown), redrawn twice a second at most."""

    max_refresh = 0.5

    def __init__(self, style: str | Style) -> None:
        self.style = style
        super().__init__()

    @override
    def render(self, task: Task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        remaining = task.time_remaining
        shown = ["-:--:--" if s is None else str(timedelta(seconds=int(s))) for s in (elapsed, remaining)]
        return Text(" • ".join(shown), style=self.style)


class BatchesProcessedColumn(ProgressColumn):
    """``done/total`` batches (``--`` for an infinite total)."""

    def __init__(self, style: str | Style) -> None:
        self.style = style
        super().__init__()

    @override
    def render(self, task: Task) -> RenderableType:
        total: Any = "--" if task.total == float("inf") else task.total
        return Text(f"{int(task.completed)}/{total}", style=self.style)


class ProcessingSpeedColumn(ProgressColumn):
    """Batches per second (``0.00it/s`` before the first)."""

    def __init__(self, style: str | Style) -> None:
        self.style = style
        super().__init__()

    @override
    def render(self, task: Task) -> RenderableType:
        speed = 0.0 if task.speed is None else task.speed
        return Text(f"{speed:>.2f}it/s", style=self.style)


class MetricsTextColumn(ProgressColumn):
    """The metrics (``name: value``) beside the training bar of a ``fit``; empty beside every other bar.

    The bar hands the metrics over with :meth:`update`: rendering (in the refresh thread) never asks
    the trainer for them.
    """

    def __init__(self, trainer: Trainer, style: str | Style, text_delimiter: str, metrics_format: str) -> None:
        self._trainer = trainer
        self._metrics: dict[str, Any] = {}
        self._style = style
        self._text_delimiter = text_delimiter
        self._metrics_format = metrics_format
        super().__init__()

    def update(self, metrics: dict[str, Any]) -> None:
        """The metrics to show from now on."""
        self._metrics = metrics

    @override
    def render(self, task: Task) -> Text:
        trainer = self._trainer
        bar = trainer.progress_bar_callback
        if (
            trainer.state.fn != "fit"
            or trainer.sanity_checking
            or getattr(bar, "train_progress_bar_id", None) != task.id
        ):
            return Text()
        return Text(self._text_delimiter.join(self._texts()), justify="left", style=self._style)

    def _texts(self) -> list[str]:
        texts = []
        for name, value in self._metrics.items():
            if not isinstance(value, str):
                try:
                    value = f"{value:{self._metrics_format}}"
                except (TypeError, ValueError):
                    value = str(value)
            texts.append(f"{name}: {value}")
        return texts


def _as_numbers(value: Any) -> Any:
    """A tensor as its Python number, through dicts (rich prints numbers, not tensors)."""
    if isinstance(value, torch.Tensor):
        return value.item()
    if isinstance(value, dict):
        return {k: _as_numbers(v) for k, v in value.items()}
    return value
