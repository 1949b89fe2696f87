"""``ProgressBar``: rich progress in a terminal, plain periodic lines anywhere else (rank 0 only)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from callbacks.base import Callback

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["ProgressBar"]


class ProgressBar(Callback):
    """Show training progress with it/s, ETA and the values logged with ``prog_bar=True``.

    Args:
        refresh_every_n_steps: when the output is not a terminal, print one line every this many
            training batches (and at every epoch end) instead of redrawing a bar.
        stream: where to write (default: standard output).
    """

    def __init__(self, refresh_every_n_steps: int = 50, stream: TextIO | None = None) -> None:
        self.refresh_every_n_steps = refresh_every_n_steps
        self.stream = stream
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._started = 0.0

    @property
    def _out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stdout

    def _interactive(self) -> bool:
        return bool(getattr(self._out, "isatty", lambda: False)())

    def _metrics_text(self, trainer: Trainer) -> str:
        parts = [f"{k}={float(v):.4g}" for k, v in sorted(trainer.progress_bar_metrics.items())]
        return " ".join(parts)

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        if not trainer.is_global_zero:
            return
        self._started = time.perf_counter()
        if self._interactive():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            if self._progress is None:
                self._progress = Progress(
                    TextColumn("[bold]{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TextColumn("{task.fields[rate]}"),
                    TimeRemainingColumn(),
                    TextColumn("{task.fields[metrics]}"),
                    console=Console(file=self._out),
                    transient=False,
                )
                self._progress.start()
            total = trainer.num_training_batches
            self._task = self._progress.add_task(
                f"Epoch {trainer.current_epoch}",
                total=None if total == float("inf") else int(total),
                rate="",
                metrics="",
            )

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero:
            return
        done = batch_idx + 1
        rate = done / max(time.perf_counter() - self._started, 1e-9)
        if self._progress is not None and self._task is not None:
            if done % 10 == 0 or done == trainer.num_training_batches:  # redraw cost is not free
                self._progress.update(
                    self._task, completed=done, rate=f"{rate:.1f} it/s", metrics=self._metrics_text(trainer)
                )
        elif done % self.refresh_every_n_steps == 0:
            self._line(trainer, done, rate)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if not trainer.is_global_zero:
            return
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, metrics=self._metrics_text(trainer))
        else:
            done = trainer.progress.batch_in_epoch
            self._line(trainer, done, done / max(time.perf_counter() - self._started, 1e-9))

    def _line(self, trainer: Trainer, done: int, rate: float) -> None:
        total = trainer.num_training_batches
        total_text = "?" if total == float("inf") else str(int(total))
        metrics = self._metrics_text(trainer)
        print(
            f"epoch {trainer.current_epoch} step {trainer.global_step} batch {done}/{total_text} "
            f"{rate:.1f} it/s" + (f" {metrics}" if metrics else ""),
            file=self._out,
            flush=True,
        )

    def teardown(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._task = None
