"""What geartrain shares with Lightning's own packages when a program has them installed.

Code written against Lightning meets two of Lightning's packages that a geartrain environment may
also hold, and expects one object where Lightning has one:

* ``lightning_utilities``' ``rank_zero_only.rank``. Lightning sets it when it is imported (from
  ``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID`` or ``JSM_NAMESPACE_RANK``, else 0, and never over a value
  already there) and again to the global rank when a strategy sets up its processes. Programs rely on
  it: the lightning-hydra-template's ``RankedLogger`` raises "The `rank_zero_only.rank` needs to be
  set before use" otherwise. The trainer calls :func:`share` with the global rank once its
  strategy's processes are set up. geartrain's own ``rank_zero_only`` reads the rank at each call and
  needs none of this.
* ``lightning_fabric``'s ``PossibleUserWarning`` and ``LightningDeprecationWarning``, which
  ``lightning.pytorch`` re-exports: ``warnings.filterwarnings(..., category=...)`` or
  ``pytest.warns(...)`` given fabric's class must match the warnings the trainer gives. If fabric's
  module is imported first, ``trainer.common.errors`` takes fabric's class (:func:`lightning_class`);
  if it is imported later, fabric's module gets geartrain's class the moment it has run, before any
  other module imports the name from it. Either way the process has one class, as with Lightning.

All without importing either package (that would cost every ``import trainer``): :func:`install`
(run by ``import trainer``) acts on what is already imported and puts a finder first on
``sys.meta_path`` that acts right after the modules above are first imported.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar, cast

__all__ = ["install", "lightning_class", "share"]

W = TypeVar("W", bound=Warning)

RANK_MODULE = "lightning_utilities.core.rank_zero"
#: Where Lightning looks for the rank at import, in its order.
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
#: Lightning's modules that define a warning class ``trainer.common.errors`` also has: module -> class name.
WARNING_CLASSES = {
    f"{package}.utilities.{module}": name
    for package in ("lightning_fabric", "lightning.fabric")
    for module, name in (("rank_zero", "LightningDeprecationWarning"), ("warnings", "PossibleUserWarning"))
}


def _environment_rank() -> int:
    for name in _RANK_VARIABLES:
        value = os.environ.get(name)
        if value is not None:
            return int(value)
    return 0


def share(rank: int | None = None) -> None:
    """Set ``lightning_utilities``' ``rank_zero_only.rank`` if that package is imported.

    ``rank=None`` (at import) keeps a rank already set and otherwise reads the environment, as
    Lightning's import does; a number (the global rank, once the processes are set up) replaces it.
    """
    module = sys.modules.get(RANK_MODULE)
    if module is None:
        return
    function = module.rank_zero_only
    if rank is None:
        if getattr(function, "rank", None) is not None:
            return
        rank = _environment_rank()
    function.rank = rank


def lightning_class(ours: type[W]) -> type[W]:
    """Lightning's warning class of ``ours``' name if fabric's module defining it is imported, else ``ours``.

    ``trainer.common.errors`` binds its name to what this returns, so it is one class with fabric's.
    """
    base = ours.__mro__[1]
    for module_name, name in WARNING_CLASSES.items():
        theirs = getattr(sys.modules.get(module_name), name, None) if name == ours.__name__ else None
        if isinstance(theirs, type) and issubclass(theirs, base):
            return cast("type[W]", theirs)
    return ours


def _share_class(module_name: str) -> None:
    """Make fabric's module, just imported, hold geartrain's class of the same name (one class, as Lightning's)."""
    from trainer.common import errors  # a leaf beside this one; imported here, when fabric is

    module = sys.modules.get(module_name)
    name = WARNING_CLASSES[module_name]
    ours, theirs = getattr(errors, name), getattr(module, name, None)
    if module is None or theirs is None or theirs is ours:
        return
    setattr(module, name, ours)
    # Fabric's rank_zero also made its class lightning_utilities' category for deprecations.
    utilities = sys.modules.get(RANK_MODULE)
    if getattr(utilities, "rank_zero_deprecation_category", None) is theirs:
        utilities.rank_zero_deprecation_category = ours  # type: ignore[union-attr]


#: A module's name -> what to do right after it is first imported.
_AFTER_IMPORT: dict[str, Callable[[], None]] = {
    RANK_MODULE: share,
    **{name: (lambda name=name: _share_class(name)) for name in WARNING_CLASSES},  # type: ignore[misc]
}


class _ShareOnImport:
    """A meta path finder: runs :data:`_AFTER_IMPORT`'s action right after its module is first imported.

    (Not an ``importlib.abc.MetaPathFinder`` subclass: importing ``importlib.abc`` would cost ``import trainer``.)
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        action = _AFTER_IMPORT.get(fullname)
        if action is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            action()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Share what is imported now, and what is imported later the moment it is (once per process)."""
    share()
    if not any(isinstance(f, _ShareOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _ShareOnImport())
