"""``RichProgressBarTheme``: the styles of :class:`~callbacks.rich_progress.RichProgressBar` (needs no ``rich``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.style import Style

__all__ = ["RichProgressBarTheme"]


@dataclass
class RichProgressBarTheme:
    """The styles of :class:`RichProgressBar`'s parts (rich style strings or ``Style`` objects).

    Args:
        description: the bar's description ("Epoch 3/9", "Validation").
        progress_bar: the bar while it fills.
        progress_bar_finished: the filled bar.
        progress_bar_pulse: the bar of a loader without a length.
        batch_progress: the ``done/total`` count.
        time: elapsed and remaining time.
        processing_speed: batches per second.
        metrics: the metrics' text.
        metrics_text_delimiter: between two metrics.
        metrics_format: the format spec of a number (``".3f"``, ``".3e"``).
    """

    description: str | Style = ""
    progress_bar: str | Style = "#6206E0"
    progress_bar_finished: str | Style = "#6206E0"
    progress_bar_pulse: str | Style = "#6206E0"
    batch_progress: str | Style = ""
    time: str | Style = "dim"
    processing_speed: str | Style = "dim underline"
    metrics: str | Style = "italic"
    metrics_text_delimiter: str = " "
    metrics_format: str = ".3f"
