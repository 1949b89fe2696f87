"""ruff (lint and format) and mypy, as ``make lint`` runs them, are tests of the suite.

So ``make test`` runs them beside the other tests: ``tests/conftest.py`` collects this file first, and
mypy's run without a cache (a fresh clone has none) overlaps the rest of the suite instead of
preceding it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT

#: What ``make lint`` runs, each with the configuration in pyproject.toml.
LINTERS = {
    "ruff check": ["ruff", "check", "."],
    "ruff format": ["ruff", "format", "--check", "."],
    "mypy": ["mypy"],
}


@pytest.mark.parametrize("linter", list(LINTERS))
def test_the_code_passes(linter: str) -> None:
    command = [sys.executable, "-m", *LINTERS[linter]]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, f"{linter} found problems:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
