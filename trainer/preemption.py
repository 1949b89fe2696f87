"""Preemption: signals noted, ranks agreeing on when to stop, the checkpoint, the requeue.

On SIGTERM, SIGUSR1 or SIGINT (a Ctrl-C; a second one stops at once in one process) and, under several
processes, SIGHUP (a closed terminal must not stop one rank in the middle of a collective) the handler
only notes the signal. After every optimizer step the training loop tests whether one was noted (in
one process) or whether this is the step the ranks agreed on (:attr:`Preemption.next_check`, under
several), and then asks :meth:`Preemption.requested`: under several processes a small all-reduce, so
that every rank stops after the same step. The trainer then saves ``last.ckpt`` where
``ckpt_path="last"`` finds it, asks Slurm to requeue the job on SIGUSR1, and stops.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.common.errors import Preempted

if TYPE_CHECKING:
    from strategies.base import Strategy
    from trainer.trainer import Trainer

__all__ = ["PREEMPT_CHECK_MAX_STEPS", "PREEMPT_CHECK_SECONDS", "Preempted", "Preemption"]

#: Under several processes, about how often (in seconds) ranks agree on whether a preemption signal
#: arrived: a signal stops training about this long after it came (or after the next step, for
#: slower steps), at the same step on every rank.
PREEMPT_CHECK_SECONDS = 0.5
#: ... and at least every this many optimizer steps.
PREEMPT_CHECK_MAX_STEPS = 1000


class Preemption:
    """What a run does on SIGTERM/SIGUSR1 (see the module docstring).

    Args:
        exit_code: the process exits with this code after the checkpoint; ``None`` returns from
            ``fit`` instead (``trainer.preempted`` tells).
        slurm_requeue: on SIGUSR1 under Slurm, ask Slurm to requeue the job after saving.
    """

    def __init__(self, exit_code: int | None, slurm_requeue: bool) -> None:
        self.exit_code = exit_code
        self.slurm_requeue = slurm_requeue
        #: True once a run stopped for a preemption.
        self.preempted = False
        #: The signal noted (on any rank, once ranks agreed), else None.
        self.signal: int | None = None
        # Set per fit: whether ranks must agree (one collective per agreement).
        self.agree = False
        #: Under several processes: the global step of the next agreement.
        self.next_check = 0
        self._checked_at: tuple[float, int] | None = None  # (time, global step) of the last agreement
        self._strategy: Strategy | None = None
        self._previous: dict[int, Any] = {}
        #: The signal that asks for a requeue (``SLURMEnvironment(requeue_signal=...)``; SIGUSR1 by default).
        self.requeue_signal: int | None = getattr(signal, "SIGUSR1", None)

    def use_slurm_environment(self, env: Any) -> None:
        """Take a ``SLURMEnvironment`` plugin's ``auto_requeue`` and ``requeue_signal`` (Lightning's settings)."""
        self.slurm_requeue = bool(env.auto_requeue)
        if env.requeue_signal is not None:
            self.requeue_signal = int(env.requeue_signal)

    def install(self, strategy: Strategy) -> None:
        """Note SIGTERM/SIGUSR1 from now on (only the main thread may set handlers)."""
        self._strategy = strategy
        self._previous = {}
        # Worked out once: in one process the loop's per-step check is a plain attribute test.
        self.agree = strategy.world_size > 1
        self.next_check = 0
        self._checked_at = None
        if threading.current_thread() is not threading.main_thread():
            return

        def note(signum: int, frame: Any) -> None:
            if signum == signal.SIGINT and self.signal == signal.SIGINT and not self.agree:
                raise KeyboardInterrupt  # a second Ctrl-C in one process: stop now, unsaved
            self.signal = self.signal or signum  # the first one decides (a requeue is for SIGUSR1 alone)
            # The process that started the other ranks passes the signal on to them (strategies.relaunch).
            pass_on = getattr(getattr(self._previous.get(signum), "__self__", None), "pass_on", None)
            if pass_on is not None:
                pass_on(signum)

        # A Ctrl-C is noted too: the run stops after the step, saves and says how to resume. Under
        # several processes it must not stop one rank in the middle of a collective.
        names = ("SIGTERM", "SIGUSR1", "SIGINT", "SIGHUP") if self.agree else ("SIGTERM", "SIGUSR1", "SIGINT")
        signals = [getattr(signal, name) for name in names if hasattr(signal, name)]
        if self.requeue_signal is not None and self.requeue_signal not in signals:
            signals.append(self.requeue_signal)
        for sig in signals:
            self._previous[sig] = signal.signal(sig, note)

    def restore(self) -> None:
        """Put back the signal handlers :meth:`install` replaced."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def requested(self, global_step: int) -> bool:
        """True when a signal arrived here or (under several processes) on any rank, on every rank alike."""
        if not self.agree:
            return self.signal is not None
        assert self._strategy is not None
        # The same all-reduce agrees on the next check: each rank proposes as many steps as it ran in
        # PREEMPT_CHECK_SECONDS since the last agreement, and the largest proposal wins.
        now = time.monotonic()
        proposal = 1  # the first agreement of a run (fresh or resumed) comes before any measurement
        if self._checked_at is not None:
            last_time, last_step = self._checked_at
            rate = (global_step - last_step) / max(now - last_time, 1e-6)
            proposal = min(max(int(rate * PREEMPT_CHECK_SECONDS), 1), PREEMPT_CHECK_MAX_STEPS)
        flag = torch.tensor([self.signal or 0, proposal], dtype=torch.int64, device=self._strategy.root_device)
        signal_any, interval = (int(v) for v in self._strategy.reduce(flag, "max").tolist())
        self.signal = signal_any or None
        self._checked_at = (now, global_step)
        self.next_check = global_step + interval
        return self.signal is not None

    def requeue(self, is_global_zero: bool) -> None:
        """After the checkpoint: on SIGUSR1 under Slurm, ``scontrol requeue`` the job (rank 0)."""
        job = os.environ.get("SLURM_JOB_ID")
        if self.slurm_requeue and job and self.signal == self.requeue_signal and is_global_zero:
            result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, check=False)
            if result.returncode != 0:
                warnings.warn(f"scontrol requeue {job} failed: {result.stderr.strip()}", stacklevel=2)

    def exit_status(self, trainer: Trainer) -> int:
        """The exit code after a stop for a signal; a Ctrl-C (rank 0) also says where it stopped, and gives 130."""
        if self.signal != signal.SIGINT:
            assert self.exit_code is not None
            return self.exit_code
        if trainer.is_global_zero:
            print(self.interrupted_line(trainer), file=sys.stderr, flush=True)
        return 128 + signal.SIGINT

    @staticmethod
    def interrupted_line(trainer: Trainer) -> str:
        """The one line a run stopped by Ctrl-C ends with: where it stopped and how to resume."""
        saved = trainer.checkpointing.saved_last or trainer.checkpointing.last_path()
        return f"interrupted at step {trainer.global_step}, saved {saved}, resume with ckpt_path=last"

    @staticmethod
    def newest_checkpoint(trainer: Trainer) -> str:
        """Which checkpoint a run stopped before saving can resume from, said for an error message."""
        folder = trainer.checkpointing.last_path().parent
        found = [p for p in Path(folder).glob("*.ckpt") if p.is_file()] if Path(folder).is_dir() else []
        if not found:
            return f"no checkpoint was saved in {folder}"
        newest = max(found, key=lambda p: p.stat().st_mtime)
        return f"the newest checkpoint is {newest}: resume with ckpt_path={str(newest)!r}"
