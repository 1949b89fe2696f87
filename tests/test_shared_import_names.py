"""Another distribution that installs ``trainer`` (or ``callbacks``) where geartrain's is: said in one line.

geartrain's import names are also those of other distributions on the package index (Coqui TTS's
``trainer``, ``callbacks``); installed into one environment, one overwrites the other's files. Each
case builds a stand-in site folder: a package of that name with the other distribution's record
(``<name>-<version>.dist-info``) beside it, first on ``PYTHONPATH``, and runs a geartrain import in a
new interpreter. The line comes from geartrain's own check (``trainer/shadowing.py``) when its
package runs, or from the start-up line's error hook (``_geartrain_excepthook.py``) when the other
distribution's package answers the import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

ADVICE = "install geartrain and {other} in separate environments (python -m venv; README.md, 'Two commands')"


def _site(folder: Path, name: str, files: dict[str, str], version: str = "0.0.36") -> Path:
    """A site folder holding the package ``name`` (``files``) and the record of a distribution ``name``."""
    site = folder / "site"
    for relative, text in files.items():
        (site / name / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / name / relative).write_text(text)
    record = site / f"{name}-{version}.dist-info"
    record.mkdir(parents=True)
    (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (record / "top_level.txt").write_text(f"{name}\n")
    (record / "RECORD").write_text("".join(f"{name}/{relative},,\n" for relative in files))
    return site


#: Imports resolved as in an environment geartrain was installed into from a wheel: by the path only.
#: (This checkout's editable install adds a finder that maps any ``trainer.*`` name to the checkout,
#: which would hide a stand-in ``trainer`` that lacks geartrain's submodules.)
WHEEL_LIKE = "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "


def _run(site: Path, code: str) -> subprocess.CompletedProcess[str]:
    """``python -c CODE`` with ``site`` first on the path, then this checkout (as an installed geartrain)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO_ROOT)])
    return subprocess.run(
        [sys.executable, "-c", WHEEL_LIKE + code], cwd=site.parent, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "code",
    ["from trainer import Trainer, TrainModule", "from callbacks import ModelCheckpoint"],
    ids=["from-trainer", "from-callbacks"],
)
def test_another_distributions_trainer_is_named_in_one_line_after_the_traceback(tmp_path: Path, code: str) -> None:
    # A stand-in for Coqui's trainer: a package of that name with a Trainer of its own and nothing else of ours.
    site = _site(tmp_path, "trainer", {"__init__.py": "class Trainer:\n    pass\n"})
    result = _run(site, code)
    assert result.returncode == 1, result.stderr
    # The traceback stays whole; the one line follows it.
    lines = result.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):", result.stderr
    assert lines[-1] == (
        f"geartrain: {site / 'trainer'} is trainer 0.0.36's package 'trainer', not geartrain's ('trainer' is an "
        f"import name of both): {ADVICE.format(other='trainer 0.0.36')}"
    ), result.stderr


@pytest.mark.parametrize("name", ["trainer", "callbacks"])
def test_a_mix_of_geartrains_package_and_anothers_is_named_in_one_line(tmp_path: Path, name: str) -> None:
    # geartrain installed over the other one (or the other way round): geartrain's files, and the other's record.
    site = tmp_path / "site"
    for package in ("trainer", "strategies", "callbacks"):
        shutil.copytree(REPO_ROOT / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    _site(tmp_path, name, {"logging_utils.py": "# the other distribution's own module\n"}, version="1.2")
    result = _run(site, "from trainer import Trainer")
    assert result.returncode == 1, result.stderr
    # Found by geartrain itself as its package is first used: the error's own message is the traceback's last line.
    lines = result.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):", result.stderr
    assert lines[-1].endswith(
        f": {site / name} mixes geartrain's package {name!r} with {name} 1.2's ({name!r} is an import "
        f"name of both, and one was installed over the other): {ADVICE.format(other=f'{name} 1.2')}"
    ), result.stderr
    assert not any(line.startswith("geartrain: ") for line in lines), result.stderr  # said once


def test_geartrains_own_install_and_other_distributions_say_nothing(tmp_path: Path) -> None:
    # geartrain's packages beside its own record and an unrelated distribution's: the import works, silently.
    site = tmp_path / "site"
    for package in ("trainer", "strategies", "callbacks"):
        shutil.copytree(REPO_ROOT / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    for dist, top in (("geartrain-0.1.0", "trainer\nstrategies\ncallbacks\n"), ("other-1.0", "other\n")):
        (site / f"{dist}.dist-info").mkdir()
        (site / f"{dist}.dist-info" / "top_level.txt").write_text(top)
    # The check geartrain's trainer runs on first use, without the torch import that use would cost.
    result = _run(site, "import trainer.shadowing as s; s.check_sibling_packages(); print(s.__file__)")
    assert result.returncode == 0 and result.stderr == "", result
    assert result.stdout == f"{site / 'trainer' / 'shadowing.py'}\n", result.stdout
