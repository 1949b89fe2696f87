"""One line, instead of a traceback, when a file of the user's hides one of geartrain's packages.

A script named ``trainer.py`` that runs ``from trainer import Trainer`` imports itself: Python ends
in "cannot import name 'Trainer' from partially initialized module 'trainer' (most likely due to a
circular import)" before any of geartrain's code has run, so no check inside the package can help.
Only the interpreter's last word on an uncaught error can: ``geartrain-excepthook.pth`` (installed
beside the packages) chains ``sys.excepthook`` to :func:`excepthook` at start-up, and this module is
imported only when an uncaught exception reaches it. Everything else goes on to the previous hook
unchanged.

The line is printed only when the failing import or attribute is one of geartrain's (a name its
package exports) and the module Python found under that name is not geartrain's: a project with a
``trainer.py`` of its own that never meant geartrain keeps its traceback.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, TracebackType

__all__ = ["PACKAGES", "excepthook", "shadowing_message", "shared_install"]

#: geartrain's top-level packages, which a user's module of the same name hides.
PACKAGES = ("trainer", "callbacks", "strategies")

#: A file only geartrain's copy of each package has: present beside another distribution's files, the
#: folder is a mix of the two (one installed over the other).
_OWN_FILE = {"trainer": "run_state.py", "callbacks": "_checkpoint_files.py", "strategies": "rerun_command.py"}

_Hook = Callable[[type[BaseException], BaseException, TracebackType | None], object]


def excepthook(chained: _Hook, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """Print the one line for a hidden package; hand anything else to ``chained`` (the hook before ours)."""
    try:
        message = shadowing_message(exc)
    except Exception:  # never let the explanation hide the error itself
        message = None
    if message is None:
        chained(exc_type, exc, tb)
    else:
        print(f"geartrain: {message}", file=sys.stderr)


def shadowing_message(exc: BaseException) -> str | None:
    """What to rename, when ``exc`` comes from a module of the user's that hides a geartrain package; else None."""
    if type(exc).__name__ == "ShadowedPackageError" and type(exc).__module__ == "trainer.shadowing":
        return str(exc)  # found by geartrain itself (a callbacks.py beside the script): already one line
    if not isinstance(exc, (ImportError, AttributeError)):
        return None
    root = Path(__file__).resolve().parent  # beside geartrain's packages, installed or in a checkout
    for name in PACKAGES:
        missing, where = _missing_from(exc, name)
        if where is not None and Path(where).name == "__init__.py":
            shared = shared_install(name, Path(where).parent)
            if shared is not None:  # another distribution's package of that name, or a mix of two
                return shared
        if missing is None or where is None or Path(where).resolve().is_relative_to(root / name):
            continue
        if missing in _exported(root / name):
            user = Path(where)
            if user.name == "__init__.py":
                return f"{user.parent} hides geartrain's package {name!r}: rename the folder (e.g. my_{name}) and its imports"
            return f"{user} hides geartrain's package {name!r}: rename it (e.g. my_{name}.py) and its imports"
    return None


def _missing_from(exc: BaseException, name: str) -> tuple[str | None, str | None]:
    """The name ``exc`` says module ``name`` lacks (an attribute or a submodule), and that module's file.

    ``(None, None)`` when ``exc`` is about another module. A module that failed while it was imported
    (a ``trainer.py`` importing itself) is gone from ``sys.modules`` by now: its file is then the
    error's own record (``ImportError.path``, ``AttributeError.obj``) or the traceback's frame in it.
    """
    if isinstance(exc, AttributeError):
        module = getattr(exc, "obj", None)
        if not isinstance(module, ModuleType) or module.__name__ != name:
            return None, None
        return exc.name, getattr(module, "__file__", None)
    assert isinstance(exc, ImportError)
    if exc.name is None:
        return None, None
    if exc.name.startswith(f"{name}."):  # `from trainer.module import ...`: "'trainer' is not a package"
        missing: str | None = exc.name.split(".")[1]
    elif exc.name == name:
        missing = getattr(exc, "name_from", None)  # Python 3.12+
        if missing is None:
            match = re.match(r"cannot import name '(\w+)'", str(exc))
            missing = match.group(1) if match else None
    else:
        return None, None
    where = exc.path or getattr(sys.modules.get(name), "__file__", None) or _frame_file(exc, name)
    return missing, where


def _frame_file(exc: BaseException, name: str) -> str | None:
    """The innermost file of the traceback that is module ``name`` (``name.py`` or ``name/__init__.py``)."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        path = Path(tb.tb_frame.f_code.co_filename)
        if path.name == f"{name}.py" or (path.name == "__init__.py" and path.parent.name == name):
            found = str(path)
        tb = tb.tb_next
    return found


def _exported(package: Path) -> set[str]:
    """The names geartrain's package at ``package`` offers: its ``__all__`` and its submodules (read, not imported)."""
    modules = {p.stem for p in package.glob("*.py")}
    names = modules | {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    for node in ast.parse((package / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            names |= {e.value for e in getattr(node.value, "elts", []) if isinstance(getattr(e, "value", None), str)}
    return names - {"__init__"}


def shared_install(name: str, package: Path) -> str | None:
    """One line when an installed distribution other than geartrain also provides the import name ``name``.

    ``package`` is the folder Python imports ``name`` from. Distributions record their top-level
    names (``top_level.txt``, else their ``RECORD``) in the folder beside it: another one naming
    ``name`` has written into ``package`` (Coqui TTS's ``trainer``, the index's ``callbacks``), so
    ``package`` is that distribution's, or a mix of both when geartrain's files are there too. Both
    cannot live in one environment. Returns None when no other distribution there claims ``name``
    (a checkout, an editable install, an environment of geartrain's own).
    """
    others = _other_owners(package.parent, name)
    if not others:
        return None
    shown = ", ".join(others)
    advice = f"install geartrain and {shown} in separate environments (python -m venv; README.md, 'Two commands')"
    if (package / _OWN_FILE.get(name, "")).is_file():
        return (
            f"{package} mixes geartrain's package {name!r} with {shown}'s ({name!r} is an import name of both, "
            f"and one was installed over the other): {advice}"
        )
    return f"{package} is {shown}'s package {name!r}, not geartrain's ({name!r} is an import name of both): {advice}"


def _other_owners(folder: Path, name: str) -> list[str]:
    """``"<distribution> <version>"`` of each distribution in ``folder``, geartrain aside, that installs ``name``.

    Reads ``top_level.txt`` where a distribution has one; a ``RECORD`` only for a distribution named like
    the package (reading every ``RECORD`` of a large environment would cost every start-up).
    """
    try:
        entries = sorted(os.listdir(folder))
    except OSError:
        return []
    found = []
    for entry in entries:
        if not entry.endswith((".dist-info", ".egg-info")):
            continue
        dist, _, rest = entry.rpartition(".")[0].partition("-")
        canonical = re.sub(r"[-_.]+", "-", dist).lower()
        if canonical == "geartrain":
            continue
        meta = folder / entry
        top = _read(meta / "top_level.txt")
        if top is not None:
            claims = name in top.split()
        elif canonical == name:
            record = _read(meta / "RECORD") or _read(meta / "installed-files.txt") or ""
            claims = record.startswith(f"{name}/") or f"\n{name}/" in record
        else:
            claims = False
        if claims:
            found.append(f"{dist} {rest}".strip())
    return found


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
