"""Exporting a module: ``to_torchscript``, ``to_onnx`` (thin wrappers over torch.jit and torch.onnx)."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

__all__ = ["ExportMixin"]


class ExportMixin(nn.Module):
    """Lightning's export methods for :class:`~trainer.module.TrainModule` (an ``nn.Module``)."""

    example_input_array: Any = None

    def to_torchscript(
        self,
        file_path: str | os.PathLike[str] | None = None,
        method: str | None = "script",
        example_inputs: Any | None = None,
        **kwargs: Any,
    ) -> torch.jit.ScriptModule:
        """Script (``method="script"``) or trace (``"trace"``, with ``example_inputs`` or
        :attr:`example_input_array`) the module in eval mode; saved to ``file_path`` if given."""
        mode = self.training
        self.eval()
        self.__dict__["_jit_is_scripting"] = True
        try:
            if method == "script":
                exported = torch.jit.script(self, **kwargs)
            elif method == "trace":
                inputs = example_inputs if example_inputs is not None else self.example_input_array
                if inputs is None:
                    raise ValueError("to_torchscript(method='trace') needs example_inputs or self.example_input_array")
                exported = torch.jit.trace(self, inputs, **kwargs)
            else:
                raise ValueError(f"to_torchscript: method must be 'script' or 'trace', got {method!r}")
        finally:
            self.__dict__.pop("_jit_is_scripting", None)
            self.train(mode)
        if file_path is not None:
            torch.jit.save(exported, str(file_path))
        return exported

    def to_onnx(
        self, file_path: str | os.PathLike[str] | None = None, input_sample: Any | None = None, **kwargs: Any
    ) -> Any:
        """Export to ONNX with ``torch.onnx.export`` (input: ``input_sample`` or :attr:`example_input_array`)."""
        inputs = input_sample if input_sample is not None else self.example_input_array
        if inputs is None:
            raise ValueError("to_onnx needs input_sample or self.example_input_array")
        mode = self.training
        self.eval()
        self.__dict__["_jit_is_scripting"] = True
        try:
            args = inputs if isinstance(inputs, tuple) else (inputs,)
            return torch.onnx.export(self, args, None if file_path is None else str(file_path), **kwargs)
        finally:
            self.__dict__.pop("_jit_is_scripting", None)
            self.train(mode)

    def to_tensorrt(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: geartrain has no TensorRT export (use :meth:`to_onnx` and TensorRT's ONNX parser)."""
        raise NotImplementedError(
            "to_tensorrt is not supported by geartrain; export with to_onnx() and build the engine with TensorRT"
        )
