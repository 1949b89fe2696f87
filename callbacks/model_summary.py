"""``ModelSummary``: a table of the module's layers and parameter counts at fit start."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

from torch import nn
from typing_extensions import override

from callbacks.base import Callback

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["ModelSummary", "RichModelSummary", "summarize"]

#: ``summarize_kwargs`` Lightning's summaries read: styling only, accepted and without effect here.
STYLING_KWARGS = frozenset({"header_style"})


def _count(module: nn.Module) -> tuple[int, int]:
    """(trainable, frozen) parameter counts; uninitialised (lazy) parameters count as 0."""
    trainable = frozen = 0
    for p in module.parameters():
        if isinstance(p, nn.parameter.UninitializedParameter):
            continue
        if p.requires_grad:
            trainable += p.numel()
        else:
            frozen += p.numel()
    return trainable, frozen


def summarize(module: nn.Module, max_depth: int = 1) -> str:
    """The table :class:`ModelSummary` prints: one row per submodule down to ``max_depth`` levels (-1: all).

    >>> print(summarize(nn.Sequential(nn.Linear(2, 3), nn.ReLU())))  # doctest: +NORMALIZE_WHITESPACE
      | Name | Type   | Params
    --------------------------
    0 | 0    | Linear | 9
    1 | 1    | ReLU   | 0
    --------------------------
    9         Trainable params
    0         Non-trainable params
    9         Total params
    0.000     Total estimated params size (MB)
    """
    rows: list[tuple[str, str, str]] = []
    for name, sub in module.named_modules():
        depth = name.count(".") + 1
        if not name or (max_depth >= 0 and depth > max_depth):
            continue
        rows.append((name, type(sub).__name__, f"{sum(_count(sub)):,}"))
    header = ("Name", "Type", "Params")
    widths = [max([len(header[i])] + [len(r[i]) for r in rows]) for i in range(3)]
    index_width = len(str(max(len(rows) - 1, 0)))

    def line(idx: str, cells: tuple[str, str, str]) -> str:
        return f"{idx:<{index_width}} | " + " | ".join(f"{c:<{w}}" for c, w in zip(cells, widths)).rstrip()

    table = [line("", header)]
    rule = "-" * max(len(table[0]), 20)
    table.append(rule)
    table.extend(line(str(i), row) for i, row in enumerate(rows))
    table.append(rule)
    trainable, frozen = _count(module)
    size_mb = sum(
        p.numel() * p.element_size()
        for p in module.parameters()
        if not isinstance(p, nn.parameter.UninitializedParameter)
    ) / (1024 * 1024)
    for value, label in (
        (f"{trainable:,}", "Trainable params"),
        (f"{frozen:,}", "Non-trainable params"),
        (f"{trainable + frozen:,}", "Total params"),
        (f"{size_mb:.3f}", "Total estimated params size (MB)"),
    ):
        table.append(f"{value:<9} {label}")
    return "\n".join(table)


class ModelSummary(Callback):
    """Print a table of the module's layers and parameter counts when fitting starts (rank 0 only).

    Args:
        max_depth: how deep to list submodules (1: direct children only; 0 prints totals only;
            -1: every level).
        stream: where to print (default: standard output).
        **summarize_kwargs: Lightning's styling options (``header_style``): accepted, without
            effect on this plain table. Any other name is refused.
    """

    def __init__(self, max_depth: int = 1, stream: TextIO | None = None, **summarize_kwargs: Any) -> None:
        if max_depth < -1:
            raise ValueError(f"max_depth must be >= -1 (-1 lists every level), got {max_depth}")
        unknown = sorted(set(summarize_kwargs) - STYLING_KWARGS)
        if unknown:
            raise TypeError(
                f"{type(self).__name__}: unknown option(s) {', '.join(unknown)}; the options are max_depth, "
                f"stream and the styling option(s) {', '.join(sorted(STYLING_KWARGS))}"
            )
        self.max_depth = max_depth
        self.stream = stream

    @override
    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.is_global_zero:
            print(summarize(module, self.max_depth), file=self.stream or sys.stdout, flush=True)


class RichModelSummary(ModelSummary):
    """Lightning's name for the summary drawn with rich; here the same plain table as :class:`ModelSummary`."""
