"""Run the ``geartrain`` command of this checkout in a process of its own, the way a user would.

The commands are forked from :mod:`tests.helpers.command_server`, which imported torch and Hydra
once, instead of each starting a new interpreter (``fresh=True``, or ``GEARTRAIN_TESTS_FRESH=1`` for
every command, starts a new interpreter as a user's shell does).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO_ROOT
from tests.helpers.command_server import Started, run, start
from tests.helpers.distributed import Finished, run_in_session


def run_geartrain(
    *args: str,
    cwd: Path,
    timeout: float = 240,
    env: dict[str, str] | None = None,
    module: str = "trainer",
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``python -m trainer ARGS`` in ``cwd`` with this checkout first on the path; output captured."""
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), child_env.get("PYTHONPATH", "")]))
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    return run(["-m", module, *args], cwd, child_env, timeout, fresh=fresh)


def run_geartrain_watched(*args: str, cwd: Path, timeout: float) -> Finished:
    """:func:`run_geartrain` in a session of its own: ``leftovers`` lists processes it left running (ranks included)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    return run_in_session([sys.executable, "-m", "trainer", *args], cwd=cwd, env=env, timeout=timeout)


def run_dirs(base: Path, pattern: str = "outputs/*/*") -> list[Path]:
    """Hydra run directories (those holding ``.hydra/``) under ``base``."""
    return sorted(p for p in base.glob(pattern) if (p / ".hydra").is_dir())


#: A job of :func:`run_many`: its folder, its ``geartrain`` arguments and its extra environment.
Job = tuple[Path, "list[str] | tuple[str, ...]", "dict[str, str] | None"]


def run_many(jobs: dict[str, Job], *, timeout: float, env: dict[str, str]) -> dict[str, tuple[int, str, Path]]:
    """``python -m trainer ARGS`` for every job at once, each in its own folder; wait for all.

    Returns (exit code, stdout and stderr together, folder) by the job's name. The jobs overlap, so a
    batch costs about its longest job; any still running when this returns by an error are killed.
    """
    running: dict[str, tuple[Started, Path]] = {}
    try:
        for name, (cwd, args, extra) in jobs.items():
            running[name] = (start(["-m", "trainer", *args], cwd, {**env, **(extra or {})}, merge=True), cwd)
        results = {}
        for name, (proc, cwd) in running.items():
            output, _ = proc.communicate(timeout=timeout)
            results[name] = (proc.returncode, output, cwd)
        return results
    finally:
        for proc, _ in running.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
