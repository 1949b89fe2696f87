"""A user's file named like one of geartrain's packages is named in one line, even before geartrain runs.

Before: ``python trainer.py`` with ``from trainer import Trainer`` in it ended in Python's "cannot
import name 'Trainer' from partially initialized module 'trainer' (most likely due to a circular
import)", six lines that never say the file's name is the trouble. The installed
``geartrain-excepthook.pth`` chains ``sys.excepthook`` (``_geartrain_excepthook.py``): Python's
traceback stays whole, and the line naming the file follows it. Programs that never meant geartrain
keep their traceback alone, and the hook runs no file of the user's.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

PTH = "geartrain-excepthook.pth"


def _run(folder: Path, script: str, files: dict[str, str]) -> subprocess.CompletedProcess[str]:
    for name, text in files.items():
        (folder / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    return subprocess.run(
        [sys.executable, script], cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_start_up_line_is_installed() -> None:
    assert any(Path(p, PTH).is_file() for p in site.getsitepackages()), (
        f"{PTH} is missing from this environment's site-packages: reinstall geartrain (make .venv/.installed)"
    )


def _traceback_then(stderr: str, line: str) -> None:
    """``stderr`` is Python's whole traceback, then ``line``."""
    lines = stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):", stderr
    assert lines[-1] == line, stderr
    assert lines[-2].startswith(("ImportError", "AttributeError", "ModuleNotFoundError")), stderr


def _one_line(folder: Path, package: str) -> str:
    """The whole message for ``folder/<package>.py`` hiding geartrain's ``package``."""
    return (
        f"geartrain: {folder / f'{package}.py'} hides geartrain's package {package!r}: rename it "
        f"(e.g. my_{package}.py) and its imports"
    )


@pytest.mark.parametrize(
    "text",
    [
        "from trainer import Trainer\n",
        "import trainer\n\ntrainer.Trainer(max_epochs=1)\n",
        "from trainer.module import TrainModule\n",
    ],
    ids=["from-import", "attribute", "submodule"],
)
def test_a_script_named_trainer_py_is_named_in_one_line(tmp_path: Path, text: str) -> None:
    result = _run(tmp_path, "trainer.py", {"trainer.py": text})
    assert result.returncode == 1
    _traceback_then(result.stderr, _one_line(tmp_path, "trainer"))


def test_a_trainer_py_beside_the_script_is_named_in_one_line(tmp_path: Path) -> None:
    result = _run(tmp_path, "train.py", {"trainer.py": "steps = 10\n", "train.py": "from trainer import Trainer\n"})
    assert result.returncode == 1
    _traceback_then(result.stderr, _one_line(tmp_path, "trainer"))


@pytest.mark.parametrize("name", ["callbacks", "strategies"])
def test_a_script_named_like_the_other_packages_is_named_in_one_line(tmp_path: Path, name: str) -> None:
    result = _run(tmp_path, f"{name}.py", {f"{name}.py": "from trainer import Trainer\n\nTrainer(max_epochs=1)\n"})
    assert result.returncode == 1
    # geartrain's own check found it (trainer.shadowing): its one line ends the traceback, said once.
    assert result.stderr.startswith("Traceback"), result.stderr
    assert result.stderr.splitlines()[-1].endswith(_one_line(tmp_path, name).removeprefix("geartrain: "))
    assert result.stderr.count("hides geartrain's package") == 1


def test_a_trainer_py_of_a_project_not_using_geartrain_keeps_pythons_traceback(tmp_path: Path) -> None:
    # `helper` is no name of geartrain's: the file is the user's own module, and the error is theirs.
    result = _run(tmp_path, "train.py", {"trainer.py": "steps = 10\n", "train.py": "from trainer import helper\n"})
    assert result.returncode == 1
    assert "geartrain" not in result.stderr
    assert result.stderr.startswith("Traceback") and "cannot import name 'helper'" in result.stderr


def test_any_other_error_keeps_its_traceback(tmp_path: Path) -> None:
    result = _run(tmp_path, "train.py", {"train.py": "import trainer\n\nraise AttributeError('mine')\n"})
    assert result.returncode == 1
    assert result.stderr.startswith("Traceback") and result.stderr.rstrip().endswith("AttributeError: mine")


@pytest.mark.parametrize(
    ("name", "text"),
    [("strategies", "from strategies import base\n"), ("callbacks", "import callbacks\n\ncallbacks.progress\n")],
    ids=["strategies-submodule", "callbacks-attribute"],
)
def test_an_unrelated_program_with_its_own_module_of_that_name_keeps_its_traceback_alone(
    tmp_path: Path, name: str, text: str
) -> None:
    # A program that never imports geartrain, whose own strategies.py lacks a name that happens to be a
    # submodule of geartrain's package: its error is its own.
    result = _run(tmp_path, "main.py", {f"{name}.py": "RULES = 1\n", "main.py": text})
    assert result.returncode == 1
    assert "geartrain" not in result.stderr, result.stderr
    assert result.stderr.startswith("Traceback") and result.stderr.rstrip().splitlines()[-1].startswith(
        ("ImportError", "AttributeError")
    )


def test_the_hook_runs_no_file_lying_beside_the_failing_program(tmp_path: Path) -> None:
    # Standard modules a hook might import, each as a file that announces itself if it is ever run.
    shadows = {f"{name}.py": f"print('RAN {name}')\n" for name in ("ast", "re", "pathlib", "types", "typing")}
    for script, text in {"trainer.py": "from trainer import Trainer\n", "main.py": "raise ImportError('x')\n"}.items():
        result = _run(tmp_path, script, {**shadows, script: text})
        assert result.returncode == 1
        assert "RAN" not in result.stdout + result.stderr, result.stdout + result.stderr
    _traceback_then(
        _run(tmp_path, "trainer.py", {"trainer.py": "from trainer import Trainer\n"}).stderr,
        _one_line(tmp_path, "trainer"),
    )
