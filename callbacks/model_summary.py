"""``ModelSummary``: a table of the module's layers and parameter counts at fit start."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from torch import nn
from typing_extensions import override

from callbacks.base import Callback

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["ModelSummary", "summarize"]


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
    """The table :class:`ModelSummary` prints: one row per submodule down to ``max_depth`` levels.

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
        if not name or depth > max_depth:
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
        max_depth: how deep to list submodules (1: direct children only; 0 prints totals only).
        stream: where to print (default: standard output).
    """

    def __init__(self, max_depth: int = 1, stream: TextIO | None = None) -> None:
        if max_depth < 0:
            raise ValueError(f"max_depth must be >= 0, got {max_depth}")
        self.max_depth = max_depth
        self.stream = stream

    @override
    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.is_global_zero:
            print(summarize(module, self.max_depth), file=self.stream or sys.stdout, flush=True)
