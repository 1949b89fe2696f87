"""``ModelSummary``: a table of the module's layers and parameter counts at fit start.

The summary itself (:class:`~callbacks.layer_summary.Summary`, Lightning's
``utilities.model_summary.ModelSummary``) is data; these callbacks print it: :class:`ModelSummary` as a
plain table, :class:`RichModelSummary` as a rich table.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING, Any, TextIO

from typing_extensions import override

from callbacks.base import Callback
from callbacks.layer_summary import (
    Summary,
    format_summary_table,
    get_formatted_model_size,
    get_human_readable_count,
    summarize,
)

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["ModelSummary", "RichModelSummary", "Summary", "summarize"]

#: Whether ``rich`` is installed; :class:`RichModelSummary` is refused without it (Lightning's flag and
#: words; its module ``lightning.pytorch.callbacks.rich_model_summary`` reads the same flag).
_RICH_AVAILABLE = importlib.util.find_spec("rich") is not None

#: ``summarize_kwargs`` the built-in ``summarize`` methods read (a subclass's own ``summarize`` gets any).
STYLING_KWARGS = frozenset({"header_style"})


class ModelSummary(Callback):
    """Print a table of the module's layers and parameter counts when fitting starts (rank 0 only).

    Args:
        max_depth: how deep to list submodules (1: direct children only; -1: every level; 0: no
            summary, as Lightning).
        stream: where to print (default: standard output at the time of printing).
        **summarize_kwargs: passed to :meth:`summarize`. The built-in tables read ``header_style``
            (rich's header style; the plain table has none); a subclass that overrides
            :meth:`summarize` receives every keyword, otherwise an unknown one is refused.
    """

    def __init__(self, max_depth: int = 1, stream: TextIO | None = None, **summarize_kwargs: Any) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < -1:
            raise ValueError(f"`max_depth` can be -1, 0 or > 0, got {max_depth}")
        own = type(self).summarize in (ModelSummary.summarize, RichModelSummary.summarize)
        unknown = sorted(set(summarize_kwargs) - STYLING_KWARGS) if own else []
        if unknown:
            raise TypeError(
                f"{type(self).__name__}: unknown option(s) {', '.join(unknown)}; the options are max_depth, "
                f"stream and the styling option(s) {', '.join(sorted(STYLING_KWARGS))}"
            )
        self._max_depth = max_depth
        self._summarize_kwargs = summarize_kwargs
        self.stream = stream

    @property
    def max_depth(self) -> int:
        """Levels of submodules listed (Lightning keeps it as ``_max_depth``)."""
        return self._max_depth

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not self._max_depth:
            return
        summary = summarize(pl_module, max_depth=self._max_depth)
        data = summary._get_summary_data()
        if trainer.is_global_zero:
            kwargs = dict(self._summarize_kwargs)
            if self.stream is not None:
                kwargs["stream"] = self.stream
            self.summarize(
                data,
                summary.total_parameters,
                summary.trainable_parameters,
                summary.model_size,
                summary.total_training_modes,
                total_flops=summary.total_flops,
                **kwargs,
            )

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        """Print the table (Lightning's signature: a subclass overrides this to show the summary its way)."""
        table = format_summary_table(
            total_parameters, trainable_parameters, model_size, total_training_modes, total_flops, *summary_data
        )
        print(table, file=summarize_kwargs.get("stream") or sys.stdout, flush=True)


class RichModelSummary(ModelSummary):
    """:class:`ModelSummary` drawn as a rich table (``header_style``: the header's rich style).

    Raises:
        ModuleNotFoundError: ``rich`` is not installed (when built, as Lightning's).
    """

    def __init__(self, max_depth: int = 1, stream: TextIO | None = None, **summarize_kwargs: Any) -> None:
        if not _RICH_AVAILABLE:
            raise ModuleNotFoundError(
                "`RichModelSummary` requires `rich` to be installed. Install it by running `pip install -U rich`."
            )
        super().__init__(max_depth, stream, **summarize_kwargs)

    @staticmethod
    @override
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        """Print the rows as a rich table, then the totals as a grid."""
        import rich
        from rich.console import Console
        from rich.table import Table

        stream = summarize_kwargs.get("stream")
        console = Console(file=stream) if stream is not None else rich.get_console()
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        right = {"Params", "Params per Device", "FLOPs", "In sizes", "Out sizes"}
        for header, _ in summary_data:
            table.add_column(
                header,
                justify="right" if header in right else "left",
                style="dim" if header == " " else ("white" if header in ("In sizes", "Out sizes") else None),
                no_wrap=header == "Name",
            )
        for row in zip(*(cells for _, cells in summary_data)):
            table.add_row(*row)
        console.print(table)
        grid = Table.grid(expand=True)
        grid.add_column()
        for label, value in (
            ("Trainable params", get_human_readable_count(trainable_parameters)),
            ("Non-trainable params", get_human_readable_count(total_parameters - trainable_parameters)),
            ("Total params", get_human_readable_count(total_parameters)),
            ("Total estimated model params size (MB)", get_formatted_model_size(model_size)),
            ("Modules in train mode", total_training_modes["train"]),
            ("Modules in eval mode", total_training_modes["eval"]),
            ("Total FLOPs", get_human_readable_count(total_flops)),
        ):
            grid.add_row(f"[bold]{label}[/]: {value!s:<10}")
        console.print(grid)
