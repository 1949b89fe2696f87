"""What a rank that ``strategy="ddp"`` started does in its own process (see :mod:`strategies.relaunch`).

It joins rank 0's group through a store that waits for it (:func:`join_group`), dies with rank 0,
and hands the traceback of an exception that ends it to rank 0 (:func:`record_errors`), which reports
it as :class:`~strategies.launch.WorkerFailedError`.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import TracebackType

__all__ = [
    "ERROR_FILE",
    "JOIN_TIMEOUT",
    "PARENT",
    "close_files_in_cycles",
    "die_with_this_thread",
    "end_now",
    "ended_file",
    "ending_by_error",
    "flush_files_at_exit",
    "hand_over",
    "join_group",
    "new_workdir",
    "note_the_end",
    "record_errors",
]

#: The process id of rank 0, in the ranks it started.
PARENT = "GEARTRAIN_RERUN_PARENT"
#: Where a started rank writes the traceback of the exception that ends it.
ERROR_FILE = "GEARTRAIN_RANK_ERROR_FILE"

#: How long rank 0 waits for the ranks it started to reach ``fit`` (they import and build first).
JOIN_TIMEOUT = timedelta(minutes=10)


def join_group(backend: str, timeout: timedelta, waiting: Callable[[], None] | None = None) -> None:
    """Form the process group of rank 0 and the ranks it started (in each of them).

    The ranks meet through a store rank 0 serves, waiting up to :data:`JOIN_TIMEOUT` for every rank to
    arrive: a rank that runs the script again takes a while to get there, and ``timeout`` (the
    collectives' limit, which may be seconds) is not meant for that. Rank 0 waits in Python, calling
    ``waiting`` every few milliseconds: a rank that ended on the way (its failure, or a Ctrl-C before
    ``fit``) raises there at once, and a signal's handler runs at once (a wait inside the store's
    constructor would hold both off until every rank arrived).
    """
    import torch.distributed as dist

    if os.environ.get(PARENT):
        _die_with_parent()
        if str(os.getppid()) != os.environ[PARENT]:  # rank 0 is gone already
            raise RuntimeError("the process that started this rank (rank 0) has ended; nothing to join")
        note_the_end()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=rank == 0,
        timeout=max(timeout, JOIN_TIMEOUT),
        wait_for_workers=False,
    )
    store.add(_JOINED, 1)
    if rank == 0:
        deadline = time.monotonic() + JOIN_TIMEOUT.total_seconds()
        while store.add(_JOINED, 0) < world:
            if waiting is not None:
                waiting()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the ranks this process started did not reach fit within {JOIN_TIMEOUT}: "
                    f"{store.add(_JOINED, 0)} of {world} joined"
                )
            time.sleep(0.02)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


#: The store's count of the ranks that have arrived (:func:`join_group`).
_JOINED = "geartrain/joined"


def die_with_this_thread() -> Callable[[], None] | None:
    """What a started rank runs before the script: die when this process dies (Linux; elsewhere None).

    ``PR_SET_PDEATHSIG`` survives the ``exec`` of the script and fires when the thread that started the
    rank ends, so it is set only from the main thread (whose end is the process's).
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def bind() -> None:
        prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # this process died before the line above: nothing to run for
            os._exit(1)

    return bind


def _die_with_parent() -> None:
    """In a started rank: die when the process that started it dies (Linux; elsewhere nothing)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


#: The launch's work folder in the temporary folder: the prefix, then the process id of rank 0.
_WORKDIR_PREFIX = "geartrain-ranks-"


def new_workdir() -> str:
    """A new work folder for a launch (the ranks' error files), after removing those whose rank 0 has gone.

    A kill -9 of rank 0 leaves its folder behind: the next launch on the machine removes it.
    """
    with contextlib.suppress(OSError):
        for entry in os.scandir(tempfile.gettempdir()):
            pid = entry.name.removeprefix(_WORKDIR_PREFIX).split("-")[0]
            if not entry.name.startswith(_WORKDIR_PREFIX) or not pid.isdigit() or not entry.is_dir():
                continue
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                shutil.rmtree(entry.path, ignore_errors=True)
            except OSError:
                pass
    return tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-")


def ended_file(error_file: str | os.PathLike[str]) -> Path:
    """Where a started rank writes the status its script ended with (beside its error file)."""
    return Path(error_file).with_suffix(".ended")


def note_the_end() -> None:
    """In a started rank: when the script has ended, write the status it ended with, for rank 0.

    A process of a gloo group can still be aborted by the interpreter's finalization after its work is
    done (SIGABRT, "terminate called without an active exception"; see
    ``trainer.cli.command.leave_group_process``, which the ``geartrain`` command uses, but a user's
    script that ``ddp`` runs again ends as Python ends it). Rank 0 then takes the status written here
    over the signal. It is written as the main thread's code has finished (Python's threading exit
    hooks run before the interpreter is torn down), with ``sys.exit``'s status, else 0; an uncaught
    exception never gets here (:func:`record_errors` ends the process with 1 first).
    """
    path = os.environ.get(ERROR_FILE)
    if not path or getattr(sys.exit, "_geartrain", False):
        return
    status = [0]
    plain_exit = sys.exit

    def exit_noting_status(code: str | int | None = None) -> None:
        status[0] = 0 if code is None else code if isinstance(code, int) else 1
        plain_exit(code)

    def write() -> None:
        with contextlib.suppress(OSError):
            ended_file(path).write_text(str(status[0]))

    exit_noting_status._geartrain = True  # type: ignore[attr-defined]
    sys.exit = exit_noting_status  # type: ignore[assignment]
    threading._register_atexit(write)  # type: ignore[attr-defined]


def end_now(message: str, code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    if message:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(message.rstrip() + "\n")
            sys.stderr.flush()
    os._exit(code)


_failing = [False]  # set by record_errors' hook as an uncaught exception ends this process


def ending_by_error() -> bool:
    """Whether this process is ending by an uncaught exception (its exit hooks run from :func:`record_errors`)."""
    return _failing[0]


def record_errors() -> None:
    """Make the exception that ends a rank of a started group end it at once, and say it where it belongs.

    In a rank that rank 0 started, the traceback goes to a file rank 0 reads (it becomes rank 0's
    :class:`~strategies.launch.WorkerFailedError`); in rank 0 it is printed as usual. Then the exit
    handlers run and the process ends without the interpreter's finalization: with the group's peers
    gone, gloo's threads can keep a finalizing interpreter from ever ending (see
    ``trainer.cli.command.leave_group_process``).
    """
    if getattr(sys.excepthook, "_geartrain", False):
        return
    path = os.environ.get(ERROR_FILE)

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        _failing[0] = True
        written = False
        if path:
            with contextlib.suppress(OSError):
                Path(path).write_text("".join(traceback.format_exception(kind, value, tb)))
                written = True
        if not written:
            # Straight to the process's stderr: torch.distributed's own hook, which calls this one,
            # collects what it prints to add a rank prefix, and would print it only after this returns.
            stream = sys.__stderr__ or sys.stderr
            with contextlib.suppress(OSError, ValueError):
                traceback.print_exception(kind, value, tb, file=stream)
        with contextlib.suppress(Exception):
            atexit._run_exitfuncs()
        end_now("", 1)

    hook._geartrain = True  # type: ignore[attr-defined]
    sys.excepthook = hook


#: The process whose exit :func:`flush_files_at_exit` has registered for (a forked child is another).
_flushing_in: int | None = None


def flush_files_at_exit() -> None:
    """At this rank's exit, finalize the files left open in reference cycles whole (:func:`close_files_in_cycles`).

    Registered when the rank forms its group; it runs before the ``atexit`` hooks registered earlier
    (logging's, multiprocessing's), which still run, and keeps nothing alive.
    """
    global _flushing_in
    owner = os.getpid()
    if _flushing_in == owner:  # a later stage of the same process
        return
    _flushing_in = owner

    def flush() -> None:
        if os.getpid() == owner:  # not a forked child running its parent's hooks (it registers its own)
            close_files_in_cycles()

    atexit.register(flush)


#: The bottom layers of Python's files: what a gzip file, a zip archive or a text layer writes into.
_RAW_FILES = (io.FileIO, io.BufferedWriter, io.BufferedRandom, io.BufferedReader, io.BufferedRWPair)


def close_files_in_cycles() -> None:
    """Flush every open file, then collect the reference cycles with every raw file kept open meanwhile.

    A file left open in a reference cycle (a callback's ``gzip.open(..., "wt")``, its
    ``zipfile.ZipFile(..., "w")``, a plain log) is finalized only by a collection, which finalizes the
    cycle's objects in an order of its own: the raw file under a gzip file can be closed before the gzip
    file writes its end, and the archive is truncated. Here every raw file and buffer alive is held by a
    list while the cycles are collected, so each wrapper's finalizer writes into a file still open
    (which it then closes); the raw files are let go afterwards and closed by their own finalizers.
    Objects are looked at by ``type(obj)`` only: asking an object for its class can run its code (torch's
    deprecated ``reduce_op`` warns).
    """
    held = []
    for obj in gc.get_objects():
        kind = type(obj)
        if issubclass(kind, io.IOBase):
            with contextlib.suppress(Exception):
                if not obj.closed:
                    obj.flush()
            if kind in _RAW_FILES:
                held.append(obj)
    gc.collect()
    del held


def hand_over(err: BaseException) -> bool:
    """In a rank that rank 0 started: record ``err`` for rank 0 to report, and return True; elsewhere False.

    The ``geartrain`` command's short messages use it, so a mistake every rank meets is said once.
    """
    path = os.environ.get(ERROR_FILE)
    if not path:
        return False
    with contextlib.suppress(OSError):
        Path(path).write_text("".join(traceback.format_exception(type(err), err, err.__traceback__)))
        Path(path).with_suffix(".cause").write_text(f"{type(err).__name__}: {err}")
        return True
    return False
