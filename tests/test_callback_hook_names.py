"""Every public callback overrides its hooks with ``Callback``'s parameter names (Lightning 2.6's).

Lightning code calls hooks by keyword (``cb.setup(trainer, pl_module=model, stage="fit")``,
``cb.on_train_batch_end(trainer=t, pl_module=m, outputs=o, batch=b, batch_idx=i)``); an override
renaming a parameter (``module`` for ``pl_module``, ``*_`` for the rest) breaks such a call with
"unexpected keyword argument". A pure signature walk: nothing is built or run.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

import pytest

import callbacks
from callbacks.base import HOOKS, Callback

#: Names ``callbacks`` exports that are not classes.
NOT_CLASSES = {"join_predictions"}
#: Callbacks users can reach outside ``callbacks``: (module, name).
OTHER_PUBLIC = [("trainer.lightning.cli", "SaveConfigCallback")]
PUBLIC = [("callbacks", name) for name in sorted(set(callbacks.__all__) - NOT_CLASSES)] + OTHER_PUBLIC


def _shape(function: Callable[..., object]) -> list[tuple[str, object, object]]:
    """Name, kind and default of each parameter: what a call by keyword or by position relies on."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def _takes_every_call_of(override: Callable[..., object], base: Callable[..., object]) -> bool:
    """The same names and kinds, and the base's defaults; a default the base lacks only accepts more calls
    (Lightning's ``BatchSizeFinder.setup(trainer, pl_module, stage=None)``)."""
    mine, theirs = _shape(override), _shape(base)
    return len(mine) == len(theirs) and all(
        m[:2] == t[:2] and (m[2] == t[2] or t[2] is inspect.Parameter.empty) for m, t in zip(mine, theirs)
    )


@pytest.mark.parametrize(("module", "name"), PUBLIC)
def test_overridden_hooks_take_the_base_class_parameter_names(module: str, name: str) -> None:
    cls = getattr(importlib.import_module(module), name)
    assert inspect.isclass(cls) and issubclass(cls, Callback), f"{module}.{name} is not a Callback class"
    wrong = {
        hook: _shape(getattr(cls, hook))
        for hook in HOOKS
        if getattr(cls, hook) is not getattr(Callback, hook)
        and not _takes_every_call_of(getattr(cls, hook), getattr(Callback, hook))
    }
    assert not wrong, f"{name} overrides hooks with parameters other than Callback's: {wrong}"
