"""Doing something on one process only: ``rank_zero_only`` and the ``rank_zero_info/warn/debug`` messages.

Lightning's ``lightning.pytorch.utilities.rank_zero`` names, used by Lightning programs to print or
write once per job instead of once per process. The rank is the process's global rank: the process
group's once one exists, else the launcher's (``RANK`` from torchrun or geartrain's workers,
``SLURM_PROCID`` under Slurm), else 0. It is looked up at each call, so a decorated function works
before and after a strategy sets the group up; assigning ``rank_zero_only.rank`` fixes it (Lightning
code and tests do that).

>>> @rank_zero_only
... def hello() -> str:
...     return "hello"
>>> hello()
'hello'
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, overload

import torch.distributed as dist

__all__ = [
    "launcher_rank",
    "rank_zero_debug",
    "rank_zero_deprecation",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
]

log = logging.getLogger("trainer")
# At INFO, as Lightning sets its ``lightning.pytorch`` logger: the info lines pass whatever the root's
# level (a handler the program configures shows them; none is added here). A level set before stays.
if log.level == logging.NOTSET:
    log.setLevel(logging.INFO)

T = TypeVar("T")


def _global_rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return launcher_rank()


def launcher_rank() -> int:
    """The global rank the launcher gave this process (``RANK``, else ``SLURM_PROCID``), else 0."""
    for name in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


class _RankZeroOnly:
    """Decorator: the function runs on global rank 0 only; elsewhere it returns ``default`` (None)."""

    def __init__(self) -> None:
        self._rank: int | None = None

    @property
    def rank(self) -> int:
        """This process's global rank (see the module's docstring); assignable."""
        return self._rank if self._rank is not None else _global_rank()

    @rank.setter
    def rank(self, value: int) -> None:
        self._rank = int(value)

    @overload
    def __call__(self, fn: Callable[..., T]) -> Callable[..., T | None]: ...
    @overload
    def __call__(self, fn: Callable[..., T], default: T) -> Callable[..., T]: ...
    def __call__(self, fn: Callable[..., Any], default: Any = None) -> Callable[..., Any]:
        @functools.wraps(fn)
        def on_rank_zero(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs) if self.rank == 0 else default

        return on_rank_zero


#: ``@rank_zero_only`` runs the function on global rank 0 only (``rank_zero_only(fn, default)`` for
#: another return value elsewhere).
rank_zero_only = _RankZeroOnly()


def rank_zero_info(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """``logging.info`` on the ``trainer`` logger, on rank 0 only."""
    if rank_zero_only.rank == 0:
        log.info(*args, stacklevel=stacklevel, **kwargs)


def rank_zero_debug(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """``logging.debug`` on the ``trainer`` logger, on rank 0 only."""
    if rank_zero_only.rank == 0:
        log.debug(*args, stacklevel=stacklevel, **kwargs)


def rank_zero_warn(message: str | Warning, stacklevel: int = 4, **kwargs: Any) -> None:
    """``warnings.warn`` on rank 0 only (``category=`` as ``warnings.warn`` takes it)."""
    if rank_zero_only.rank == 0:
        warnings.warn(message, stacklevel=stacklevel, **kwargs)


def rank_zero_deprecation(message: str | Warning, stacklevel: int = 5, **kwargs: Any) -> None:
    """A ``DeprecationWarning`` (unless ``category=`` says otherwise) on rank 0 only."""
    kwargs.setdefault("category", DeprecationWarning)
    rank_zero_warn(message, stacklevel=stacklevel, **kwargs)
