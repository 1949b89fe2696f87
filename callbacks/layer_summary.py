"""A module's summary as data: per-layer types, shapes, parameter counts, modes and FLOPs.

Lightning's ``lightning.pytorch.utilities.model_summary`` (``ModelSummary``, ``LayerSummary``,
``summarize``, ``get_human_readable_count``...) under geartrain's names: :class:`Summary` is what
Lightning calls ``utilities.model_summary.ModelSummary`` (the callback of that name lives in
``callbacks/model_summary.py`` and prints this summary's table at fit start).

>>> print(Summary(nn.Sequential(nn.Linear(2, 3), nn.ReLU())))  # doctest: +NORMALIZE_WHITESPACE
  | Name | Type   | Params | Mode  | FLOPs
------------------------------------------------
0 | 0    | Linear | 9      | train | 0
1 | 1    | ReLU   | 0      | train | 0
------------------------------------------------
9         Trainable params
0         Non-trainable params
9         Total params
0.000     Total estimated model params size (MB)
2         Modules in train mode
0         Modules in eval mode
0         Total Flops
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from torch.utils.hooks import RemovableHandle

from callbacks.summary_table import (
    PARAMETER_NUM_UNITS,
    format_summary_table,
    get_formatted_model_size,
    get_human_readable_count,
)

__all__ = [
    "LEFTOVER_PARAMS_NAME",
    "NOT_APPLICABLE",
    "PARAMETER_NUM_UNITS",
    "UNKNOWN_SIZE",
    "LayerSummary",
    "Summary",
    "format_summary_table",
    "get_formatted_model_size",
    "get_human_readable_count",
    "parse_batch_shape",
    "summarize",
]

#: A shape the example input did not reveal (layer not called, or an input without a shape).
UNKNOWN_SIZE = "?"
#: The row that counts parameters owned by no submodule (``self.scale = nn.Parameter(...)``).
LEFTOVER_PARAMS_NAME = "other params"
#: What that row shows in the columns that mean nothing for it.
NOT_APPLICABLE = "n/a"

#: Bits per parameter by the trainer's precision; the model size of any other precision is estimated at 32.
_PRECISION_BITS = {
    "64": 64,
    "32": 32,
    "16": 16,
    "bf16": 16,
    "16-true": 16,
    "bf16-true": 16,
    "32-true": 32,
    "64-true": 64,
}


#: A module's batch-transfer hooks, in the order a batch goes through them (``dataloader_idx`` 0).
_TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


def _is_dtensor(p: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch built without distributed
        return False
    return isinstance(p, DTensor)


def _unknown_shape(p: torch.Tensor) -> bool:
    """A lazy layer's parameter before its first forward: its size is not known yet (a DTensor's is)."""
    return isinstance(p, nn.parameter.UninitializedParameter) and not _is_dtensor(p)


def parse_batch_shape(batch: Any) -> str | list[Any]:
    """The shape of ``batch`` as a list; nested lists for lists and tuples; ``"?"`` for anything else."""
    if hasattr(batch, "shape"):
        return list(batch.shape)
    if isinstance(batch, (list, tuple)):
        return [parse_batch_shape(item) for item in batch]
    return UNKNOWN_SIZE


class LayerSummary:
    """One submodule's row: its type, parameter count, mode, and the sizes of its first call.

    A forward hook records the input and output sizes of the first call and removes itself (a layer
    called twice shows its first call); a ``torch.jit.ScriptModule`` takes no hooks, so its sizes
    stay ``"?"``.

    >>> layer = nn.Conv2d(3, 8, 3)
    >>> row = LayerSummary(layer)
    >>> _ = layer(torch.rand(1, 3, 5, 5))
    >>> row.layer_type, row.num_parameters, row.in_size, row.out_size
    ('Conv2d', 224, [1, 3, 5, 5], [1, 8, 3, 3])
    """

    def __init__(self, module: nn.Module) -> None:
        self._module = module
        self._in_size: str | list[Any] | None = None
        self._out_size: str | list[Any] | None = None
        self._hook_handle: RemovableHandle | None = None
        if not isinstance(module, torch.jit.ScriptModule):
            self._hook_handle = module.register_forward_hook(self._record, with_kwargs=True)

    def _record(self, _: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        inputs = (*args, *kwargs.values()) if kwargs else args
        self._in_size = parse_batch_shape(inputs[0] if len(inputs) == 1 else inputs)
        self._out_size = parse_batch_shape(output)
        self.detach_hook()

    def __del__(self) -> None:
        self.detach_hook()

    def detach_hook(self) -> None:
        """Remove the size-recording hook (if the forward pass has not removed it already)."""
        if self._hook_handle is not None:
            self._hook_handle.remove()

    @property
    def in_size(self) -> str | list[Any]:
        """The input size(s) of the first call, ``"?"`` when unknown or empty."""
        return self._in_size if self._in_size else UNKNOWN_SIZE

    @property
    def out_size(self) -> str | list[Any]:
        """The output size(s) of the first call, ``"?"`` when unknown or empty."""
        return self._out_size if self._out_size else UNKNOWN_SIZE

    @property
    def layer_type(self) -> str:
        """The module's class name."""
        return type(self._module).__name__

    @property
    def num_parameters(self) -> int:
        """Parameters of the module and its children (a lazy layer's uninitialised ones count 0)."""
        return sum(0 if _unknown_shape(p) else p.numel() for p in self._module.parameters())

    @property
    def training(self) -> bool:
        """Whether the module is in training mode."""
        return self._module.training


