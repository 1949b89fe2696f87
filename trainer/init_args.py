"""Which ``__init__`` arguments ``save_hyperparameters()`` records: Lightning's walk up the call stack.

:func:`init_arguments` is what :class:`~trainer.hparams.HyperparametersMixin` uses;
:func:`collect_init_args` is Lightning's public ``utilities.parsing.collect_init_args``.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from typing import Any

__all__ = ["collect_init_args", "init_arguments"]


def init_arguments(obj: object, frame: types.FrameType | None, kind: type) -> dict[str, Any]:
    """The arguments of the ``__init__`` calls on the stack from ``frame`` outwards (outermost wins).

    Lightning's walk: frames that are not such a call are passed over until the first one is found
    (``save_hyperparameters()`` in a helper ``__init__`` calls); from there each ``__init__`` of ``obj``,
    or of another ``kind`` object (one with hyperparameters) whose ``__init__`` calls ``super()`` (a module built inside
    another's ``__init__``: Lightning collects the outer one's arguments too), adds its arguments; the
    first other frame ends the walk. ``**kwargs`` are spread, ``*args`` dropped. A dataclass's are its
    ``init`` fields (``save_hyperparameters()`` called from ``__post_init__``).
    """
    if dataclasses.is_dataclass(obj):  # save_hyperparameters() in __post_init__: the fields __init__ takes
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}
    found: list[dict[str, Any]] = []
    while frame is not None and frame.f_back is not None:
        owner, args = _frame_init_args(frame)
        if owner is obj or ("__class__" in frame.f_locals and isinstance(owner, kind)):
            found.append(args)
        elif found:
            break
        frame = frame.f_back
    merged: dict[str, Any] = {}
    for args in found:
        merged.update(args)
    return merged


def collect_init_args(
    frame: types.FrameType,
    path_args: list[dict[str, Any]],
    inside: bool = False,
    classes: tuple[type, ...] = (),
) -> list[dict[str, Any]]:
    """Lightning's ``utilities.parsing.collect_init_args``: the ``__init__`` arguments on the stack, innermost first.

    From ``frame`` outwards: each ``__init__`` frame that calls ``super()`` (whose object is an instance
    of ``classes``, when given) appends its arguments to ``path_args``; frames before the first such one
    are passed over (all of them when ``inside``), the first other frame after one ends the walk.
    """
    current: types.FrameType | None = frame
    while current is not None and current.f_back is not None:
        owner, args = _frame_init_args(current)
        if owner is not None and "__class__" in current.f_locals and (not classes or isinstance(owner, classes)):
            path_args.append(args)
            inside = True
        elif inside:
            break
        current = current.f_back
    return path_args


def _frame_init_args(frame: types.FrameType) -> tuple[Any, dict[str, Any]]:
    """``(self, its arguments)`` of an ``__init__`` frame (``**kwargs`` spread in, ``*args`` out), else ``(None, {})``."""
    code, local = frame.f_code, frame.f_locals
    if code.co_name != "__init__" or not code.co_argcount:
        return None, {}
    names = list(code.co_varnames[1 : code.co_argcount + code.co_kwonlyargcount])  # after self (any name)
    args = {n: local[n] for n in names if n in local}
    index = code.co_argcount + code.co_kwonlyargcount
    if code.co_flags & inspect.CO_VARARGS:
        index += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        args.update(local.get(code.co_varnames[index], {}))
    return local.get(code.co_varnames[0]), args
