"""Process launch: join processes that already exist, or start them.

There is one launch model (docs/architecture.md, "Processes"): every rank runs the user's script.

* Under ``torchrun`` (``TORCHELASTIC_RUN_ID`` is set), Slurm (``srun`` with ``SLURM_NTASKS > 1``) or
  in a rank that ``strategy="ddp"`` started (:mod:`strategies.relaunch`) the processes already run
  the script; each one reads its rank from the environment and joins the process group.
* ``strategy="ddp"`` (``start_method="popen"``) makes the caller rank 0 and runs the script again for
  the other ranks (:mod:`strategies.relaunch`): nothing is pickled.
* ``ddp_spawn`` and ``ddp_fork``/``ddp_notebook`` (and ``max_restarts`` > 0) use
  :func:`start_processes`: ``torch.distributed.launcher.api.elastic_launch`` (the engine behind
  ``torchrun``) runs a function in new processes. With ``spawn`` the function and its arguments (the
  trainer, the module, the dataloaders) are pickled and handed over, and the caller's main module is
  imported again in every worker (keep top-level code under ``if __name__ == "__main__":``); with
  ``fork`` the workers are copies of the caller, so classes defined in a notebook or in ``python -``
  work (fork only before CUDA is initialised). Rank 0's return value comes back to the caller.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import logging
import os
import pickle
import re
import shutil
import signal
import sys
import tempfile
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

from strategies.launch_signals import SignalForwarder, note_worker_pid
from strategies.relaunch import RERUN
from trainer.common.env import STARTED_BY_LAUNCHER
from trainer.common.errors import Interrupted, UserError
from trainer.common.rng import rng_state, set_rng_state

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "WorkerFailedError",
    "check_slurm_launched",
    "joined_environment",
    "slurm_environment",
    "start_processes",
]

#: Seconds the processes a strategy started get, after a signal, to finish their step, save and exit.
DEFAULT_GRACE_PERIOD = 30.0


class WorkerFailedError(RuntimeError):
    """A training process raised; the message holds its rank and its traceback.

    ``rank`` and ``cause`` (``"ExceptionType: message"``, as the failing worker recorded it) let the
    caller tell a user's mistake raised in a worker (a checkpoint that does not fit) from a crash.
    """

    def __init__(self, message: str, rank: int | None = None, cause: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.cause = cause


def slurm_environment(env: dict[str, str] | None = None) -> dict[str, str] | None:
    """The torch.distributed variables (RANK, WORLD_SIZE, ...) for a task started by ``srun``.

    Returns None unless this process is one of several Slurm tasks. MASTER_ADDR is the first host of
    ``SLURM_NODELIST``; MASTER_PORT is kept if set, else derived from the job id so every task agrees.

    >>> slurm_environment({"SLURM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
    ...                    "SLURM_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "1234"})["MASTER_ADDR"]
    'gpu07'
    """
    env = dict(os.environ) if env is None else env
    if int(env.get("SLURM_NTASKS", "1")) <= 1 or "SLURM_PROCID" not in env:
        return None
    nodelist = env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
    port = env.get("MASTER_PORT") or str(15000 + int(re.sub(r"\D", "", env.get("SLURM_JOB_ID", "0")) or 0) % 20000)
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env["SLURM_NTASKS"],
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "MASTER_ADDR": env.get("MASTER_ADDR") or first_host(nodelist),
        "MASTER_PORT": port,
    }


def first_host(nodelist: str) -> str:
    """The first host name of a Slurm node list such as ``"gpu[07-08,11],cpu01"``.

    >>> first_host("gpu[07-08,11],cpu01")
    'gpu07'
    >>> first_host("node1,node2")
    'node1'
    """
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if match is None:
        return nodelist
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    return prefix + re.split(r"[-,]", ranges)[0]


def check_slurm_launched(env: dict[str, str] | None = None) -> None:
    """Refuse Slurm's task variables in a process that ``srun`` did not start; it would wait for peers forever.

    An ``sbatch --ntasks=2`` batch script has ``SLURM_NTASKS=2`` and ``SLURM_PROCID=0`` in its own
    environment, but it is one process: the other task exists only once ``srun`` starts the step.
    ``srun`` sets ``SLURM_STEP_ID`` (``SLURM_STEPID`` in older releases); the batch shell does not.

    >>> check_slurm_launched({"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_STEP_ID": "0"})
    >>> check_slurm_launched({"SLURM_NTASKS": "2", "SLURM_PROCID": "0"})
    Traceback (most recent call last):
    ...
    trainer.common.errors.UserError: SLURM_NTASKS=2 ...
    """
    env = dict(os.environ) if env is None else env
    if slurm_environment(env) is None or "SLURM_STEP_ID" in env or "SLURM_STEPID" in env:
        return
    raise UserError(
        f"SLURM_NTASKS={env['SLURM_NTASKS']} and SLURM_PROCID={env['SLURM_PROCID']} are set, but this process "
        "was not started by srun (no SLURM_STEP_ID), so the other tasks do not exist and joining them would "
        "wait forever. Start the script with `srun python train.py ...` in the batch script, or, to run "
        "one process here, unset the SLURM_* variables or set SLURM_NTASKS=1"
    )


def joined_environment() -> bool:
    """True when this process is one of several that torchrun, Slurm or a ``ddp`` caller already started.

    Under Slurm this also sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (when not
    already set) so ``torch.distributed``'s ``env://`` initialisation finds them.
    """
    if "TORCHELASTIC_RUN_ID" in os.environ or (RERUN in os.environ and "RANK" in os.environ):
        return True
    slurm = slurm_environment()
    if slurm is None:
        return False
    for key, value in slurm.items():
        os.environ.setdefault(key, value)
    return True


#: The task of a forked launch: the workers inherit it in memory (key: the payload path).
_FORKED_TASKS: dict[str, tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Callable[..., str] | None]] = {}


def start_processes(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    nprocs: int,
    max_restarts: int = 0,
    start_method: str = "spawn",
    grace_period: float = DEFAULT_GRACE_PERIOD,
) -> Any:
    """Run ``fn(*args)`` in ``nprocs`` new local processes; return rank 0's result.

    SIGTERM, SIGINT, SIGHUP and SIGUSR1 sent to this process (or to its whole process group) are
    passed on to the workers, which finish their step, agree on where to stop, save ``last.ckpt``
    and return (their trainer notes these signals): the result then says the run was preempted.
    Workers that have not returned ``grace_period`` seconds after the first signal (a step slower
    than that, or a second Ctrl-C) are killed, and :class:`~trainer.common.errors.Interrupted`
    is raised: nothing newer than the last complete checkpoint was saved.

    With ``max_restarts`` > 0 a failing worker makes the elastic agent restart the whole group (up
    to that many times); the restarted workers see ``TORCHELASTIC_RESTART_COUNT`` > 0 and the trainer
    resumes from the last checkpoint.

    ``fn`` and ``args`` are pickled here with the standard pickler (so every worker gets its own copy
    of each tensor rather than shared memory that the ranks would all write to), and rank 0's result
    comes back as bytes written by ``torch.save``. If any worker raises, the elastic agent stops the
    others and :class:`WorkerFailedError` carries the failing rank's traceback.

    With ``start_method="fork"`` the task is not pickled: the forked workers find it in this
    process's memory (copied on write, so each worker still has its own tensors).
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # The task goes through a file, not the spawn pipe: a worker that dies while reading a large
    # pipe payload can leave the parent blocked on the write.
    workdir = tempfile.mkdtemp(prefix="geartrain-launch-")
    payload = os.path.join(workdir, "task.pkl")
    if start_method not in ("spawn", "fork"):
        raise ValueError(f"start_method must be 'spawn' or 'fork', got {start_method!r}")
    if start_method == "fork" and torch.cuda.is_initialized():
        raise RuntimeError(
            "Cannot fork training processes: CUDA is already initialised in this process (a forked child "
            "cannot use it). Use strategy='ddp' (spawn), or do not touch CUDA before trainer.fit"
        )
    # The caller's random state travels too: every worker starts where the caller stands, as
    # every rank of a torchrun job does after the same seed_everything() and the same set-up.
    if start_method == "fork":
        _FORKED_TASKS[payload] = (fn, args, rng_state(), None)
    else:
        with open(payload, "wb") as f:
            pickle.dump((fn, args, rng_state(), _warning_format()), f, protocol=pickle.HIGHEST_PROTOCOL)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nprocs,
        run_id=f"geartrain-{os.getpid()}",
        # Port 0: the rendezvous store binds a free port itself, so concurrent jobs never collide.
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=max_restarts,
        monitor_interval=0.1,
        start_method=start_method,
    )
    # After a worker failed, the agent gives the others this long to exit after SIGTERM, then SIGKILL.
    config.shutdown_timeout = 5
    saved = {key: os.environ.get(key) for key in ("TORCHELASTIC_SIGNALS_TO_HANDLE", "OMP_NUM_THREADS")}
    # Workers inherit this environment. Without a thread limit each one starts an OpenMP pool as big
    # as the machine, and N pools spinning on the same cores make CPU steps many times slower.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nprocs)))
    # The agent would turn these signals into an exception that stops watching the workers and kills
    # them a few seconds later, saved or not; the forwarder passes them on and keeps the agent waiting.
    # The agent keeps SIGQUIT: a hard stop. (It writes this setting into the environment: restored below.)
    config.signals_to_handle = "SIGQUIT"
    forwarder = SignalForwarder(workdir, grace_period)
    forwarder.install()
    # The agent logs a failed worker's traceback, then raises it in ChildFailedError, which
    # WorkerFailedError carries: one copy is enough, and the caller decides how to show it.
    agent_log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    agent_level = agent_log.level
    agent_log.setLevel(logging.CRITICAL)
    try:
        results = elastic_launch(config, _worker)(payload)
    except SignalException as exc:  # SIGQUIT: the agent stopped the workers at once
        raise Interrupted(f"the launcher received {exc.sigval.name}; the workers were stopped", exc.sigval) from None
    except ChildFailedError as exc:
        if forwarder.signal is not None:  # the workers died of the signal, or of the grace period's end
            # How they ended matters only when they were not killed for the grace period's end.
            raise Interrupted(forwarder.explain() + ("" if forwarder.killed else f":{exc}"), forwarder.signal) from None
        failed = ", ".join(str(rank) for rank in sorted(exc.failures))
        first = min(exc.failures)
        raise WorkerFailedError(
            f"training process(es) of rank {failed} failed:{exc}", first, _recorded_cause(exc.failures[first])
        ) from None
    finally:
        forwarder.restore()
        agent_log.setLevel(agent_level)
        _FORKED_TASKS.pop(payload, None)
        shutil.rmtree(workdir, ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    data = results[0]
    return torch.load(io.BytesIO(data), weights_only=False, map_location="cpu")


def _recorded_cause(failure: Any) -> str:
    """``"ExceptionType: message"`` as the failed worker recorded it in its error file, else ``""``."""
    data = getattr(failure, "error_file_data", None)
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    return message if isinstance(message, str) else ""


def _warning_format() -> Callable[..., str] | None:
    """The caller's ``warnings.formatwarning`` when it is not Python's own and can be pickled: the workers use it too.

    The ``geartrain`` command shows geartrain's warnings in one line (``trainer.cli.trace.short_warnings``);
    a spawned worker would otherwise print them with geartrain's file paths and source lines.
    """
    formatter = warnings.formatwarning
    if formatter is getattr(warnings, "_formatwarning_orig", None):
        return None
    try:
        pickle.dumps(formatter)
    except Exception:  # a closure or lambda of the user's: the workers keep Python's form
        return None
    return formatter


def _worker(payload: str) -> bytes | None:
    """What each started process runs: unpickle ``fn`` and ``args``, call it, send rank 0's result."""
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(_run_payload)(payload)


def _exit_done() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)


def _interrupt_once(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _run_payload(payload: str) -> bytes | None:
    import torch.distributed as dist

    if payload in _FORKED_TASKS:
        fn, args, rng, formatter = _FORKED_TASKS[payload]  # a forked worker has the caller's formatter already
    else:
        with open(payload, "rb") as f:
            fn, args, rng, formatter = pickle.load(f)
    if formatter is not None:
        warnings.formatwarning = formatter
    note_worker_pid(os.path.dirname(payload))  # where the launcher finds this process to pass a signal on
    # A Ctrl-C reaches a worker twice (from the terminal and from the launcher): the second copy must not
    # interrupt the handling of the first. (During fit the trainer notes SIGINT instead.)
    signal.signal(signal.SIGINT, _interrupt_once)
    set_rng_state(rng)
    os.environ[STARTED_BY_LAUNCHER] = "1"  # the trainer then returns its full weights to the caller
    # On an exception the group is left as it is: the agent stops every worker, and a clean shutdown
    # could wait on peers that are blocked in a collective.
    try:
        result = fn(*args)
    except KeyboardInterrupt:
        # torch.multiprocessing takes a KeyboardInterrupt in a worker for its parent's doing: the worker
        # exits 0 with no result, and the agent would wait for that result forever. Fail instead.
        raise RuntimeError("interrupted by SIGINT outside of training (no checkpoint to save)") from None
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    # The work is done: from here the worker only hands its result over and exits 0. Its interpreter's
    # finalization could abort it (see trainer.cli.command.leave_group_process: a gloo thread still releasing a
    # collective's tensors), which the agent would report as a failed run; the first exit handler ends
    # the process before that.
    atexit.register(_exit_done)
    if int(os.environ.get("RANK", "0")) != 0:
        return None
    buffer = io.BytesIO()
    torch.save(result, buffer)
    return buffer.getvalue()
