"""Lightning's ``ddp`` launch: the caller becomes rank 0 and the other ranks run the script again.

``Trainer(strategy="ddp", devices=N).fit(...)`` from a script starts N-1 new processes that run the
same command line (``python script.py args``, ``python -m package args`` or ``geartrain args``) with
the rank's environment (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``NODE_RANK``), as ``torchrun`` starts every rank. The caller then trains as
rank 0 and the new processes join when their run of the script reaches ``fit``. Nothing is pickled:
lambdas, loggers used before ``fit`` and open files work, and after ``fit`` the caller holds rank 0's
own state. Every rank runs the script, so code at the top level of a script must sit under
``if __name__ == "__main__":`` only as usual; code after ``fit`` runs on every rank
(``trainer.is_global_zero`` tells rank 0).

Under Hydra (the ``geartrain`` command or a user's own ``@hydra.main`` script) the other ranks run
the one job this process runs, with its overrides and its run directory pinned: in a sweep (``-m``)
each job's ranks run that job only and write into its folder.

The caller also watches the ranks it started: a rank that fails during a stage ends the others
within seconds and its traceback becomes :class:`~strategies.launch.WorkerFailedError` in the caller;
signals that reach the caller (SIGTERM, SIGINT, SIGHUP, SIGUSR1) are passed on, so every rank saves at
the step they agree on; at exit the caller waits for its ranks and exits non-zero if one failed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from strategies.launch_signals import RankZeroForwarder
from strategies.rank_process import (
    ERROR_FILE,
    PARENT,
    die_with_this_thread,
    end_now,
    ended_file,
    ending_by_error,
    new_workdir,
    record_errors,
)
from strategies.rerun_command import check_rerunnable, hydra_config, rerun_command
from trainer.common.errors import CheckpointError, Interrupted, UserError

__all__ = [
    "RERUN",
    "RankLauncher",
    "check_rerunnable",
    "current_launcher",
    "joining_check",
    "record_errors",
    "rerun_command",
    "start_ranks",
    "started_by_rerun",
]

T = TypeVar("T")

#: Set in the processes :class:`RankLauncher` started: the launch's work folder (error files).
RERUN = "GEARTRAIN_RERUN"
#: Seconds the caller waits for its own stage to end after a rank it started failed or was killed,
#: before it ends itself (its main thread may be stuck where no error reaches it).
STUCK_SECONDS = 5.0


#: The ranks this process started, while they run with it.
_current: RankLauncher | None = None


def current_launcher() -> RankLauncher | None:
    """The launcher whose ranks run with this process now, else None.

    A launcher whose ranks have all ended, or that started them for another Hydra job (the previous
    job of a sweep), is finished first: its group is left, so the next stage starts new ranks.
    """
    global _current
    if _current is not None and (_current.job != _job_key() or not _current.alive()):
        launcher, _current = _current, None
        unreported = launcher.finish()
        if unreported is not None:  # a rank failed after the last stage: said before anything goes on
            from strategies.launch import WorkerFailedError

            raise WorkerFailedError(*unreported)
    return _current


def joining_check() -> Callable[[], None] | None:
    """What rank 0 calls while it waits for the ranks it started to join: raises once one has ended."""
    return _current.check_joining if _current is not None else None


def start_ranks(nprocs: int, grace_period: float) -> RankLauncher:
    """Make this process rank 0 of ``nprocs`` and start the others (see the module docstring)."""
    global _current
    launcher = RankLauncher(nprocs, grace_period)
    launcher.start()
    _current = launcher
    return launcher


def started_by_rerun() -> bool:
    """True in a process that :class:`RankLauncher` started (it joins the caller's group)."""
    return RERUN in os.environ and "RANK" in os.environ


class RankLauncher:
    """The ranks this process started (one launcher per process and group; see the module docstring).

    Args:
        nprocs: processes in all, this one included (rank 0).
        grace_period: seconds the ranks get to save and exit after a signal before they are killed.
    """

    def __init__(self, nprocs: int, grace_period: float) -> None:
        self.nprocs = nprocs
        self.workdir = new_workdir()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.forwarder = RankZeroForwarder(self, grace_period, STUCK_SECONDS)
        #: The first rank that failed on its own: (rank, exit code), else None.
        self.failure: tuple[int, int] | None = None
        self.stopping = False  # the caller is ending the ranks itself: their exits are not failures
        self.job = _job_key()
        self._stages = 0  # stages (fit, test, ...) running now in this process
        self._saved_env: dict[str, str | None] = {}
        self._env: dict[str, str] = {}  # the group's variables, set while a stage runs here

    # ----------------------------------------------------------------- start
    def start(self) -> None:
        """Set this process up as rank 0 and start ranks 1..N-1 running the script again."""
        import socket

        import torch

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        env = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(self.nprocs),
            "LOCAL_WORLD_SIZE": str(self.nprocs),
            "NODE_RANK": "0",
            "GROUP_RANK": "0",
            RERUN: self.workdir,
        }
        if "OMP_NUM_THREADS" not in os.environ:
            # N OpenMP pools as big as the machine, spinning on the same cores, make CPU steps many
            # times slower: each rank gets its share (the caller's torch has started: set it directly).
            threads = max(1, (os.cpu_count() or 1) // self.nprocs)
            env["OMP_NUM_THREADS"] = str(threads)
            torch.set_num_threads(threads)
        bind = die_with_this_thread()
        for rank in range(1, self.nprocs):
            command, cwd = rerun_command(rank)
            child = {**os.environ, **env, "RANK": str(rank), "LOCAL_RANK": str(rank), PARENT: str(os.getpid())}
            child[ERROR_FILE] = os.path.join(self.workdir, f"rank-{rank}.err")
            # In this process's group, as Lightning's ranks: a terminal's Ctrl-C reaches every rank, and
            # a rank reading the terminal (input() before fit) is not stopped as a background job. From
            # their first instruction they die with this process (a kill -9 leaves no rank running).
            self.procs.append(subprocess.Popen(command, env=child, cwd=cwd, preexec_fn=bind))
        self._env = {**env, "RANK": "0", "LOCAL_RANK": "0"}
        self._apply_env()
        self.forwarder.install()
        record_errors()  # an exception that ends this process ends it at once (see there)
        threading.Thread(target=self._watch, name="geartrain-rank-watch", daemon=True).start()
        atexit.register(self.wait_at_exit)

    # ----------------------------------------------------------------- one stage
    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` here as rank 0; a failure of another rank becomes its own error here."""
        from strategies.launch import WorkerFailedError

        self._stages += 1
        self._apply_env()
        try:
            return fn(*args)
        except BaseException as exc:
            failed = self._wait_failure(2.0) if not isinstance(exc, Interrupted) else None
            self.stop()
            if self.forwarder.killed and not isinstance(exc, Interrupted):
                raise Interrupted(self.forwarder.explain(), self.forwarder.signal or signal.SIGTERM) from None
            if self.forwarder.signal is not None and isinstance(exc, _RankEnded):  # it ended of the signal
                raise Interrupted(self.forwarder.explain(), self.forwarder.signal) from None
            if failed is not None and not isinstance(exc, (UserError, CheckpointError)):  # else: its own mistake
                rank, code = failed
                raise WorkerFailedError(self.describe(rank, code), rank, self._cause(rank)) from None
            raise
        finally:
            self._stages -= 1
            self._restore_env()  # the caller's environment between stages and after them is its own

    def _apply_env(self) -> None:
        """The group's variables (``RANK``, ``MASTER_PORT``, ...) in this process's environment, for a stage."""
        for key, value in self._env.items():
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def _restore_env(self) -> None:
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env = {}

    def check_joining(self) -> None:
        """Called by rank 0 while it waits for the others to join: raises once one of them has ended.

        A rank that fails (or is ended by a Ctrl-C) while it runs the script's code before ``fit``
        never joins; rank 0 learns it here at once, instead of after the join's time limit.
        """
        self._check_exits()
        for rank, proc in enumerate(self.procs, start=1):
            if proc.poll() is not None:
                raise _RankEnded(f"rank {rank} ended before it joined the group")

    def alive(self) -> bool:
        """Whether every rank this process started still runs."""
        return all(proc.poll() is None for proc in self.procs)

    def describe(self, rank: int, code: int) -> str:
        """What rank ``rank`` that ended with ``code`` recorded: its traceback, else its exit status."""
        text = self._error_text(rank)
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return (
            f"training process of rank {rank} failed ({how}):\n{text}"
            if text
            else (f"training process of rank {rank} failed ({how}); its output above says why")
        )

    def _error_text(self, rank: int) -> str:
        with contextlib.suppress(OSError):
            return Path(self.workdir, f"rank-{rank}.err").read_text()
        return ""

    def _cause(self, rank: int) -> str:
        """``"ExceptionType: message"``, as the rank handed it over, else the recorded traceback's last line."""
        with contextlib.suppress(OSError):
            return Path(self.workdir, f"rank-{rank}.cause").read_text()
        lines = self._error_text(rank).strip().splitlines()
        return lines[-1] if lines else ""

    def _status(self, rank: int, code: int | None) -> int | None:
        """``code``, or, for a rank a signal ended after its script had ended, the status the script ended with.

        The interpreter's finalization can abort a finished rank of a gloo group (see
        :func:`strategies.rank_process.note_the_end`); its work was done, so that is not a failure.
        """
        if code is not None and code < 0:
            with contextlib.suppress(OSError, ValueError):
                return int(ended_file(os.path.join(self.workdir, f"rank-{rank}.err")).read_text())
        return code

    def _wait_failure(self, seconds: float) -> tuple[int, int] | None:
        """The first rank that failed on its own, waiting up to ``seconds`` for one to tell."""
        deadline = time.monotonic() + seconds
        while self.failure is None and time.monotonic() < deadline and not self.stopping:
            self._check_exits()
            if all(proc.poll() is not None for proc in self.procs):
                break
            time.sleep(0.05)
        return self.failure

    # ----------------------------------------------------------------- watching and ending
    def _check_exits(self) -> None:
        for rank, proc in enumerate(self.procs, start=1):
            code = self._status(rank, proc.poll())
            # A recorded traceback tells at once, while the rank may still be on its way out.
            recorded = os.path.exists(os.path.join(self.workdir, f"rank-{rank}.err"))
            if (code not in (None, 0) or recorded) and self.failure is None and not self.stopping:
                self.failure = (rank, code if code not in (None, 0) else 1)

    def _watch(self) -> None:
        """While a stage runs here: a rank that fails ends the others, and this process if it is stuck."""
        while not self.stopping:
            self._check_exits()
            if self.failure is not None and self._stages > 0 and self.forwarder.signal is None:
                rank, code = self.failure
                self._kill_others()
                deadline = time.monotonic() + STUCK_SECONDS
                while self._stages > 0 and time.monotonic() < deadline:
                    time.sleep(0.05)
                if self._stages > 0:  # stuck where no error reaches it (a hang, a long computation)
                    message = self.describe(rank, code)
                    self._remove_workdir()
                    end_now(f"WorkerFailedError: {message}", 1)
                return
            if all(proc.poll() is not None for proc in self.procs):
                return
            time.sleep(0.1)

    def _kill_others(self) -> None:
        # Killed outright: with a rank gone the group cannot go on, and a rank stuck in a collective or
        # noting SIGTERM for a preemption would only wait for its timeout.
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()

    def stop(self) -> None:
        """End every rank this process started (after this process failed: they cannot go on alone)."""
        self.stopping = True
        self._kill_others()
        for proc in self.procs:
            proc.wait()
        self.forwarder.restore()

    def finish(self) -> tuple[str, int, str] | None:
        """After the ranks ended: leave the group, put the environment back, remove the work folder.

        Returns what :class:`~strategies.launch.WorkerFailedError` says of a rank that failed after
        the last stage (nothing reported it yet), else None.
        """
        import torch.distributed as dist

        for proc in self.procs:
            proc.wait()
        unreported = None if self.stopping else self._unreported_failure()
        self.stopping = True
        self.forwarder.restore()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        self._restore_env()
        self._remove_workdir()
        with contextlib.suppress(ValueError):
            atexit.unregister(self.wait_at_exit)
        return unreported

    def _unreported_failure(self) -> tuple[str, int, str] | None:
        """(message, rank, cause) of the first rank that ended with a failure, read from the work folder."""
        failed = self._first_failed()
        return None if failed is None else (self.describe(*failed), failed[0], self._cause(failed[0]))

    def _first_failed(self) -> tuple[int, int] | None:
        """(rank, status) of the first rank that ended with a failure (not of a signal this process passed on)."""
        if self.forwarder.signal is not None:
            return None
        for rank, proc in enumerate(self.procs, start=1):
            code = self._status(rank, proc.returncode) or 0
            if code != 0:
                return rank, code
        return None

    def _remove_workdir(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)

    def wait_at_exit(self) -> None:
        """At this process's exit: wait for the ranks it started; one that failed sets the exit status.

        When this process ends by an uncaught exception (rank 0's own code failed, after ``fit`` say),
        the others cannot finish a stage without it: they get :data:`STUCK_SECONDS` to end, then are
        ended, instead of waiting in a collective for the group's timeout.
        """
        deadline = time.monotonic() + STUCK_SECONDS if ending_by_error() else None
        try:
            while any(proc.poll() is None for proc in self.procs):
                if deadline is not None and time.monotonic() > deadline:
                    self.stopping = True  # this process failed: their end is not theirs to report
                    self._kill_others()
                    deadline = None
                time.sleep(0.05)
        except BaseException:  # a second Ctrl-C while waiting: end them
            self._kill_others()
        failed = None if self.stopping else self._first_failed()
        message = None if failed is None else self.describe(*failed)  # read before the work folder goes
        self.forwarder.restore()
        self._remove_workdir()
        if failed is not None:
            code = failed[1]
            end_now(f"WorkerFailedError: {message}", code if code > 0 else 1)


class _RankEnded(RuntimeError):
    """A rank this process started ended before it joined the group (see :meth:`RankLauncher.check_joining`)."""


def _job_key() -> str | None:
    """Which Hydra job this process runs now (its run directory), else None."""
    hydra = hydra_config()
    return str(hydra.runtime.output_dir) if hydra is not None else None
