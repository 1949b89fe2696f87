"""Run the ``geartrain`` command of this checkout in a subprocess, the way a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO_ROOT


def run_geartrain(
    *args: str, cwd: Path, timeout: float = 240, env: dict[str, str] | None = None, module: str = "trainer"
) -> subprocess.CompletedProcess[str]:
    """``python -m trainer ARGS`` in ``cwd`` with this checkout first on the path; output captured."""
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), child_env.get("PYTHONPATH", "")]))
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_dirs(base: Path, pattern: str = "outputs/*/*") -> list[Path]:
    """Hydra run directories (those holding ``.hydra/``) under ``base``."""
    return sorted(p for p in base.glob(pattern) if (p / ".hydra").is_dir())
