"""``lightning_utilities``' ``rank_zero_only.rank``, set as Lightning sets it, for code written against Lightning.

Lightning sets the attribute when it is imported (from ``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID`` or
``JSM_NAMESPACE_RANK``, else 0, and never over a value already there) and again to the global rank
when a strategy sets up its processes. Programs rely on it: the lightning-hydra-template's
``RankedLogger`` raises "The `rank_zero_only.rank` needs to be set before use" otherwise. geartrain does
the same without importing ``lightning_utilities`` itself (that would cost every ``import trainer``):
:func:`install` (run by ``import trainer``) sets the rank on the package if it is already imported,
and otherwise as soon as it is, and the trainer calls :func:`share` with the global rank once its
strategy's processes are set up. geartrain's own ``rank_zero_only`` reads the rank at each call and
needs none of this.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["install", "share"]

MODULE = "lightning_utilities.core.rank_zero"
#: Where Lightning looks for the rank at import, in its order.
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


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
    module = sys.modules.get(MODULE)
    if module is None:
        return
    function = module.rank_zero_only
    if rank is None:
        if getattr(function, "rank", None) is not None:
            return
        rank = _environment_rank()
    function.rank = rank


class _ShareOnImport:
    """A meta path finder: calls :func:`share` right after ``lightning_utilities.core.rank_zero`` is first imported.

    (Not an ``importlib.abc.MetaPathFinder`` subclass: importing ``importlib.abc`` would cost ``import trainer``.)
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != MODULE:
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
            share()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Set the rank now if ``lightning_utilities`` is imported, else when it is (once per process)."""
    share()
    if MODULE not in sys.modules and not any(isinstance(f, _ShareOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _ShareOnImport())
