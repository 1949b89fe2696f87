"""The summary table as text, and the numbers in it (Lightning's ``get_human_readable_count``...).

:mod:`callbacks.layer_summary` gathers a model's summary; this file writes it as Lightning's plain
table, which ``ModelSummary`` prints at fit start.
"""

from __future__ import annotations

import math

__all__ = ["PARAMETER_NUM_UNITS", "format_summary_table", "get_formatted_model_size", "get_human_readable_count"]

#: Suffixes of :func:`get_human_readable_count`: units, thousands, millions, billions, trillions.
PARAMETER_NUM_UNITS = [" ", "K", "M", "B", "T"]


def format_summary_table(
    total_parameters: int,
    trainable_parameters: int,
    model_size: float,
    total_training_modes: dict[str, int],
    total_flops: int,
    *cols: tuple[str, list[str]],
) -> str:
    """The plain-text table: one line per row of ``cols`` between two rules, then the totals."""
    rows = len(cols[0][1]) if cols else 0
    widths = [max([len(header), *(len(str(cell)) for cell in cells)]) for header, cells in cols]
    rule = "-" * (sum(widths) + 3 * (len(cols) + 1))

    def line(cells: list[str]) -> str:
        return " | ".join(f"{cell:<{width}}" for cell, width in zip(cells, widths))

    lines = [line([header for header, _ in cols]), rule]
    lines.extend(line([str(cells[i]) for _, cells in cols]) for i in range(rows))
    lines.append(rule)
    totals = [
        (get_human_readable_count(trainable_parameters), "Trainable params"),
        (get_human_readable_count(total_parameters - trainable_parameters), "Non-trainable params"),
        (get_human_readable_count(total_parameters), "Total params"),
        (get_formatted_model_size(model_size), "Total estimated model params size (MB)"),
        (total_training_modes["train"], "Modules in train mode"),
        (total_training_modes["eval"], "Modules in eval mode"),
        (get_human_readable_count(total_flops), "Total Flops"),
    ]
    lines.extend(f"{value!s:<10}{label}" for value, label in totals)
    return "\n".join(lines)


def get_formatted_model_size(total_model_size: float) -> str:
    """A size in megabytes with three decimals and thousands separators (``"5,500.000"``)."""
    return f"{total_model_size:,.3f}"


def get_human_readable_count(number: float) -> str:
    """``number`` with K, M, B or T for thousands, millions, billions, trillions (never beyond T).

    >>> [get_human_readable_count(n) for n in (123, 1234, 2e6, 4e14, 5e15)]
    ['123  ', '1.2 K', '2.0 M', '400 T', '5,000 T']
    """
    if number < 0:
        raise ValueError(f"get_human_readable_count counts parameters: expected a number >= 0, got {number}")
    digits = math.floor(math.log10(number)) + 1 if number > 0 else 1
    group = min(math.ceil(digits / 3), len(PARAMETER_NUM_UNITS)) - 1
    scaled = number / 10 ** (3 * group) if group else number
    if group == 0 or scaled >= 100:
        return f"{int(scaled):,d} {PARAMETER_NUM_UNITS[group]}"
    return f"{scaled:,.1f} {PARAMETER_NUM_UNITS[group]}"
