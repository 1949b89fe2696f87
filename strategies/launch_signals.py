"""Signals to the in-process launcher: passed on to the workers it started, who get a grace period to save.

Under ``torchrun`` or ``srun`` every training process gets the scheduler's signal itself. When a
strategy starts its own workers (:func:`strategies.launch.start_processes`), the scheduler, a
terminal's Ctrl-C or ``kill`` may reach only the launcher. :class:`SignalForwarder` takes SIGTERM,
SIGINT, SIGHUP and SIGUSR1 there and sends each to every worker (the trainer in each notes it,
finishes its step, the ranks agree where to stop, save ``last.ckpt`` and return), and starts the
grace period: workers still running at its end (a step longer than the grace period, or a second
Ctrl-C) are killed, and the launcher reports that nothing newer than the last checkpoint was saved.

Each worker writes its process id into the launch's work folder first thing (:func:`note_worker_pid`);
the launcher reads them when a signal comes, so a worker that starts later is not missed for a
signal that comes later.

Under ``strategy="ddp"`` the caller is rank 0 and its forwarder (:class:`RankZeroForwarder`) passes
signals on to the ranks it started (:mod:`strategies.relaunch`), except a terminal's Ctrl-C, which
reached them itself: they share the caller's process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from strategies.rank_process import end_now
from trainer.common.errors import Interrupted

if TYPE_CHECKING:
    from strategies.relaunch import RankLauncher

__all__ = ["FORWARDED_SIGNALS", "RankZeroForwarder", "SignalForwarder", "note_worker_pid"]

#: The signals the launcher passes on: a scheduler's stop and warning, Ctrl-C, a closed terminal.
FORWARDED_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1") if hasattr(signal, name)
)

_PID_SUFFIX = ".pid"


def note_worker_pid(workdir: str) -> None:
    """Record this worker's process id in ``workdir`` (called first thing in every started worker)."""
    path = os.path.join(workdir, f"worker-{os.getpid()}{_PID_SUFFIX}")
    with open(path, "w") as f:
        f.write(str(os.getpid()))


def _is_child(pid: int) -> bool:
    """Whether ``pid`` is a live child of this process (Linux's ``/proc``; elsewhere: assumed)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")
    except OSError:
        return False
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its last ")".
    return int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid()


class SignalForwarder:
    """The launcher's handler for :data:`FORWARDED_SIGNALS` while its workers run.

    Args:
        workdir: the launch's work folder, where workers note their process ids.
        grace_period: seconds after the first signal before workers still running are killed.
    """

    def __init__(self, workdir: str, grace_period: float) -> None:
        if not grace_period >= 0:
            raise ValueError(f"preemption_grace_period must be >= 0 seconds, got {grace_period!r}")
        self.workdir = workdir
        self.grace_period = float(grace_period)
        #: The first signal received, else None.
        self.signal: signal.Signals | None = None
        #: True once workers were killed (grace period over, or a second Ctrl-C).
        self.killed = False
        #: True when a second Ctrl-C killed them (not the grace period's end).
        self.second_signal = False
        self._timer: threading.Timer | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Take the signals (only the main thread may set handlers; elsewhere this does nothing)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in FORWARDED_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        """Put the previous handlers back and stop the grace period's timer."""
        if self._timer is not None:
            self._timer.cancel()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def explain(self) -> str:
        """Why the workers ended, for the launcher's error."""
        assert self.signal is not None
        name = self.signal.name
        if self.killed and self.second_signal:
            return (
                f"the launcher received {name} twice; the second one stopped the workers before they had saved, "
                "and the step in progress was lost"
            )
        if self.killed:
            return (
                f"the launcher received {name}; the workers had not saved and exited within the grace period "
                f"({self.grace_period:g} s, the strategy's preemption_grace_period), so they were killed and the "
                "step in progress was lost"
            )
        return f"the launcher received {name}; the workers stopped before they could save a checkpoint"

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self.signal is not None and sig == signal.SIGINT:  # a second Ctrl-C: stop now
            self.second_signal = not self.killed
            self._kill()
            return
        if self.signal is None:
            self.signal = sig
            self._timer = threading.Timer(self.grace_period, self._kill)
            self._timer.daemon = True
            self._timer.start()
        self._send(sig)

    def _pids(self) -> list[int]:
        pids = []
        try:
            names = os.listdir(self.workdir)
        except OSError:
            return []
        for name in names:
            if name.startswith("worker-") and name.endswith(_PID_SUFFIX):
                pid = int(name[len("worker-") : -len(_PID_SUFFIX)])
                if _is_child(pid):  # a worker of an earlier attempt is gone, and its id may be reused
                    pids.append(pid)
        return pids

    def _send(self, sig: int) -> None:
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):  # exited already
                os.kill(pid, sig)

    def _kill(self) -> None:
        self.killed = True
        self._send(signal.SIGKILL)


class RankZeroForwarder(SignalForwarder):
    """Signals that reach rank 0 are passed on to the ranks it started.

    During ``fit`` the trainer notes the signal and calls :meth:`pass_on`: the ranks agree on a step,
    save and return. Outside ``fit`` (or when the grace period ran out) the signal ends the stage here
    with :class:`~trainer.common.errors.Interrupted`.
    """

    def __init__(self, launcher: RankLauncher, grace_period: float, stuck_seconds: float) -> None:
        super().__init__(launcher.workdir, grace_period)
        self.launcher = launcher
        self.stuck_seconds = stuck_seconds

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
            time.sleep(self.stuck_seconds)
            if self.launcher._stages > 0:
                self.launcher._remove_workdir()
                end_now(f"Interrupted: {self.explain()}", 128 + int(self.signal or signal.SIGTERM))

        threading.Thread(target=stuck, daemon=True).start()

    def _send(self, sig: int) -> None:
        if sig == signal.SIGINT and _terminal_reached_them():
            return  # the terminal's Ctrl-C reached every rank of this process's group itself
        super()._send(sig)

    def explain(self) -> str:
        assert self.signal is not None
        if self.killed and self.second_signal:
            return (
                f"the launcher received {self.signal.name} twice; the second one stopped the ranks before they "
                "had saved, and the step in progress was lost"
            )
        if self.killed:
            return (
                f"the launcher received {self.signal.name}; the ranks had not saved and exited within the grace "
                f"period ({self.grace_period:g} s, the strategy's preemption_grace_period), so they were stopped "
                "and the step in progress was lost"
            )
        return f"the launcher received {self.signal.name}"


def _terminal_reached_them() -> bool:
    """Whether this process's group (its ranks' too) is its terminal's foreground: a Ctrl-C there reached all."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:  # no terminal: the signal came from a kill, to this process alone
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)
