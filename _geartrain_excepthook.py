"""One more line, after the traceback, when a file of the user's hides one of geartrain's packages.

A script named ``trainer.py`` that runs ``from trainer import Trainer`` imports itself: Python ends
in "cannot import name 'Trainer' from partially initialized module 'trainer' (most likely due to a
circular import)" before any of geartrain's code has run, so no check inside the package can help.
Only the interpreter's last word on an uncaught error can: ``geartrain-excepthook.pth`` (installed
beside the packages) chains ``sys.excepthook`` to :func:`excepthook` at start-up, and this module is
imported only when an uncaught exception reaches it. The previous hook always prints the traceback
first, unchanged; the line naming the file to rename comes after it.

Every program of the environment passes through this hook, most of them unrelated to geartrain, so
it speaks only when the failing code meant geartrain: the name it asked for is a public name of the
package (its ``__all__``: ``Trainer``, ``ModelCheckpoint``), or it is a submodule of ours and
geartrain's own code runs in this process (another of its packages is imported) or the hiding file
is the program's own script importing its own name. A program with its own ``strategies.py`` that
lacks ``base`` keeps its traceback alone. When the package Python found is another distribution's
(Coqui TTS's ``trainer``, the index's ``callbacks``) or a mix of two installed over each other, the
line says so instead (:func:`shared_install`, which ``trainer/shadowing.py`` also runs).

It imports nothing at all (``sys`` and ``os`` are loaded before any user's folder is on
``sys.path``): an ``ast.py`` or ``re.py`` lying beside a failing program must never run.
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # read by type checkers only: importing `typing` here could run a user's typing.py
    from collections.abc import Callable
    from types import TracebackType

    _Hook = Callable[[type[BaseException], BaseException, TracebackType | None], object]

__all__ = ["PACKAGES", "excepthook", "shadowing_message", "shared_install"]

#: geartrain's top-level packages, which a user's module of the same name hides.
PACKAGES = ("trainer", "callbacks", "strategies")

#: A file only geartrain's copy of each package has: present beside another distribution's files, the
#: folder is a mix of the two (one installed over the other).
_OWN_FILE = {"trainer": "run_state.py", "callbacks": "_checkpoint_files.py", "strategies": "rerun_command.py"}

_depth = [0]  # calls of :func:`excepthook` in progress


def excepthook(
    chained: "_Hook", exc_type: "type[BaseException]", exc: BaseException, tb: "TracebackType | None"
) -> None:
    """Hand the error to ``chained`` (the hook before ours, which prints the traceback), then add our line if any.

    Where the start-up line ran twice (two copies of it on ``sys.path``), ``chained`` is this hook
    again: only the outermost call adds the line.
    """
    _depth[0] += 1
    try:
        chained(exc_type, exc, tb)
    finally:
        _depth[0] -= 1
    if _depth[0]:
        return
    try:
        message = shadowing_message(exc)
    except Exception:  # never let the explanation hide the error itself
        message = None
    if message is not None:
        try:
            sys.stderr.flush()
            print(f"geartrain: {message}", file=sys.stderr)
        except Exception:
            pass


def shadowing_message(exc: BaseException) -> "str | None":
    """What to rename, when ``exc`` comes from a module of the user's that hides a geartrain package; else None."""
    if type(exc).__name__ == "ShadowedPackageError" and type(exc).__module__ == "trainer.shadowing":
        return None  # found by geartrain itself: its one line is the traceback's last
    if not isinstance(exc, (ImportError, AttributeError)):
        return None
    root = os.path.dirname(os.path.realpath(__file__))  # beside geartrain's packages, installed or in a checkout
    for name in PACKAGES:
        package = os.path.join(root, name)
        missing, where = _missing_from(exc, name)
        if where is not None and os.path.basename(where) == "__init__.py":
            shared = shared_install(name, os.path.dirname(where))
            if shared is not None:  # another distribution's package of that name, or a mix of two
                return shared
        if missing is None or where is None or _inside(os.path.realpath(where), package):
            continue
        public, submodules = _exported(package)
        meant = missing in public or (missing in submodules and (_ours_running(root) or _imports_itself(where)))
        if meant:
            if os.path.basename(where) == "__init__.py":
                folder = os.path.dirname(where)
                return (
                    f"{folder} hides geartrain's package {name!r}: rename the folder (e.g. my_{name}) and its imports"
                )
            return f"{where} hides geartrain's package {name!r}: rename it (e.g. my_{name}.py) and its imports"
    return None


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + os.sep)


def _ours_running(root: str) -> bool:
    """Whether one of geartrain's own packages is imported in this process (its code runs here)."""
    for name in PACKAGES:
        module = sys.modules.get(name)
        where = getattr(module, "__file__", None) if module is not None else None
        if isinstance(where, str) and _inside(os.path.realpath(where), os.path.join(root, name)):
            return True
    return False


