"""``RunIf``: Lightning's test-skipping marker, as geartrain's harness decides it (replaces helpers/runif.py).

Lightning's own version reads Lightning's internals to decide; this one decides from the machine:
tests that need a GPU, a TPU, MPS, DeepSpeed, TensorRT or Lightning's standalone launcher are
skipped; tests that need an optional package run when it is installed.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import pytest
import torch
from packaging.version import Version

_PACKAGES = {"rich": "rich", "omegaconf": "omegaconf", "psutil": "psutil", "sklearn": "sklearn", "onnx": "onnx"}
_PACKAGES["onnxscript"] = "onnxscript"


def _runif_reasons(**kwargs: Any) -> list[str]:
    reasons: list[str] = []
    torch_version = Version(torch.__version__.split("+")[0])
    for key, value in kwargs.items():
        if key == "min_cuda_gpus" and value and torch.cuda.device_count() < value:
            reasons.append(f"{value} CUDA GPUs")
        elif key == "min_torch" and value and torch_version < Version(value):
            reasons.append(f"torch>={value}")
        elif key == "max_torch" and value and torch_version >= Version(value):
            reasons.append(f"torch<{value}")
        elif key == "min_python" and value and sys.version_info < tuple(int(x) for x in value.split(".")):
            reasons.append(f"python>={value}")
        elif key in ("bf16_cuda", "tpu", "deepspeed", "tensorrt") and value:
            reasons.append(key)
        elif key == "mps" and value is True:
            reasons.append("MPS")
        elif key == "standalone" and value:
            reasons.append("standalone (Lightning's own launcher, one process per test)")
        elif key in _PACKAGES and value and importlib.util.find_spec(_PACKAGES[key]) is None:
            reasons.append(key)
        elif key in ("skip_windows", "linux_only", "dynamo", "mps") or key in _PACKAGES:
            continue
        elif value:
            reasons.append(f"unknown requirement {key}={value!r}")
    return reasons


def RunIf(**kwargs: Any) -> pytest.MarkDecorator:
    """Skip the test unless this machine meets every requirement named in ``kwargs``."""
    reasons = _runif_reasons(**kwargs)
    return pytest.mark.skipif(len(reasons) > 0, reason=f"Requires: [{' + '.join(reasons)}]")


#: Lightning marks gloo tests that fail on Windows with this; the harness runs on Linux only.
_xfail_gloo_windows = pytest.mark.skipif(False, reason="Windows only")
