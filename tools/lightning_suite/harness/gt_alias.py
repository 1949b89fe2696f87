"""Lightning's package names as aliases of ``trainer.lightning``'s modules: no behaviour of its own.

``install("lightning.pytorch")`` makes every module of ``trainer.lightning.TREE`` importable under
that prefix as the very same module object, so ``lightning.pytorch.callbacks.ModelCheckpoint is
callbacks.ModelCheckpoint`` and a test's ``monkeypatch`` of a name patches geartrain's. A path the
tree does not map is a ``ModuleNotFoundError`` naming Lightning's path.

Two things Lightning's tests need that are not geartrain's, each said in the run's report:

* ``lightning.fabric`` is the real Fabric package (``lightning_fabric``) when it is installed:
  Lightning's test files import small helpers from it (``_IS_WINDOWS``, ``seed_everything``).
* ``lightning.pytorch.demos`` (``BoringModel`` and the other models Lightning's tests train), when
  ``trainer.lightning`` has none, is read from the Lightning checkout (``GT_SUITE_DEMOS``) and run
  against the aliased names. A name the demos import that geartrain lacks is given the stand-in of
  ``DEMO_STAND_INS`` inside the demos only, so the tests are measured rather than stopped at
  their fixtures' imports.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import pkgutil
import sys
import types
from collections.abc import Sequence
from typing import Any

import gt_suite_rules as rules

#: Lightning module -> {name: "module:attr" of geartrain's, or "@available:pkg"}: used inside the demos only.
DEMO_STAND_INS: dict[str, dict[str, str]] = {
    "lightning.pytorch.core.optimizer": {"LightningOptimizer": "trainer.loops.optimizer_step:StepOptimizer"},
    "lightning.pytorch.utilities.imports": {"_TORCHVISION_AVAILABLE": "@available:torchvision"},
}

_PREFIXES = ("lightning.pytorch", "pytorch_lightning")
used_stand_ins: set[str] = set()
INTERNAL_USED = "harness: the test uses Lightning internal"
MISSING_USED = "harness: the test uses a public name geartrain lacks:"
REFUSED_USED = "harness: the test uses a name geartrain refuses by name:"


class PlaceholderUsed(AttributeError):
    """A name geartrain does not have (a Lightning internal, or a public name not mapped) was used."""


class Placeholder:
    """What importing a Lightning name geartrain lacks gives: the import works, using the name raises.

    So a test file that imports such a name at its top still runs its other tests, and each test that
    uses it fails naming it (:data:`INTERNAL_USED` or :data:`MISSING_USED`, which the classifier
    reads). Lightning's environment flags (``_TORCH_GREATER_EQUAL_2_4``, ``_RICH_AVAILABLE``) are facts
    about the machine and are answered when read as booleans.
    """

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_gt_name", name)

    def _gt_raise(self, *_: Any, **__: Any) -> Any:
        name = object.__getattribute__(self, "_gt_name")
        path = rules.canonical(name.rpartition(".")[0]) if "." in name else None
        attr = name.rpartition(".")[2]
        internal = path is None or rules.is_internal_module(path) or rules.is_private(attr)
        reason = None if internal else _refusal(f"{path}.{attr}" if path else attr)
        if reason is not None:
            raise PlaceholderUsed(f"{REFUSED_USED} {name} ({reason})")
        raise PlaceholderUsed(f"{INTERNAL_USED if internal else MISSING_USED} {name}")

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{object.__getattribute__(self, '_gt_name')}.{attr}")

    def __bool__(self) -> bool:
        flag = object.__getattribute__(self, "_gt_name").rpartition(".")[2]
        answer = _flag(flag)
        if answer is None:
            self._gt_raise()
        return bool(answer)

    def __str__(self) -> str:
        flag = _flag(object.__getattribute__(self, "_gt_name").rpartition(".")[2])
        if flag is None:
            self._gt_raise()
        return str(flag)

    __call__ = _gt_raise
    __setattr__ = _gt_raise
    __iter__ = _gt_raise
    __getitem__ = _gt_raise
    __enter__ = _gt_raise
    __mro_entries__ = _gt_raise
    __instancecheck__ = _gt_raise
    __fspath__ = _gt_raise
    __dir__ = _gt_raise  # ``Mock(spec=<the name>)`` lists it: a use of the name


def _refusal(path: str) -> str | None:
    """Why ``trainer.lightning`` refuses ``path`` (below ``lightning.pytorch``) or a module above it, else None."""
    import trainer.lightning as root

    refused: dict[str, str] = getattr(root, "REFUSED", {})
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        reason = refused.get(".".join(parts[:end]))
        if reason is not None:
            return reason
    return None


def _flag(name: str) -> bool | None:
    """Lightning's ``_TORCH_GREATER_EQUAL_X_Y`` and ``_PKG_AVAILABLE`` flags for this machine, else None."""
    import re

    import torch
    from packaging.version import Version

    match = re.fullmatch(r"_TORCH_GREATER_EQUAL_(\d+)_(\d+)(?:_(\d+))?", name)
    if match:
        wanted = ".".join(part for part in match.groups() if part is not None)
        return Version(torch.__version__.split("+")[0]) >= Version(wanted)
    match = re.fullmatch(r"_([A-Z0-9_]+?)_AVAILABLE", name)
    if match:
        return importlib.util.find_spec(match.group(1).lower()) is not None
    if name == "_IS_WINDOWS":
        return False
    return None


