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
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from strategies.launch_signals import SignalForwarder
from strategies.rank_process import ERROR_FILE, PARENT, end_now, ended_file, record_errors
from strategies.rerun_command import check_rerunnable, hydra_config, rerun_command
from trainer.common.errors import CheckpointError, Interrupted, UserError

__all__ = [
    "RERUN",
    "RankLauncher",
    "check_rerunnable",
    "current_launcher",
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
        _current.finish()
        _current = None
    return _current


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
        self.workdir = tempfile.mkdtemp(prefix="geartrain-ranks-")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.forwarder = _RankZeroForwarder(self, grace_period)
        #: The first rank that failed on its own: (rank, exit code), else None.
        self.failure: tuple[int, int] | None = None
        self.stopping = False  # the caller is ending the ranks itself: their exits are not failures
        self.job = _job_key()
        self._stages = 0  # stages (fit, test, ...) running now in this process
        self._saved_env: dict[str, str | None] = {}

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
        for rank in range(1, self.nprocs):
            command, cwd = rerun_command(rank)
            child = {**os.environ, **env, "RANK": str(rank), "LOCAL_RANK": str(rank), PARENT: str(os.getpid())}
            child[ERROR_FILE] = os.path.join(self.workdir, f"rank-{rank}.err")
            self.procs.append(
                subprocess.Popen(
                    command,
                    env=child,
                    cwd=cwd,
                    # Their own process group: a terminal's Ctrl-C reaches this process alone, which
                    # passes it on once (see _RankZeroForwarder). They die with this process (join_group).
                    process_group=0,
                )
            )
        for key, value in {**env, "RANK": "0", "LOCAL_RANK": "0"}.items():
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value
        self.forwarder.install()
        record_errors()  # an exception that ends this process ends it at once (see there)
        threading.Thread(target=self._watch, name="geartrain-rank-watch", daemon=True).start()
        atexit.register(self.wait_at_exit)

    # ----------------------------------------------------------------- one stage
    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` here as rank 0; a failure of another rank becomes its own error here."""
        from strategies.launch import WorkerFailedError

        self._stages += 1
        try:
            return fn(*args)
        except BaseException as exc:
            failed = self._wait_failure(2.0) if not isinstance(exc, Interrupted) else None
            self.stop()
            if self.forwarder.killed and not isinstance(exc, Interrupted):
                raise Interrupted(self.forwarder.explain(), self.forwarder.signal or signal.SIGTERM) from None
            if failed is not None and not isinstance(exc, (UserError, CheckpointError)):  # else: its own mistake
                rank, code = failed
                raise WorkerFailedError(self.describe(rank, code), rank, self._cause(rank)) from None
            raise
        finally:
            self._stages -= 1

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
                    end_now(f"WorkerFailedError: {self.describe(rank, code)}", 1)
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

    def finish(self) -> None:
        """After the ranks ended: leave the group, put the environment back, remove the work folder."""
        import torch.distributed as dist

        self.stopping = True
        for proc in self.procs:
            proc.wait()
        self.forwarder.restore()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(self.workdir, ignore_errors=True)
        with contextlib.suppress(ValueError):
            atexit.unregister(self.wait_at_exit)

    def wait_at_exit(self) -> None:
        """At this process's exit: wait for the ranks it started; one that failed sets the exit status."""
        try:
            while any(proc.poll() is None for proc in self.procs):
                time.sleep(0.05)
        except BaseException:  # a second Ctrl-C while waiting: end them
            self._kill_others()
        failed = [
            (rank, code)
            for rank, proc in enumerate(self.procs, start=1)
            if (code := self._status(rank, proc.returncode) or 0) != 0
        ]
        self.forwarder.restore()
        shutil.rmtree(self.workdir, ignore_errors=True)
        if failed and not self.stopping and self.forwarder.signal is None:
            rank, code = failed[0]
            end_now(f"WorkerFailedError: {self.describe(rank, code)}", code if code > 0 else 1)


def _job_key() -> str | None:
    """Which Hydra job this process runs now (its run directory), else None."""
    hydra = hydra_config()
    return str(hydra.runtime.output_dir) if hydra is not None else None


class _RankZeroForwarder(SignalForwarder):
    """Signals that reach rank 0 are passed on to the ranks it started.

    During ``fit`` the trainer notes the signal and calls :meth:`pass_on`: the ranks agree on a step,
    save and return. Outside ``fit`` (or when the grace period ran out) the signal ends the stage here
    with :class:`~trainer.common.errors.Interrupted`.
    """

    def __init__(self, launcher: RankLauncher, grace_period: float) -> None:
        super().__init__(launcher.workdir, grace_period)
        self.launcher = launcher

    def _pids(self) -> list[int]:
        return [proc.pid for proc in self.launcher.procs if proc.poll() is None]

    def pass_on(self, signum: int) -> None:
        """Called by the trainer's handler during ``fit``: pass the signal on, start the grace period."""
        super()._on_signal(signum, None)
        if self.killed:
            raise Interrupted(self.explain(), signal.Signals(signum))

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        super()._on_signal(signum, frame)
        sig = signal.Signals(signum)
        raise Interrupted(self.explain() if self.killed else f"the launcher received {sig.name}", sig)

    def _kill(self) -> None:
        first = not self.killed
        super()._kill()
        self.launcher.stopping = True
        if not first or threading.current_thread() is threading.main_thread():
            return
        # This process is a rank too: interrupt its step (a signal wakes a sleeping main thread).
        if self.signal is not None:
            with contextlib.suppress(Exception):
                signal.pthread_kill(threading.main_thread().ident or 0, self.signal)

        def stuck() -> None:
            time.sleep(STUCK_SECONDS)
            if self.launcher._stages > 0:
                end_now(f"Interrupted: {self.explain()}", 128 + int(self.signal or signal.SIGTERM))

        threading.Thread(target=stuck, daemon=True).start()

    def explain(self) -> str:
        assert self.signal is not None
        if self.killed:
            return (
                f"the launcher received {self.signal.name}; the ranks had not saved and exited within the grace "
                f"period ({self.grace_period:g} s, the strategy's preemption_grace_period), so they were stopped "
                "and the step in progress was lost"
            )
        return f"the launcher received {self.signal.name}"