def _imports_itself(where: str) -> bool:
    """Whether the hiding file is the program's own script (``python trainer.py`` importing ``trainer``)."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    return isinstance(main, str) and os.path.realpath(main) == os.path.realpath(where)


def _missing_from(exc: BaseException, name: str) -> "tuple[str | None, str | None]":
    """The name ``exc`` says module ``name`` lacks (an attribute or a submodule), and that module's file.

    ``(None, None)`` when ``exc`` is about another module. A module that failed while it was imported
    (a ``trainer.py`` importing itself) is gone from ``sys.modules`` by now: its file is then the
    error's own record (``ImportError.path``, ``AttributeError.obj``) or the traceback's frame in it.
    """
    if isinstance(exc, AttributeError):
        module = getattr(exc, "obj", None)
        if not isinstance(module, type(sys)) or module.__name__ != name:
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
            missing = _quoted_after(str(exc), "cannot import name ")
    else:
        return None, None
    where = exc.path or getattr(sys.modules.get(name), "__file__", None) or _frame_file(exc, name)
    return missing, where


def _quoted_after(text: str, prefix: str) -> "str | None":
    """The word in quotes right after ``prefix`` in ``text`` (``cannot import name 'Trainer'``), else None."""
    start = text.find(prefix + "'")
    if start < 0:
        return None
    start += len(prefix) + 1
    end = text.find("'", start)
    word = text[start:end] if end > start else ""
    return word if word.isidentifier() else None


def _frame_file(exc: BaseException, name: str) -> "str | None":
    """The innermost file of the traceback that is module ``name`` (``name.py`` or ``name/__init__.py``)."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        base = os.path.basename(path)
        if base == f"{name}.py" or (base == "__init__.py" and os.path.basename(os.path.dirname(path)) == name):
            found = path
        tb = tb.tb_next
    return found


def _exported(package: str) -> "tuple[set[str], set[str]]":
    """geartrain's package at ``package``: its public names (``__all__``) and its submodules (read, not imported).

    ``__all__`` is read as text: the quoted identifiers between ``__all__ = [`` and the closing ``]``.
    """
    entries = os.listdir(package)
    submodules = {e[:-3] for e in entries if e.endswith(".py")}
    submodules |= {e for e in entries if os.path.isfile(os.path.join(package, e, "__init__.py"))}
    with open(os.path.join(package, "__init__.py"), encoding="utf-8") as f:
        text = f.read()
    public: set[str] = set()
    start = text.find("__all__")
    if start >= 0:
        opening = text.find("[", start)
        closing = text.find("]", opening)
        if 0 <= opening < closing:
            for part in text[opening + 1 : closing].replace("'", '"').split('"')[1::2]:
                if part.isidentifier():
                    public.add(part)
    return public, submodules - {"__init__"}


def shared_install(name: str, package: "str | os.PathLike[str]") -> "str | None":
    """One line when an installed distribution other than geartrain also provides the import name ``name``.

    ``package`` is the folder Python imports ``name`` from. Distributions record their top-level
    names (``top_level.txt``, else their ``RECORD``) in the folder beside it: another one naming
    ``name`` has written into ``package`` (Coqui TTS's ``trainer``, the index's ``callbacks``), so
    ``package`` is that distribution's, or a mix of both when geartrain's files are there too. Both
    cannot live in one environment. Returns None when no other distribution there claims ``name``
    (a checkout, an editable install, an environment of geartrain's own).
    """
    package = os.fspath(package)
    others = _other_owners(os.path.dirname(package), name)
    if not others:
        return None
    shown = ", ".join(others)
    advice = f"install geartrain and {shown} in separate environments (python -m venv; README.md, 'Two commands')"
    if os.path.isfile(os.path.join(package, _OWN_FILE.get(name, ""))):
        return (
            f"{package} mixes geartrain's package {name!r} with {shown}'s ({name!r} is an import name of both, "
            f"and one was installed over the other): {advice}"
        )
    return f"{package} is {shown}'s package {name!r}, not geartrain's ({name!r} is an import name of both): {advice}"


def _other_owners(folder: str, name: str) -> "list[str]":
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
        canonical = "-".join(part for part in dist.replace("_", "-").replace(".", "-").lower().split("-") if part)
        if canonical == "geartrain":
            continue
        meta = os.path.join(folder, entry)
        top = _read(os.path.join(meta, "top_level.txt"))
        if top is not None:
            claims = name in top.split()
        elif canonical == name:
            record = _read(os.path.join(meta, "RECORD")) or _read(os.path.join(meta, "installed-files.txt")) or ""
            claims = record.startswith(f"{name}/") or f"\n{name}/" in record
        else:
            claims = False
        if claims:
            found.append(f"{dist} {rest}".strip())
    return found


def _read(path: str) -> "str | None":
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None
