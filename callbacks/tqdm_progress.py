"""``TQDMProgressBar``: Lightning's default progress bar, drawn with tqdm (rank 0 only).

Lightning's ``callbacks.progress.tqdm_progress`` (``TQDMProgressBar``, ``Tqdm``, ``convert_inf``) under
geartrain: up to four tqdm bars (sanity check, training, validation, test/predict), their objects
reachable as ``train_progress_bar``, ``val_progress_bar``, ``test_progress_bar``,
``predict_progress_bar``, and each made by an ``init_*_tqdm`` method a subclass overrides to style it.
geartrain's own default bar is :class:`~callbacks.ProgressBar` (rich in a terminal, plain lines in a log).
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from callbacks._bar_switch import BarSwitch
from callbacks.progress import ProgressBar

if importlib.util.find_spec("ipywidgets") is not None:  # notebooks get tqdm's widget, as in Lightning
    from tqdm.auto import tqdm as _tqdm
else:
    from tqdm import tqdm as _tqdm

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["TQDMProgressBar", "Tqdm", "convert_inf"]

#: Width numbers shown as floats or strings are padded to, so the postfix does not flicker as digits change.
_PAD_SIZE = 5


class Tqdm(_tqdm):
    """tqdm whose postfix numbers are padded with zeros to a steady width (``1.2`` -> ``1.200``)."""

    @staticmethod
    def format_num(n: int | float | str) -> str:
        """tqdm's number format, floats and numeric strings padded with zeros to :data:`_PAD_SIZE` characters.

        >>> Tqdm.format_num(1.2), Tqdm.format_num(3), Tqdm.format_num("7"), Tqdm.format_num(1e-9)
        ('1.200', '3', '7.000', '1e-9')
        """
        padded = isinstance(n, (float, str))
        text = n if isinstance(n, str) else str(_tqdm.format_num(n))
        if not padded or "e" in text:
            return text
        if "." not in text and len(text) < _PAD_SIZE:
            try:
                float(text)
            except ValueError:
                return text
            text += "."
        return text + "0" * (_PAD_SIZE - len(text))


def convert_inf(x: int | float | None) -> int | float | None:
    """``None`` for an infinite or NaN total (tqdm's "unknown"), else ``x``."""
    if x is None or math.isinf(x) or math.isnan(x):
        return None
    return x


def _update_n(bar: _tqdm, value: int) -> None:
    if not bar.disable:
        bar.n = value
        bar.refresh()


class _BarSlot:
    """One of Lightning's ``*_progress_bar`` attributes: reads ``_<name>`` and refuses it while unset."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc
        self._attr = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._attr = f"_{name}"

    def __get__(self, bar_callback: Any, owner: type | None = None) -> Any:
        if bar_callback is None:
            return self
        bar = getattr(bar_callback, self._attr)
        if bar is None:
            raise TypeError(f"The `{type(bar_callback).__name__}.{self._attr}` reference has not been set yet.")
        return bar

    def __set__(self, bar_callback: Any, bar: _tqdm) -> None:
        setattr(bar_callback, self._attr, bar)


class TQDMProgressBar(BarSwitch, ProgressBar):
    """Lightning's default progress bar: tqdm bars on standard output, rank 0 only.

    Args:
        refresh_rate: batches between redraws; 0 turns the bars off. ``TQDM_MINITERS`` in the
            environment raises it, and on Colab (``COLAB_GPU``) the default 1 becomes 20, as in Lightning.
        process_position: offset the bars by this many lines (twice this, one line for the
            validation bar under the training bar), to show them beside other bars.
        leave: keep each epoch's finished training bar on screen (a new bar per epoch).
    """

    BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False) -> None:
        super().__init__(refresh_rate=max(refresh_rate, 0))
        self._refresh_rate = self._resolve_refresh_rate(refresh_rate)
        self._process_position = process_position
        self._enabled = True
        self._leave = leave
        self._train_progress_bar: _tqdm | None = None
        self._val_progress_bar: _tqdm | None = None
        self._test_progress_bar: _tqdm | None = None
        self._predict_progress_bar: _tqdm | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (a checkpoint's or a spawned process's copy) without the live tqdm objects."""
        return {k: None if isinstance(v, _tqdm) else v for k, v in vars(self).items()}

    @staticmethod
    def _resolve_refresh_rate(refresh_rate: int) -> int:
        if os.getenv("COLAB_GPU") and refresh_rate == 1:
            return 20  # a notebook's output cannot keep up with a redraw per batch
        if "TQDM_MINITERS" in os.environ:
            return max(int(os.environ["TQDM_MINITERS"]), refresh_rate)
        return refresh_rate

    # ----------------------------------------------------------------- the bars
    train_progress_bar = _BarSlot("The training bar (set at ``on_train_start``).")
    val_progress_bar = _BarSlot("The validation (or sanity check) bar.")
    test_progress_bar = _BarSlot("The test bar.")
    predict_progress_bar = _BarSlot("The predict bar.")

    @property
    def process_position(self) -> int:
        """Lines the bars are offset by."""
        return self._process_position

    def _new(self, desc: str, position: int, leave: bool, smoothing: float | None = None) -> Tqdm:
        kwargs: dict[str, Any] = {} if smoothing is None else {"smoothing": smoothing}
        return Tqdm(
            desc=desc,
            position=position,
            disable=self.is_disabled,
            leave=leave,
            dynamic_ncols=True,
            file=sys.stdout,
            bar_format=self.BAR_FORMAT,
            **kwargs,
        )

    def init_sanity_tqdm(self) -> Tqdm:
        """The sanity check's bar (override to style it)."""
        return self._new(self.sanity_check_description, 2 * self.process_position, leave=False)

    def init_train_tqdm(self) -> Tqdm:
        """The training bar (override to style it)."""
        return self._new(self.train_description, 2 * self.process_position, leave=True, smoothing=0)

    def init_predict_tqdm(self) -> Tqdm:
        """The predict bar (override to style it)."""
        return self._new(self.predict_description, 2 * self.process_position, leave=True, smoothing=0)

    def init_validation_tqdm(self) -> Tqdm:
        """The validation bar: under the training bar during fit, alone (and left on screen) in ``validate``."""
        has_main_bar = self.trainer.state.fn != "validate"
        return self._new(self.validation_description, 2 * self.process_position + has_main_bar, leave=not has_main_bar)

    def init_test_tqdm(self) -> Tqdm:
        """The test bar (override to style it)."""
        return self._new("Testing", 2 * self.process_position, leave=True)

    def _should_update(self, current: int, total: int | float | None) -> bool:
        return self.is_enabled and (current % self.refresh_rate == 0 or current == total)

    def _advance(self, bar: _tqdm | None, batch_idx: int) -> None:
        """An evaluation bar after batch ``batch_idx``: redrawn every ``refresh_rate`` batches and at the end."""
        n = batch_idx + 1
        if bar is not None and self._should_update(n, bar.total):
            _update_n(bar, n)

    def _next_loader(self, bar: _tqdm, total: int | float | None, description: str, dataloader_idx: int) -> None:
        """Start ``bar`` again for a new evaluation loader (Lightning names it ``<description> DataLoader <i>``)."""
        if self.has_dataloader_changed(dataloader_idx):
            self._restart(bar, total, f"{description} DataLoader {dataloader_idx}")

    def _restart(self, bar: _tqdm, total: int | float | None, description: str) -> None:
        bar.reset()
        bar.total = convert_inf(total)
        bar.initial = 0
        bar.set_description(description)

    # ----------------------------------------------------------------- sanity check and training
    @override
    def on_sanity_check_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self.val_progress_bar = self.init_sanity_tqdm()
        self.train_progress_bar = Tqdm(disable=True)  # a stand-in until training starts

    @override
    def on_sanity_check_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self.val_progress_bar.close()
        self.train_progress_bar.close()

    @override
    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self.train_progress_bar = self.init_train_tqdm()

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._leave:
            self.train_progress_bar = self.init_train_tqdm()
        self._restart(self.train_progress_bar, self.total_train_batches, f"Epoch {trainer.current_epoch}")

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        n = batch_idx + 1
        bar = self._train_progress_bar
        if bar is not None and self._should_update(n, bar.total):
            _update_n(bar, n)
            bar.set_postfix(self.get_metrics(trainer, pl_module))

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))
        if self._leave:
            self.train_progress_bar.close()

    @override
    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self.train_progress_bar.close()

    # ----------------------------------------------------------------- evaluation
    @override
    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not trainer.sanity_checking:
            self.val_progress_bar = self.init_validation_tqdm()

    @override
    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        desc = self.sanity_check_description if trainer.sanity_checking else self.validation_description
        self._next_loader(self.val_progress_bar, self.total_val_batches_current_dataloader, desc, dataloader_idx)

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
        self._advance(self._val_progress_bar, batch_idx)

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self.val_progress_bar.close()
        self.reset_dataloader_idx_tracker()
        if self._train_progress_bar is not None and trainer.state.fn == "fit":
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    @override
    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self.test_progress_bar = self.init_test_tqdm()

    @override
    def on_test_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._next_loader(
            self.test_progress_bar, self.total_test_batches_current_dataloader, self.test_description, dataloader_idx
        )

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
        self._advance(self._test_progress_bar, batch_idx)

    @override
    def on_test_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self.test_progress_bar.close()
        self.reset_dataloader_idx_tracker()

    @override
    def on_predict_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self.predict_progress_bar = self.init_predict_tqdm()

    @override
    def on_predict_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._next_loader(
            self.predict_progress_bar,
            self.total_predict_batches_current_dataloader,
            self.predict_description,
            dataloader_idx,
        )

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
        self._advance(self._predict_progress_bar, batch_idx)

    @override
    def on_predict_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self.predict_progress_bar.close()
        self.reset_dataloader_idx_tracker()

    @override
    def teardown(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        """Nothing to stop: each bar is closed at the end of its loop."""

    @override
    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        """Write a line above the first drawing bar (training, validation, test, predict), without breaking it."""
        for bar in (
            self._train_progress_bar,
            self._val_progress_bar,
            self._test_progress_bar,
            self._predict_progress_bar,
        ):
            if bar is not None and not bar.disable:
                bar.write(sep.join(map(str, args)), **kwargs)
                return
