"""Helpers for real multi-process tests on CPU: spawn ranks over gloo, run scripts, clean up.

``spawn(fn, world_size)`` runs ``fn(*args)`` in ``world_size`` fresh processes started by PyTorch's
elastic launcher (as torchrun would: RANK, WORLD_SIZE, MASTER_ADDR/PORT and TORCHELASTIC_RUN_ID are
set, so strategies join them) and returns one result per rank. ``fn`` must be importable by name
(defined at module level in an importable module).

The ranks are forked from a multiprocessing fork server that imported torch and this project once
per test session (:data:`PRELOAD`), instead of each rank starting a new interpreter and importing
torch again: process start-up is paid once, while every call still gets new processes and a new
process group. Each rank takes the caller's environment of the moment, as a spawned one would.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.helpers import REPO_ROOT


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: Modules the fork server imports before it forks any rank (the ranks' jobs import the rest).
#: ``torch._dynamo``: imported by the first ``optimizer.step()``, otherwise again in every rank.
PRELOAD = [
    "torch",
    "torch._dynamo",
    "torch.distributed",
    "torchmetrics",
    "trainer",
    "strategies",
    "callbacks",
    "tests.helpers.jobs",
]

#: Variables the elastic launcher sets for each rank; every other variable comes from the caller.
_LAUNCHER_KEYS = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
     "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
     "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
)  # fmt: skip


def spawn(fn: Callable[..., Any], *args: Any, world_size: int = 2) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` ranks; return their results in rank order."""
    import multiprocessing

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # Takes effect when the fork server starts, at the first call of the session; later calls reuse it.
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=world_size,
        run_id=f"test-{os.getpid()}",
        rdzv_backend="c10d",
        # Port 0: the rendezvous store binds a free port itself (no race with other test workers).
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="forkserver",
    )
    with restored_environment():
        results = elastic_launch(config, _rank_main)(pickle.dumps((fn, args, dict(os.environ))))
    return [pickle.loads(results[rank]) for rank in range(world_size)]


def _rank_main(payload: bytes) -> bytes:
    fn, args, environ = pickle.loads(payload)
    # A forked rank holds the fork server's environment, set when the session's first call started
    # it: take the caller's instead, keeping what the launcher set for this rank.
    ours = {k: v for k, v in os.environ.items() if k in _LAUNCHER_KEYS or k.startswith("TORCHELASTIC_")}
    os.environ.clear()
    os.environ.update({k: v for k, v in environ.items() if k not in _LAUNCHER_KEYS}, **ours)
    return pickle.dumps(fn(*args))


@contextlib.contextmanager
def restored_environment() -> Iterator[None]:
    """Put ``os.environ`` back as it was and destroy any process group created inside."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(saved)


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a subprocess that must import this checkout (not an installed copy)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "SLURM_"))}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


class Finished(subprocess.CompletedProcess[str]):
    """A finished ``python`` run; ``leftovers`` lists processes of its group still alive at its exit."""

    leftovers: list[int]


def run_python(args: Sequence[str], timeout: float, **env: str) -> Finished:
    """Run ``python args...`` from the repository root in a new process group.

    The process is forked from :mod:`tests.helpers.command_server` (torch and Hydra imported once).
    When it exits, every process still in its group is recorded in ``leftovers`` and then killed, so
    no worker survives a test, even one that failed or timed out.
    """
    from tests.helpers.command_server import start

    proc = start(list(args), REPO_ROOT, child_env(**env), new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"python {' '.join(args)} ran over {timeout}s\n{out}\n{err}") from None
    # A helper of the run (multiprocessing's resource tracker, a worker finishing its exit) may
    # still be on its way out when the main process has gone; only what outlives a grace period
    # counts as left over.
    deadline = time.monotonic() + 5
    while (leftovers := group_members(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    result = Finished(proc.args, proc.wait(), out, err or "")
    result.leftovers = leftovers
    return result


def _live_with(field: int, value: int) -> list[int]:
    """Live (non-zombie) processes whose ``/proc/<pid>/stat`` field ``field`` (after the name) is ``value``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[field]) == value:
            members.append(int(stat.parent.name))
    return members


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    return _live_with(2, pgid)


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid``, whatever their process group.

    The ranks ``strategy="ddp"`` starts get process groups of their own (a terminal's Ctrl-C reaches
    rank 0 alone), so :func:`group_members` does not see them; they stay in the caller's session.
    """
    return _live_with(3, sid)


def run_in_session(
    command: Sequence[str], cwd: Path, env: dict[str, str], timeout: float, fresh: bool = False
) -> Finished:
    """Run ``command`` in a session of its own; ``leftovers`` lists its processes alive 5 s after it exited.

    Whatever is left (or everything, when it runs over ``timeout``) is killed, so no rank outlives a test.
    ``fresh``: a ``python`` command starts a new interpreter instead of a fork of the command server, whose
    processes end without the interpreter's finalization (for tests of what a process does as it ends).
    """

    def kill_session(sid: int) -> None:
        for pid in session_members(sid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    from tests.helpers.command_server import Started, start

    proc: Started
    # ``python ...``: forked from the command server, in a session of its own
    if command[0] == sys.executable and not fresh:
        proc = start(list(command[1:]), cwd, env, new_session=True)
    else:
        proc = subprocess.Popen(
            list(command), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        out, err = proc.communicate()
        raise AssertionError(f"{' '.join(command)} ran over {timeout}s\n{out[-3000:]}\n{err[-3000:]}") from None
    deadline = time.monotonic() + 5
    while (leftovers := session_members(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    kill_session(proc.pid)
    result = Finished(proc.args, proc.wait(), out, err or "")
    result.leftovers = leftovers
    return result
