"""The results table ``validate``/``test`` print with ``verbose=True``: metric by dataloader, as Lightning.

One row per metric (sorted by name; the ``/dataloader_idx_N`` suffix is dropped, the column tells the
loader), one column per dataloader, centred in columns as wide as the longest name (at least 25
characters, at most half the terminal), between rules the terminal's width.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence

__all__ = ["results_table"]


def results_table(stage: str, results: Sequence[Mapping[str, float]]) -> str:
    """The table of ``results`` (one dict per dataloader) for ``stage`` (``"validate"`` or ``"test"``).

    Returns "" when nothing was logged.

    >>> print(results_table("test", [{"acc": 0.5}]).replace("─", "-")[:4])
    ----
    """
    columns = [{key.split("/dataloader_idx_")[0]: value for key, value in result.items()} for result in results]
    names = sorted({name for column in columns for name in column})
    if not names:
        return ""
    headers = [f"{stage.capitalize()} metric"] + [f"DataLoader {i}" for i in range(len(columns))]
    width_total = shutil.get_terminal_size(fallback=(120, 30)).columns or 120
    width = int(min(max(max(len(n) for n in names), max(len(h) for h in headers), 25), width_total / 2))
    row = f"{{:^{width}}}" * len(headers)
    rule = "─" * width_total
    lines = [rule, row.format(*headers).rstrip(), rule]
    for name in names:
        cells = [f"{column[name]}" if name in column else " " for column in columns]
        lines.append(row.format(name[:width], *cells).rstrip())
    lines.append(rule)
    return "\n".join(lines)
