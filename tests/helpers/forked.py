"""Start a job's ``main(argv)`` in a new process forked from the test process, as a script would run.

A script started with ``python job.py`` pays for importing torch and this project before its first
line runs. A test that starts the same one-process job many times (kill it at a point, resume it,
kill it again) can fork the test process instead, which imported them already: every run is still
a real process of its own, with its own pid, output pipes, signals, exit status and files, killed
for real by ``SIGKILL``; only the imports are shared.

The job's ``main`` is the script's own function, so what it computes is what the script computes
(on one thread, see :func:`start_forked`). Only for jobs that stay in one process and start no process that re-runs the command (a DDP launcher
re-runs ``sys.argv``, which in a fork is pytest's); those keep ``subprocess``.
"""

from __future__ import annotations

import io
import os
import select
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable
from typing import IO

import torch


class ForkedJob:
    """The part of :class:`subprocess.Popen` the tests use, for a forked ``main(argv)``."""

    def __init__(self, pid: int, stdout: IO[str], stderr: IO[str]) -> None:
        self.pid = pid
        self.stdout: IO[str] | None = stdout
        self.stderr: IO[str] | None = stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit, at most ``timeout`` seconds (then :class:`subprocess.TimeoutExpired`, as Popen)."""
        if self.returncode is None and timeout is not None:
            pidfd = os.pidfd_open(self.pid)  # readable once the process has ended: no polling
            try:
                if not select.select([pidfd], [], [], timeout)[0]:
                    raise subprocess.TimeoutExpired(f"forked job {self.pid}", timeout)
            finally:
                os.close(pidfd)
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Read both pipes to their end, then wait up to ``timeout`` for the exit; stderr is read on a
        thread so neither pipe fills up."""
        import threading

        assert self.stdout is not None and self.stderr is not None
        err: list[str] = []
        reader = threading.Thread(target=lambda: err.append(self.stderr.read() if self.stderr else ""))
        reader.start()
        out = self.stdout.read()
        reader.join()
        self.wait(timeout)
        return out, err[0]


def start_forked(
    main: Callable[[list[str]], object], argv: list[str], *, env: dict[str, str] | None = None
) -> ForkedJob:
    """Fork, and in the child run ``main(argv)`` with stdout and stderr on pipes; exit with its status.

    ``env``: variables set in the child's ``os.environ`` (and so in every process it starts).
    """
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.environ.update(env or {})
            os.close(out_r)
            os.close(err_r)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), line_buffering=True)
            sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), line_buffering=True)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            # OpenMP's thread pool does not survive a fork of a process that used it: one thread, as a
            # DataLoader worker does (the jobs forked here ask for one thread themselves anyway).
            torch.set_num_threads(1)
            main(argv)
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    os.close(out_w)
    os.close(err_w)
    return ForkedJob(pid, os.fdopen(out_r, "r"), os.fdopen(err_r, "r"))