def install(prefix: str) -> types.ModuleType:
    """Put ``trainer.lightning``'s modules in ``sys.modules`` under ``prefix`` and return the root.

    Imported through ``importlib`` rather than an ``import`` statement: a test that swaps ``sys.modules``
    for a copy without the ``lightning`` modules (to import them afresh) gets them afresh in that copy,
    where the statement would find the interpreter's first import and leave the copy without them.
    """
    root = importlib.import_module("trainer.lightning")

    for path in root.TREE:
        module = sys.modules[f"trainer.lightning.{path}" if path else "trainer.lightning"]
        if path:
            sys.modules[f"{prefix}.{path}"] = module
        _placeholders_for_missing_names(module, path)
    # Lightning modules that are files of trainer.lightning of their own (``cli.py``), not rows of the tree.
    for info in pkgutil.iter_modules(root.__path__):
        if info.name.startswith("_") or info.name in root.TREE:
            continue
        try:
            module = importlib.import_module(f"trainer.lightning.{info.name}")
        except ImportError:  # its optional requirement is missing here: the name stays a placeholder
            continue
        sys.modules[f"{prefix}.{info.name}"] = module
        if "__getattr__" not in module.__dict__:  # a name it lacks is a placeholder, as in the tree's modules

            def _lacks(name: str) -> Any:
                raise AttributeError(name)

            module.__getattr__ = _lacks  # type: ignore[method-assign]
        _placeholders_for_missing_names(module, info.name)
    sys.modules[prefix] = root
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    return root


def _placeholders_for_missing_names(module: types.ModuleType, path: str) -> None:
    """A name the tree's module lacks is a :class:`Placeholder`; the names it maps are unchanged."""
    if not hasattr(module, "__path__"):
        module.__path__ = []  # so an unmapped submodule reaches the finder
    original = module.__dict__.get("__getattr__")
    if original is None or getattr(original, "_gt_wrapped", False):
        return
    full = f"lightning.pytorch.{path}" if path else "lightning.pytorch"

    def __getattr__(name: str) -> Any:
        try:
            return original(name)
        except (AttributeError, ImportError):  # ImportError: a name geartrain refuses (its REFUSED table)
            if name.startswith("__") and name != "__version__":
                raise
            return Placeholder(f"{full}.{name}")

    __getattr__._gt_wrapped = True  # type: ignore[attr-defined]
    module.__getattr__ = __getattr__  # type: ignore[method-assign]


