"""Exporting a module: ``to_torchscript``, ``to_onnx`` (thin wrappers over torch.jit and torch.onnx)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

import torch
from torch import nn

from trainer.common.errors import LightningDeprecationWarning
from trainer.common.rank_zero import rank_zero_deprecation

__all__ = ["ExportMixin"]


@contextmanager
def _jit_is_scripting(module: nn.Module) -> Iterator[None]:
    """``TrainModule._jit_is_scripting`` set while torch.jit walks ``module``, on the class as Lightning does:
    every ``TrainModule`` in the tree, children included, then answers ``trainer`` with None."""
    from trainer.module import TrainModule

    TrainModule._jit_is_scripting = True
    try:
        yield
    finally:
        TrainModule._jit_is_scripting = False


class ExportMixin(nn.Module):
    """Lightning's export methods for :class:`~trainer.module.TrainModule` (an ``nn.Module``)."""

    if TYPE_CHECKING:  # TrainModule's property; not a class annotation, which torch.jit would read as a type
        example_input_array: Any
        _jit_is_scripting: bool

    def to_torchscript(
        self,
        file_path: str | os.PathLike[str] | None = None,
        method: str | None = "script",
        example_inputs: Any | None = None,
        **kwargs: Any,
    ) -> torch.jit.ScriptModule:
        """Script (``method="script"``) or trace (``"trace"``, with ``example_inputs`` or
        :attr:`example_input_array`) the module in eval mode; saved to ``file_path`` if given.

        Deprecated as in Lightning (TorchScript is deprecated in PyTorch; ``torch.export.export`` is
        the successor). A traced input goes through the module's batch-transfer hooks to its device,
        as a batch would; the module's training mode is restored afterwards.
        """
        rank_zero_deprecation(
            "`LightningModule.to_torchscript` has been deprecated in v2.7 and will be removed in v2.8. "
            "TorchScript is deprecated in PyTorch. Use `torch.export.export()` for model exporting instead.",
            category=LightningDeprecationWarning,
        )
        mode = self.training
        if method == "script":
            with _jit_is_scripting(self):
                exported = torch.jit.script(self.eval(), **kwargs)
        elif method == "trace":
            if example_inputs is None:
                if self.example_input_array is None:
                    raise ValueError(
                        "Choosing method=`trace` requires either `example_inputs` or `model.example_input_array` "
                        "to be defined."
                    )
                example_inputs = self.example_input_array
            if kwargs.get("check_inputs") is not None:
                kwargs["check_inputs"] = self._to_own_device(kwargs["check_inputs"])
            example_inputs = self._to_own_device(example_inputs)
            with _jit_is_scripting(self):
                exported = torch.jit.trace(self.eval(), example_inputs, **kwargs)
        else:
            raise ValueError(f"The 'method' parameter only supports 'script' or 'trace', but value given was: {method}")
        self.train(mode)
        if file_path is not None:
            path = os.fspath(file_path)
            if os.path.dirname(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
            torch.jit.save(exported, path)
        return exported

    def _to_own_device(self, batch: Any) -> Any:
        """``batch`` through the batch-transfer hooks to the module's device (dataloader index 0)."""
        hooks: Any = self
        device = next(iter(self.parameters()), torch.empty(0)).device
        batch = hooks.on_before_batch_transfer(batch, 0)
        batch = hooks.transfer_batch_to_device(batch, device, 0)
        return hooks.on_after_batch_transfer(batch, 0)

    def to_onnx(
        self,
        file_path: str | os.PathLike[str] | IO[bytes] | None = None,
        input_sample: Any | None = None,
        **kwargs: Any,
    ) -> Any:
        """Export to ONNX with ``torch.onnx.export`` (input: ``input_sample`` or :attr:`example_input_array`).

        As Lightning's: the input goes through the module's batch-transfer hooks to its device, and
        ``file_path`` may be a path or a binary stream (``io.BytesIO``) the model is written into.
        """
        inputs = input_sample if input_sample is not None else self.example_input_array
        if inputs is None:
            raise ValueError(
                "Could not export to ONNX since neither `input_sample` nor `model.example_input_array` attribute is set."
            )
        inputs = self._to_own_device(inputs)
        target = os.fspath(file_path) if isinstance(file_path, os.PathLike) else file_path
        mode = self.training
        self.eval()
        try:
            args = inputs if isinstance(inputs, tuple) else (inputs,)
            with _jit_is_scripting(self):
                return torch.onnx.export(self, args, target, **kwargs)  # type: ignore[arg-type]  # a BytesIO works too
        finally:
            self.train(mode)

    def to_tensorrt(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: geartrain has no TensorRT export (use :meth:`to_onnx` and TensorRT's ONNX parser)."""
        raise NotImplementedError(
            "to_tensorrt is not supported by geartrain; export with to_onnx() and build the engine with TensorRT"
        )
