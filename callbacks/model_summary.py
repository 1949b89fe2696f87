"""``ModelSummary``: a table of the module's layers and parameter counts at fit start."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

import torch
from torch import nn
from typing_extensions import override

from callbacks.base import Callback

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["ModelSummary", "RichModelSummary", "Summary", "summarize"]

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

    With an ``example_input_array`` on the module (Lightning's attribute), the table has "In sizes"
    and "Out sizes" columns, from one forward pass of that input (eval mode, no gradients).
    """
    rows: list[tuple[str, ...]] = []
    # max_depth=-1: every level (Lightning's meaning).
    names = [n for n, _ in module.named_modules() if n and (max_depth < 0 or n.count(".") + 1 <= max_depth)]
    sizes = _io_sizes(module, names)
    wanted = set(names)
    for name, sub in module.named_modules():
        if name not in wanted:
            continue
        row = (name, type(sub).__name__, f"{sum(_count(sub)):,}")
        rows.append(row + sizes.get(name, ("?", "?")) if sizes else row)
    header: tuple[str, ...] = ("Name", "Type", "Params") + (("In sizes", "Out sizes") if sizes else ())
    widths = [max([len(header[i])] + [len(r[i]) for r in rows]) for i in range(len(header))]
    index_width = len(str(max(len(rows) - 1, 0)))

    def line(idx: str, cells: tuple[str, ...]) -> str:
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


class Summary:
    """A module's summary as an object (Lightning's ``utilities.model_summary.ModelSummary``).

    ``print(Summary(model, max_depth=2))`` prints :func:`summarize`'s table; the counts are attributes.

    >>> Summary(nn.Linear(2, 3)).total_parameters
    9
    """

    def __init__(self, model: nn.Module, max_depth: int = 1) -> None:
        self.model = model
        self.max_depth = max_depth

    @property
    def trainable_parameters(self) -> int:
        """Parameters that require gradients."""
        return _count(self.model)[0]

    @property
    def total_parameters(self) -> int:
        """All parameters."""
        return sum(_count(self.model))

    def __str__(self) -> str:
        return summarize(self.model, self.max_depth)

    __repr__ = __str__


def _io_sizes(module: nn.Module, names: list[str]) -> dict[str, tuple[str, str]]:
    """``{name: (in sizes, out sizes)}`` of the ``names`` submodules for ``module.example_input_array``."""
    example = getattr(module, "example_input_array", None)
    if example is None or not names:
        return {}
    sizes: dict[str, tuple[str, str]] = {}

    def recorder(name: str) -> Any:
        def hook(_: nn.Module, inputs: Any, output: Any) -> None:
            shown = inputs[0] if isinstance(inputs, tuple) and len(inputs) == 1 else inputs
            sizes[name] = (_size(shown), _size(output))

        return hook

    subs = dict(module.named_modules())
    handles = [subs[name].register_forward_hook(recorder(name)) for name in names]
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    example = _to(example, device)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            if isinstance(example, dict):
                module(**example)
            elif isinstance(example, tuple):
                module(*example)
            else:
                module(example)
    finally:
        for handle in handles:
            handle.remove()
        module.train(was_training)
    return sizes


def _size(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return str(list(value.shape))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_size(v) for v in value) + "]"
    return "?"


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


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
    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if trainer.is_global_zero:
            print(summarize(pl_module, self.max_depth), file=self.stream or sys.stdout, flush=True)


class RichModelSummary(ModelSummary):
    """Lightning's name for the summary drawn with rich; here the same plain table as :class:`ModelSummary`."""
