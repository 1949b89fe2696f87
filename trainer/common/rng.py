"""Random number generator state: capture and restore every generator a training process draws from.

Exact resume and process launch both need "where this process's randomness stands" as plain data:
a checkpoint stores it for every rank, and the launcher hands the caller's state to the processes it
starts. DataLoader worker processes get generators of their own, seeded by :class:`WorkerInit`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["WorkerInit", "isolate_rng", "rng_state", "seed_worker", "set_rng_state"]


def rng_state() -> dict[str, Any]:
    """This process's Python, NumPy, torch CPU and CUDA generator states, as plain data."""
    import numpy as np

    version, mt, gauss = random.getstate()
    np_state: Any = np.random.get_state()
    state: dict[str, Any] = {
        # One int64 tensor, not 625 Python ints: pickling them one by one dominated small checkpoints.
        # Made through NumPy, whose loop over the ints is several times cheaper than torch.tensor's.
        "python": [version, torch.from_numpy(np.fromiter(mt, dtype=np.int64, count=len(mt))), gauss],
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


@contextmanager
def isolate_rng(include_cuda: bool = True) -> Iterator[None]:
    """Draw random numbers inside the block and leave every generator as it was before it.

    Lightning's ``lightning.pytorch.utilities.seed.isolate_rng``: Python's, NumPy's and torch's
    generators (CUDA's too unless ``include_cuda=False``) are put back on leaving, also after an exception.

    >>> with isolate_rng():
    ...     _ = torch.rand(1)
    """
    state = rng_state()
    cuda = state.pop("cuda", [])  # one state per visible CUDA device: none without CUDA
    try:
        yield
    finally:
        set_rng_state(state)
        if include_cuda:  # as Lightning, also without CUDA (setting no device's state does nothing)
            torch.cuda.set_rng_state_all(cuda)


def seed_worker(worker_id: int, rank: int) -> None:
    """Seed Python's, NumPy's and torch's generators in a DataLoader worker from (base seed, worker, rank).

    The base seed is the one the ``DataLoader`` drew for this epoch's workers from the main process's
    torch generator (PyTorch gives worker ``i`` the torch seed ``base + i``), so it follows
    ``seed_everything`` and changes every epoch. PyTorch's own worker seeds ignore the rank: every
    rank of a DDP job, seeded alike, would draw the same augmentations in its workers. Mixing in
    the global ``rank`` separates them, and the run stays reproducible. Lightning's
    ``seed_everything(workers=True)`` does the same.
    """
    import numpy as np

    base = torch.initial_seed() - worker_id
    sequence = np.random.SeedSequence([base, worker_id, rank])
    torch_seed, python_seed = (int(s) for s in sequence.generate_state(2, dtype=np.uint64))
    torch.manual_seed(torch_seed)
    random.seed(python_seed)
    np.random.seed(sequence.generate_state(4))


class WorkerInit:
    """A DataLoader ``worker_init_fn``: :func:`seed_worker` for ``rank``, then the loader's own one.

    A class rather than a closure, so loaders whose workers are spawned can pickle it.

    Args:
        rank: the global rank of the process whose loader this is.
        then: the ``worker_init_fn`` the loader had (called after the seeding, so it can still
            reseed or set up the worker as it did before), or None.
    """

    def __init__(self, rank: int, then: Callable[[int], None] | None = None) -> None:
        self.rank = rank
        self.then = then

    def __call__(self, worker_id: int) -> None:
        seed_worker(worker_id, self.rank)
        if self.then is not None:
            self.then(worker_id)