class _Finder(importlib.abc.MetaPathFinder):
    """``lightning.fabric[.x]`` -> ``lightning_fabric[.x]``; ``<prefix>.demos[.x]`` -> the checkout's demos."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None) -> Any:
        if fullname == "lightning.fabric" or fullname.startswith("lightning.fabric."):
            real = "lightning_fabric" + fullname[len("lightning.fabric") :]
            if importlib.util.find_spec("lightning_fabric") is None:
                return None
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real))
        for prefix in _PREFIXES:
            if fullname == f"{prefix}.demos" or fullname.startswith(f"{prefix}.demos."):
                return _demos_spec(fullname, fullname[len(prefix) + 1 :])
            if fullname.startswith(prefix + "."):
                if _is_attribute_of_parent(fullname):
                    # ``lightning.pytorch.loggers.tensorboard.TensorBoardLogger`` is a class, not a module:
                    # no import, so ``mock.patch`` (pkgutil.resolve_name) reaches it by getattr and patches it.
                    return None
                return importlib.machinery.ModuleSpec(fullname, _PlaceholderLoader(), is_package=True)
        return None


def _is_attribute_of_parent(fullname: str) -> bool:
    """Whether ``fullname``'s parent module, already imported, has that name as a real object (not a module)."""
    parent_name, _, child = fullname.rpartition(".")
    parent = sys.modules.get(parent_name)
    if parent is None or child.startswith("__"):
        return False
    try:
        found = getattr(parent, child)
    except (AttributeError, ImportError):
        return False
    return not isinstance(found, (Placeholder, types.ModuleType))


class _PlaceholderLoader(importlib.abc.Loader):
    """A Lightning module the tree does not map: every name in it is a :class:`Placeholder`."""

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__

        def __getattr__(attr: str) -> Any:
            if attr.startswith("__") and attr.endswith("__"):
                raise AttributeError(attr)
            return Placeholder(f"{name.replace('pytorch_lightning', 'lightning.pytorch', 1)}.{attr}")

        module.__getattr__ = __getattr__  # type: ignore[method-assign]
        module.__path__ = []


class _AliasLoader(importlib.abc.Loader):
    """Loads a module under a second name as the same object."""

    def __init__(self, real: str) -> None:
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.real)
        self.real_spec = module.__spec__  # the import system sets the alias's spec on it next
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.real_spec


def _demos_spec(fullname: str, relative: str) -> importlib.machinery.ModuleSpec | None:
    import trainer.lightning as root

    if "demos" in root.TREE:
        return None  # geartrain has its own: the alias installed it already
    source_root = os.environ.get("GT_SUITE_DEMOS")
    if not source_root:
        return None
    base = os.path.join(source_root, *relative.split(".")[1:])
    if os.path.isdir(base):
        spec = importlib.machinery.ModuleSpec(
            fullname, _DemosLoader(os.path.join(base, "__init__.py")), is_package=True
        )
        spec.submodule_search_locations = [base]
        return spec
    if os.path.isfile(base + ".py"):
        return importlib.machinery.ModuleSpec(fullname, _DemosLoader(base + ".py"))
    return None


class _DemosLoader(importlib.abc.Loader):
    """Runs a demos file of the checkout with :data:`DEMO_STAND_INS` for the names geartrain lacks."""

    def __init__(self, filename: str) -> None:
        self.filename = filename

    def exec_module(self, module: types.ModuleType) -> None:
        module.__file__ = self.filename
        with open(self.filename, encoding="utf-8") as handle:
            code = compile(handle.read(), self.filename, "exec")
        module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": _import_with_stand_ins}
        exec(code, module.__dict__)


def _import_with_stand_ins(
    name: str, globals: Any = None, locals: Any = None, fromlist: Sequence[str] = (), level: int = 0
) -> Any:
    canonical = "lightning.pytorch" + name[len("pytorch_lightning") :] if name.startswith("pytorch_lightning") else name
    stand_ins = DEMO_STAND_INS.get(canonical)
    try:
        module = builtins.__import__(name, globals, locals, fromlist, level)
    except ImportError:
        if stand_ins is None or not fromlist:
            raise
        module = types.ModuleType(name)
    if stand_ins is None or not fromlist:
        return module
    missing = [attr for attr in fromlist if not hasattr(module, attr)]
    if not missing:
        return module
    view = types.SimpleNamespace(**{attr: getattr(module, attr) for attr in fromlist if hasattr(module, attr)})
    for attr in missing:
        if attr not in stand_ins:
            raise ImportError(f"cannot import name {attr!r} from {name!r}")
        setattr(view, attr, _stand_in(stand_ins[attr]))
        used_stand_ins.add(f"{canonical}.{attr}")
    return view


def _stand_in(home: str) -> Any:
    if home.startswith("@available:"):
        return importlib.util.find_spec(home.partition(":")[2]) is not None
    module, _, attr = home.partition(":")
    return getattr(importlib.import_module(module), attr)
