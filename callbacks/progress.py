"""``ProgressBar``: rich progress in a terminal, plain periodic lines anywhere else (rank 0 only)."""

from __future__ import annotations

import math
import sys
import time
import warnings
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TextIO

from typing_extensions import override

from callbacks.base import Callback

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["ProgressBar", "get_standard_metrics"]


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


def _batches(n: int) -> str:
    """``"1 batch"``, ``"2 batches"``."""
    return "1 batch" if n == 1 else f"{n} batches"


class ProgressBar(Callback):
    """Show training and validation progress with it/s, ETA and the values logged with ``prog_bar=True``.

    In a terminal this is a ``rich`` bar per training epoch and a transient one per validation
    pass. When the output is not a terminal (CI logs, files, ``| tee``) redrawing would fill the log
    with control codes, so it prints a plain line instead every ``refresh_every_n_steps`` training
    batches, at each epoch end and after each validation pass::

        epoch 0 | batch 10/23 | step 10 | 41.3 it/s | eta 0:00:00 | train/loss=1.52
        epoch 0 | batch 23/23 | step 23 | 40.8 it/s | took 0:00:01 | train/loss=0.93
        validation | epoch 0 | 2 batches | val/acc=0.914 val/loss=0.412

    Only rank 0 prints.

    Args:
        refresh_every_n_steps: plain output: training batches between lines.
        stream: where to write (default: standard output at the time of writing).
        force_plain: print plain lines even to a terminal.
        refresh_rate: terminal: batches between redraws of the bar (Lightning's ``refresh_rate``);
            0 turns the progress output off, as in Lightning.
        console_kwargs: passed to the rich ``Console`` that draws the bar.
    """

    def __init__(
        self,
        refresh_every_n_steps: int = 50,
        stream: TextIO | None = None,
        force_plain: bool = False,
        refresh_rate: int = 10,
        console_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if refresh_every_n_steps < 1:
            raise ValueError(f"refresh_every_n_steps must be >= 1, got {refresh_every_n_steps}")
        if refresh_rate < 0:
            raise ValueError(f"refresh_rate must be >= 0 (0 turns the progress bar off), got {refresh_rate}")
        self.refresh_every_n_steps = refresh_every_n_steps
        self.refresh_rate = refresh_rate
        self.console_kwargs = dict(console_kwargs or {})
        self.stream = stream
        self.force_plain = force_plain
        self._progress: Progress | None = None
        self._train_task: TaskID | None = None
        self._val_task: TaskID | None = None
        self._started = 0.0
        self._val_batches = 0
        self._plain_lines = False  # this epoch prints plain lines (rank 0, not a terminal); set per epoch

    def _shows(self, trainer: Trainer) -> bool:
        return trainer.is_global_zero and self.refresh_rate > 0 and not self._disabled

    # ----------------------------------------------------------------- Lightning's ProgressBar methods
    _disabled = False

    @staticmethod
    def check_one(callbacks: list[Any], enabled: bool) -> ProgressBar | None:
        """The bar in ``callbacks``; two, or one beside ``enable_progress_bar=False``, are refused as in Lightning."""
        from trainer.common.errors import MisconfigurationException

        bars = [cb for cb in callbacks if isinstance(cb, ProgressBar)]
        if len(bars) > 1:
            raise MisconfigurationException(
                "You added multiple progress bar callbacks to the Trainer, but currently only one progress bar is "
                f"supported: {', '.join(type(cb).__name__ for cb in bars)}"
            )
        if bars and not enabled:
            raise MisconfigurationException(
                f"Trainer was configured with `enable_progress_bar=False` but found `{type(bars[0]).__name__}` in "
                "callbacks list: remove it, or leave enable_progress_bar at True"
            )
        return bars[0] if bars else None

    def disable(self) -> None:
        """Show nothing from now on (Lightning's ``ProgressBar.disable``)."""
        self._disabled = True

    def enable(self) -> None:
        """Show progress again after :meth:`disable`."""
        self._disabled = False

    @property
    def is_enabled(self) -> bool:
        """Whether progress is shown (``refresh_rate > 0`` and not disabled)."""
        return self.refresh_rate > 0 and not self._disabled

    @property
    def is_disabled(self) -> bool:
        """The opposite of :attr:`is_enabled`."""
        return not self.is_enabled

    def get_metrics(self, trainer: Trainer, pl_module: TrainModule) -> dict[str, int | str | float | dict[str, float]]:
        """What the bar shows beside the counts: :func:`get_standard_metrics` and everything logged with ``prog_bar=True``.

        Override it to change the items (Lightning's hook; a logged value named like a standard one wins, warned).
        """
        standard = get_standard_metrics(trainer)
        logged = trainer.progress_bar_metrics
        duplicates = sorted(standard.keys() & logged.keys())
        if duplicates:
            warnings.warn(
                f"The progress bar already tracks a metric with the name(s) '{', '.join(duplicates)}' and"
                f" `self.log('{duplicates[0]}', ..., prog_bar=True)` will overwrite this value. "
                " If this is undesired, change the name or override `get_metrics()` in the progress bar callback.",
                UserWarning,
                stacklevel=2,
            )
        return {**standard, **logged}

    # Lightning's ProgressBar attributes, for progress bars written as its subclasses.
    _trainer: Trainer | None = None
    _current_eval_dataloader_idx: int | None = None
    sanity_check_description = "Sanity Checking"
    train_description = "Training"
    validation_description = "Validation"
    test_description = "Testing"
    predict_description = "Predicting"

    @override
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        self._trainer = trainer
        if not trainer.is_global_zero:
            self.disable()  # only rank 0 shows progress (Lightning disables the bar on the other ranks)

    @property
    def trainer(self) -> Trainer:
        """The trainer this bar reports on (set at ``setup``)."""
        if self._trainer is None:
            raise TypeError(f"{type(self).__name__}.trainer is set when a Trainer sets this callback up")
        return self._trainer

    @property
    def total_train_batches(self) -> int | float:
        """Training batches this epoch (``inf`` for a loader without length; fewer when ``max_steps`` ends it first
        in a run without an epoch limit)."""
        trainer = self.trainer
        if trainer.max_epochs == -1 and trainer.max_steps is not None and trainer.max_steps > 0:
            return min(trainer.num_training_batches, trainer.max_steps - trainer.global_step)
        return trainer.num_training_batches

    @property
    def total_val_batches(self) -> int | float:
        """Validation batches of all validation loaders in this epoch's validation (0 if it does not validate)."""
        trainer = self.trainer
        every = trainer.check_val_every_n_epoch
        if not trainer.enable_validation or (every is not None and (trainer.current_epoch + 1) % every):
            return 0
        num = trainer.num_val_batches
        return sum(num) if isinstance(num, list) else num

    def _of_current_loader(self, num: float | list[float]) -> int | float:
        return num[self._current_eval_dataloader_idx or 0] if isinstance(num, list) else num

    @property
    def total_val_batches_current_dataloader(self) -> int | float:
        """Batches of the validation loader being run (the sanity check's count while it runs)."""
        trainer = self.trainer
        return self._of_current_loader(
            trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches
        )

    @property
    def total_test_batches_current_dataloader(self) -> int | float:
        """Batches of the test loader being run."""
        return self._of_current_loader(self.trainer.num_test_batches)

    @property
    def total_predict_batches_current_dataloader(self) -> int | float:
        """Batches of the predict loader being run."""
        return self._of_current_loader(self.trainer.num_predict_batches)

    def has_dataloader_changed(self, dataloader_idx: int) -> bool:
        """Record ``dataloader_idx`` as the current loader; whether it differs from the one before."""
        old, self._current_eval_dataloader_idx = self._current_eval_dataloader_idx, dataloader_idx
        return old != dataloader_idx

    def reset_dataloader_idx_tracker(self) -> None:
        """Forget the current loader (a new evaluation begins)."""
        self._current_eval_dataloader_idx = None

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print a line (to this bar's stream) without breaking the bar."""
        if self._progress is not None and set(kwargs) <= {"sep", "end"}:
            self._progress.console.print(*args, **kwargs)
        else:
            print(*args, **{"file": self._out, **kwargs})

    @property
    def _out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stdout

    def _interactive(self) -> bool:
        return not self.force_plain and bool(getattr(self._out, "isatty", lambda: False)())

    @staticmethod
    def _metrics_text(trainer: Trainer) -> str:
        return " ".join(f"{k}={float(v):.4g}" for k, v in sorted(trainer.progress_bar_metrics.items()))

    def _bar(self) -> Progress:
        if self._progress is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[metrics]}"),
                console=Console(**{"file": self._out, **self.console_kwargs}),
            )
            self._progress.start()
        return self._progress

    @staticmethod
    def _total(num: float | list[float]) -> int | None:
        num = sum(num) if isinstance(num, list) else num  # several validation loaders: all their batches
        return None if math.isinf(num) else int(num)

    # ----------------------------------------------------------------- training
    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._plain_lines = False
        if not self._shows(trainer):
            return
        self._started = time.perf_counter()
        self._plain_lines = not self._interactive()
        if not self._plain_lines:
            self._train_task = self._bar().add_task(
                f"Epoch {trainer.current_epoch}",
                total=self._total(trainer.num_training_batches),
                completed=trainer.progress.batch_in_epoch,
                rate="",
                metrics="",
            )

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Runs every batch, so the rank and terminal tests were done once, in on_train_epoch_start.
        done = batch_idx + 1
        if self._progress is not None and self._train_task is not None:  # only ever set on rank 0
            if done % self.refresh_rate == 0 or done == trainer.num_training_batches:  # a redraw costs a little
                self._progress.update(
                    self._train_task,
                    completed=done,
                    rate=f"{self._rate(done):.1f} it/s",
                    metrics=self._metrics_text(trainer),
                )
        elif self._plain_lines and done % self.refresh_every_n_steps == 0 and done != trainer.num_training_batches:
            self._line(trainer, done, final=False)  # the epoch's last batch gets the epoch-end line instead

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not self._shows(trainer):
            return
        done = trainer.progress.batch_in_epoch
        if self._progress is not None and self._train_task is not None:
            self._progress.update(self._train_task, completed=done, metrics=self._metrics_text(trainer))
            self._train_task = None
        elif not self._interactive():
            self._line(trainer, done, final=True)

    def _rate(self, done: int) -> float:
        return done / max(time.perf_counter() - self._started, 1e-9)

    def _line(self, trainer: Trainer, done: int, final: bool) -> None:
        total = trainer.num_training_batches
        rate = self._rate(done)
        parts = [
            f"epoch {trainer.current_epoch}",
            f"batch {done}/{'?' if math.isinf(total) else int(total)}",
            f"step {trainer.global_step}",
            f"{rate:.1f} it/s",
        ]
        if final:
            parts.append(f"took {_clock(time.perf_counter() - self._started)}")
        elif not math.isinf(total):
            parts.append(f"eta {_clock((total - done) / max(rate, 1e-9))}")
        metrics = self._metrics_text(trainer)
        if metrics:
            parts.append(metrics)
        print(" | ".join(parts), file=self._out, flush=True)

    # ----------------------------------------------------------------- validation
    @override
    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not self._shows(trainer):
            return
        self._val_batches = 0
        if self._interactive():
            label = "Sanity check" if trainer.sanity_checking else "Validation"
            self._val_task = self._bar().add_task(
                label, total=self._total(trainer.num_val_batches), rate="", metrics=""
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
        self._val_batches = batch_idx + 1  # (a count; the bar below exists only on rank 0)
        if self._progress is not None and self._val_task is not None:
            self._progress.update(self._val_task, completed=self._val_batches)

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not self._shows(trainer):
            return
        if self._progress is not None and self._val_task is not None:
            self._progress.remove_task(self._val_task)  # transient: the epoch bar shows its metrics
            self._val_task = None
            if self._train_task is not None:
                self._progress.update(self._train_task, metrics=self._metrics_text(trainer))
        elif not self._interactive() and not trainer.sanity_checking:
            metrics = self._metrics_text(trainer)
            print(
                f"validation | epoch {trainer.current_epoch} | {_batches(self._val_batches)}"
                + (f" | {metrics}" if metrics else ""),
                file=self._out,
                flush=True,
            )

    @override
    def teardown(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._train_task = self._val_task = None


def get_standard_metrics(trainer: Trainer) -> dict[str, int | str]:
    """The items every bar shows: ``v_num``, the loggers' version (a string version's last 4 characters)."""
    versions = list(dict.fromkeys(getattr(logger, "version", None) for logger in trainer.loggers))
    version: Any = versions[0] if len(versions) == 1 else "_".join(str(v) for v in versions)
    if version in ("", None):  # no logger ("" joined), or one without a version
        return {}
    return {"v_num": version[-4:] if isinstance(version, str) else version}
