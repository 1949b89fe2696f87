"""Random number generator state: capture and restore every generator a training process draws from.

Exact resume and process launch both need "where this process's randomness stands" as plain data:
a checkpoint stores it for every rank, and the launcher hands the caller's state to the processes it
starts.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["rng_state", "set_rng_state"]


def rng_state() -> dict[str, Any]:
    """This process's Python, NumPy, torch CPU and CUDA generator states, as plain data."""
    import numpy as np

    version, mt, gauss = random.getstate()
    np_state: Any = np.random.get_state()
    state: dict[str, Any] = {
        # One int64 tensor, not 625 Python ints: pickling them one by one dominated small checkpoints.
        "python": [version, torch.tensor(mt, dtype=torch.int64), gauss],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    import numpy as np

    version, mt, gauss = state["python"]
    if isinstance(mt, torch.Tensor):  # (older checkpoints hold a list of ints)
        mt = mt.tolist()
    random.setstate((version, tuple(mt), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
