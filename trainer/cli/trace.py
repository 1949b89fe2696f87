"""An error raised in the user's own code, shown as the user's frames and the error, not the whole stack.

A ``geartrain`` run calls the user's module and data through Hydra, the strategy's launcher and the
trainer's loops; an exception in ``training_step`` or in reading a data file has 50-80 lines of
traceback, most of them those layers'. :func:`user_traceback` keeps the frames of files outside
Python's own library, the installed packages and geartrain, and the error itself; the full trace is
one variable away (``HYDRA_FULL_ERROR=1``). An error with no frame of the user's is not shortened:
it is a bug of geartrain's or a library's, and its traceback is the report.
"""

from __future__ import annotations

import re
import sysconfig
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

__all__ = ["ReportedMistake", "user_traceback"]


class ReportedMistake(BaseException):
    """Carries a user's mistake past Hydra, which would print a line of its own about any ``Exception``.

    Raised by the job function; :func:`trainer.cli.errors.reported` unwraps it and prints the short
    message. A ``BaseException`` so that Hydra's job runner lets it through untouched.
    """

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _library_folders() -> list[Path]:
    import callbacks
    import strategies
    import trainer

    folders = [Path(m.__file__).resolve().parent for m in (trainer, strategies, callbacks) if m.__file__]
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            folders.append(Path(path).resolve())
    return folders


def _is_users(filename: str, libraries: list[Path]) -> bool:
    if filename.startswith("<"):
        return False
    path = Path(filename).resolve()
    return not any(path == folder or folder in path.parents for folder in libraries)


def user_traceback(err: BaseException, flag: str) -> str | None:
    """The frames of ``err``'s traceback in the user's files, then the error; None if there are none.

    ``flag`` is what to set for the full traceback (named in the first line).
    """
    from strategies.launch import WorkerFailedError

    libraries = _library_folders()
    if isinstance(err, WorkerFailedError):  # the worker's traceback, as text in the message
        shown = _frames_in_text(str(err), libraries)
        last = [err.cause] if err.cause else []
        where = f" (rank {err.rank})" if err.rank is not None else ""
    else:
        frames = [f for f in traceback.extract_tb(err.__traceback__) if _is_users(f.filename, libraries)]
        shown = traceback.format_list(frames)
        last = traceback.format_exception_only(type(err), err)
        where = ""
    if not shown:
        return None
    lines = [f"Traceback{where} (your code only; the full trace: {flag}=1):\n", *shown, *last]
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines).rstrip("\n")


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line \d+, in ')


def _frames_in_text(text: str, libraries: list[Path]) -> list[str]:
    """The user's frames of a traceback printed as text (a worker's), each as ``format_list`` gives it."""
    lines = text.splitlines()
    frames: list[str] = []
    i = 0
    while i < len(lines):
        match = _FRAME.match(lines[i])
        if match is None:
            i += 1
            continue
        indent = len(lines[i]) - len(lines[i].lstrip())
        block = [lines[i]]
        i += 1
        while i < len(lines) and len(lines[i]) - len(lines[i].lstrip()) > indent and not _FRAME.match(lines[i]):
            block.append(lines[i])
            i += 1
        if _is_users(match["file"], libraries):
            frames.append("".join("  " + line[indent:] + "\n" for line in block))
    return frames


def short_warnings() -> None:
    """Show geartrain's own warnings as ``geartrain: warning: <message>``, without our file path and source line.

    A warning raised inside geartrain speaks to the user about their run; the path of the file that
    raised it and its source line are ours, not theirs. Other libraries' warnings keep Python's form.
    The ranks a strategy starts format warnings as this process does (the formatter travels with
    their task, :func:`strategies.launch.start_processes`); the ranks that run the command again
    install it themselves.
    """
    if not isinstance(warnings.formatwarning, ShortWarnings):
        warnings.formatwarning = ShortWarnings(_library_folders()[:3])


#: Python's own form of a warning, as ``warnings`` had it when this module was imported.
_PYTHON_FORM: Callable[..., str] = warnings.formatwarning


class ShortWarnings:
    """``warnings.formatwarning`` for :func:`short_warnings`: a class, so a started rank can be handed it (pickled)."""

    def __init__(self, libraries: list[Path]) -> None:
        self.libraries = libraries

    def __call__(
        self, message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
    ) -> str:
        """Python's form for a warning raised in the user's code (or a library's); one line for geartrain's."""
        if _is_users(filename, self.libraries):
            return _PYTHON_FORM(message, category, filename, lineno, line)
        return f"geartrain: warning: {message}\n"