class Summary:
    """The summary of ``model``'s layers down to ``max_depth`` (Lightning's ``utilities.model_summary.ModelSummary``).

    Args:
        model: the module to summarise (a ``TrainModule`` or any ``nn.Module``).
        max_depth: levels of submodules listed: 1 the direct children, -1 every level, 0 none.

    When the model has an ``example_input_array``, it is passed through the model once (eval mode,
    no gradients, the trainer's precision context, module modes restored afterwards) to fill the
    "In sizes"/"Out sizes" columns and count FLOPs. ``print(summary)`` prints the table.
    """

    def __init__(self, model: nn.Module, max_depth: int = 1) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < -1:
            raise ValueError(f"`max_depth` can be -1, 0 or > 0, got {max_depth}.")
        self._model = model
        self._max_depth = max_depth
        self._warned_lazy = False
        self._flop_counter = FlopCounterMode(display=False, depth=max_depth + 1)
        self._layer_summary = self.summarize()
        trainer = getattr(model, "_trainer", None)
        bits = 32
        if trainer is not None:
            precision = str(trainer.precision)
            if precision not in _PRECISION_BITS:
                warnings.warn(
                    f"Precision {precision} is not supported by the model summary. "
                    " Estimated model size in MB will not be accurate. Using 32 bits instead.",
                    UserWarning,
                    stacklevel=2,
                )
            bits = _PRECISION_BITS.get(precision, 32)
        self._precision_megabytes = bits / 8.0 * 1e-6

    @property
    def named_modules(self) -> list[tuple[str, nn.Module]]:
        """The ``(name, module)`` pairs summarised before the depth cut (the root excluded)."""
        if self._max_depth == 0:
            return []
        if self._max_depth == 1:
            return list(self._model.named_children())
        return list(self._model.named_modules())[1:]

    def summarize(self) -> dict[str, LayerSummary]:
        """Build the rows: hook every listed layer, run the example input, unhook, cut below ``max_depth``."""
        rows = {name: LayerSummary(module) for name, module in self.named_modules}
        try:
            if getattr(self._model, "example_input_array", None) is not None:
                self._forward_example_input()
        finally:
            for row in rows.values():
                row.detach_hook()
        if self._max_depth >= 1:
            rows = {name: row for name, row in rows.items() if name.count(".") < self._max_depth}
        return rows

    def _forward_example_input(self) -> None:
        model = self._model
        trainer = getattr(model, "_trainer", None)
        example = model.example_input_array
        device = next((p.device for p in model.parameters() if not _unknown_shape(p)), torch.device("cpu"))
        hooks: list[Any] = [getattr(model, name, None) for name in _TRANSFER_HOOKS]
        if all(callable(hook) for hook in hooks):  # a TrainModule: its own batch-transfer hooks, as a batch
            before, transfer, after = hooks
            example = after(transfer(before(example, 0), device, 0), 0)
        else:
            from trainer.common.tree import move_to_device

            example = move_to_device(example, device)
        if trainer is not None:  # a true-half-precision model gets its input in its dtype, as its batches do
            example = trainer.precision_plugin.convert_input(example)
        modes = {module: module.training for module in model.modules()}
        model.eval()
        forward_context = (
            trainer.precision_plugin.forward_context() if trainer is not None else contextlib.nullcontext()
        )
        try:
            with torch.no_grad(), forward_context, self._flop_counter:
                if isinstance(example, (list, tuple)):
                    model(*example)
                elif isinstance(example, dict):
                    model(**example)
                else:
                    model(example)
        finally:
            for module, training in modes.items():
                module.training = training

    # ----------------------------------------------------------------- per layer
    @property
    def layer_names(self) -> list[str]:
        """The listed layers' qualified names."""
        return list(self._layer_summary)

    @property
    def layer_types(self) -> list[str]:
        """The listed layers' class names."""
        return [row.layer_type for row in self._layer_summary.values()]

    @property
    def in_sizes(self) -> list[Any]:
        """The listed layers' input sizes (``"?"`` where unknown)."""
        return [row.in_size for row in self._layer_summary.values()]

    @property
    def out_sizes(self) -> list[Any]:
        """The listed layers' output sizes (``"?"`` where unknown)."""
        return [row.out_size for row in self._layer_summary.values()]

    @property
    def param_nums(self) -> list[int]:
        """The listed layers' parameter counts (children included)."""
        return [row.num_parameters for row in self._layer_summary.values()]

    @property
    def training_modes(self) -> list[bool]:
        """Whether each listed layer is in training mode."""
        return [row.training for row in self._layer_summary.values()]

    @property
    def flop_counts(self) -> dict[str, dict[Any, int]]:
        """FLOPs of the example input's forward pass per listed layer, by operator (empty without an input)."""
        counts = self._flop_counter.get_flop_counts()
        root = type(self._model).__name__
        return {name: dict(counts.get(f"{root}.{name}", {})) for name in self.layer_names}

    # ----------------------------------------------------------------- totals
    def _count(self, parameters: Iterable[torch.Tensor]) -> int:
        total = 0
        for p in parameters:
            if _unknown_shape(p):
                if not self._warned_lazy:
                    self._warned_lazy = True
                    warnings.warn(
                        "The total number of parameters detected may be inaccurate because the model contains"
                        " an instance of `UninitializedParameter`. To get an accurate number, set"
                        " `self.example_input_array` in your LightningModule.",
                        UserWarning,
                        stacklevel=3,
                    )
                continue
            total += p.numel()
        return total

    @property
    def total_training_modes(self) -> dict[str, int]:
        """How many submodules (the root excluded, every level) are in train and in eval mode."""
        modes = [module.training for module in self._model.modules()][1:]
        return {"train": modes.count(True), "eval": modes.count(False)}

    @property
    def total_parameters(self) -> int:
        """All parameters of the model."""
        return self._count(self._model.parameters())

    @property
    def trainable_parameters(self) -> int:
        """Parameters that require gradients."""
        return self._count(p for p in self._model.parameters() if p.requires_grad)

    @property
    def total_layer_params(self) -> int:
        """Parameters of the listed layers (those owned by no listed layer are the "other params" row)."""
        return sum(self.param_nums)

    @property
    def model_size(self) -> float:
        """Estimated parameter size in megabytes (10**6 bytes) at the trainer's precision (32 bits without one)."""
        return self.total_parameters * self._precision_megabytes

    @property
    def total_flops(self) -> int:
        """FLOPs of one forward pass of the example input (0 without one)."""
        return int(self._flop_counter.get_total_flops())

    # ----------------------------------------------------------------- the table
    def _get_summary_data(self) -> list[tuple[str, list[str]]]:
        """The table's columns as ``(header, cells)``, every cell a string (Lightning's ``_get_summary_data``)."""
        columns: list[tuple[str, list[str]]] = [
            (" ", [str(i) for i in range(len(self._layer_summary))]),
            ("Name", self.layer_names),
            ("Type", self.layer_types),
            ("Params", [get_human_readable_count(n) for n in self.param_nums]),
            ("Mode", ["train" if mode else "eval" for mode in self.training_modes]),
            ("FLOPs", [get_human_readable_count(sum(c.values())) for c in self.flop_counts.values()]),
        ]
        if getattr(self._model, "example_input_array", None) is not None:
            columns.append(("In sizes", [str(size) for size in self.in_sizes]))
            columns.append(("Out sizes", [str(size) for size in self.out_sizes]))
        leftover = self.total_parameters - self.total_layer_params
        if leftover > 0:
            extra = {" ": " ", "Name": LEFTOVER_PARAMS_NAME, "Params": get_human_readable_count(leftover)}
            for header, cells in columns:
                cells.append(extra.get(header, NOT_APPLICABLE))
        return columns

    def __str__(self) -> str:
        return format_summary_table(
            self.total_parameters,
            self.trainable_parameters,
            self.model_size,
            self.total_training_modes,
            self.total_flops,
            *self._get_summary_data(),
        )

    __repr__ = __str__


def summarize(lightning_module: nn.Module, max_depth: int = 1) -> Summary:
    """The :class:`Summary` of ``lightning_module`` down to ``max_depth`` levels (0: totals only)."""
    return Summary(lightning_module, max_depth=max_depth)
