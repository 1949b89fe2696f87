"""A file of the user's, or another distribution, that hides one of geartrain's top-level packages, named in one line.

geartrain ships three top-level packages: ``trainer``, ``strategies`` and ``callbacks``. A
``callbacks.py`` or ``strategies.py`` next to a training script (a common habit) comes first on
``sys.path``, and geartrain's own imports would then fail with ``'callbacks' is not a package``.
:func:`check_sibling_packages` finds that before anything is imported and names the file to rename.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__all__ = ["ShadowedPackageError", "check_sibling_packages"]

SIBLINGS = ("strategies", "callbacks")


class ShadowedPackageError(ImportError):
    """A module of the user's has the name of one of geartrain's packages."""


def check_sibling_packages() -> None:
    """Raise :class:`ShadowedPackageError` if ``strategies`` or ``callbacks`` would import something not geartrain's.

    Also when another installed distribution provides one of the three import names in the folder
    geartrain's packages are in (``pip install trainer`` over geartrain): one line naming it
    (:func:`_geartrain_excepthook.shared_install`, which the start-up line's error hook uses too).
    """
    root = Path(__file__).resolve().parent.parent
    shared = _shared_install(root)
    if shared is not None:
        raise ShadowedPackageError(shared)
    for name in SIBLINGS:
        module = sys.modules.get(name)
        if module is not None:
            locations = list(getattr(module, "__path__", []) or [])
            origin = getattr(module, "__file__", None)
        else:
            spec = importlib.util.find_spec(name)
            if spec is None:
                continue
            locations = list(spec.submodule_search_locations or [])
            origin = spec.origin
        if any(Path(p).resolve() == root / name for p in locations):
            continue
        where = origin or (locations[0] if locations else name)
        raise ShadowedPackageError(
            f"{where} hides geartrain's package {name!r}: rename it (e.g. my_{name}.py) and its imports"
        )


def _shared_install(root: Path) -> str | None:
    """The first of geartrain's packages under ``root`` that another distribution installs too, said in one line."""
    try:
        from _geartrain_excepthook import shared_install
    except ImportError:  # a copy of the packages without the start-up module: nothing to compare with
        return None
    for name in ("trainer", *SIBLINGS):
        said = shared_install(name, root / name)
        if said is not None:
            return said
    return None
