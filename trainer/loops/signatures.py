"""What the loops check of the steps' signatures: ``dataloader_idx`` as Lightning passes it.

Said once before the first batch, naming the method and the fix, instead of a ``TypeError`` from the call.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from trainer.loops.dataloader_iter import takes_dataloader_iter

__all__ = ["DataloaderIdxError", "check_takes_dataloader_idx", "with_last_arg"]


def with_last_arg(fn: Callable[..., Any] | None, value: Any) -> Any:
    """``fn`` with ``value`` appended to its arguments (``dataloader_idx``); None stays None."""
    if fn is None:
        return None

    def call(*args: Any) -> Any:
        return fn(*args, value)

    return call


class DataloaderIdxError(RuntimeError, TypeError):
    """A step or batch hook whose ``dataloader_idx`` does not fit the number of loaders.

    A ``RuntimeError`` as Lightning's; also a ``TypeError``, the type this refusal had before.
    """


def check_takes_dataloader_idx(module: Any, prefix: str, several: bool) -> None:
    """Lightning's rule for ``dataloader_idx`` in ``<prefix>_step`` and the module's ``on_<prefix>_batch_start/end``.

    Several loaders: each must name ``dataloader_idx`` (or take ``*args``), as it is passed as the last
    argument. One loader: a ``dataloader_idx`` without a default would never be given. Both are said
    before the first batch instead of a ``TypeError`` from the call.

    Raises:
        DataloaderIdxError: naming the method and the fix (a ``RuntimeError``, as Lightning's).
    """
    loader = "val_dataloader" if prefix == "validation" else f"{prefix}_dataloader"
    for name in (f"{prefix}_step", f"on_{prefix}_batch_start", f"on_{prefix}_batch_end"):
        fn = getattr(module, name, None)
        if fn is None or (name.endswith("_step") and takes_dataloader_iter(fn)):  # it gets the iterator alone
            continue
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        named = params.get("dataloader_idx")
        if several and named is None and not any(p.kind is p.VAR_POSITIONAL for p in params.values()):
            args = "outputs, batch, batch_idx" if name.endswith("_end") else "batch, batch_idx"
            raise DataloaderIdxError(
                f"You provided multiple `{loader}`, but no `dataloader_idx` argument in "
                f"`{type(module).__name__}.{name}()`: it is called as {name}({args}, dataloader_idx) with several "
                "dataloaders (as in Lightning). Try adding `dataloader_idx=0` to its signature."
            )
        if not several and named is not None and named.default is inspect.Parameter.empty:
            raise DataloaderIdxError(
                f"You provided only a single `{loader}`, but have included `dataloader_idx` in "
                f"`{type(module).__name__}.{name}()`. Either remove the argument or give it a default value of 0."
            )
