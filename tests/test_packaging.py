"""The package builds without setuptools warnings, and an installed wheel finds its configs."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if (REPO_ROOT / line).is_file()]


def test_every_folder_of_data_files_is_a_listed_package() -> None:
    """Setuptools sees every folder as a package; each one missing from the list costs a warning."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = set(config["packages"])
    folders = {
        "trainer.conf" + "".join(f".{part}" for part in p.relative_to(REPO_ROOT / "conf").parts)
        for p in (REPO_ROOT / "conf").rglob("*")
        if p.is_dir() and p.name != "__pycache__"
    }
    folders |= {"examples.data"}
    assert folders <= packages, f"add to [tool.setuptools] packages: {sorted(folders - packages)}"
    with_yaml = {f for f in folders if f.startswith("trainer.conf") and any(_folder(f).glob("*.yaml"))}
    assert with_yaml <= set(config["package-data"]), sorted(with_yaml - set(config["package-data"]))


def _folder(package: str) -> Path:
    return REPO_ROOT.joinpath("conf", *package.split(".")[2:])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_wheel_builds_quietly_and_its_geartrain_finds_the_configs(tmp_path: Path) -> None:
    source = tmp_path / "src"
    for name in tracked_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((REPO_ROOT / name).read_bytes())
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", str(source), "-w", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    # pip's own notes about the package index configuration are not ours; setuptools' would be.
    output = (built.stdout + built.stderr).splitlines()
    warnings = [line for line in output if "warn" in line.lower() and "is ignored" not in line]
    assert not warnings, "\n".join(warnings)

    (wheel,) = tmp_path.glob("geartrain-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        installed = tmp_path / "installed"
        archive.extractall(installed)
    conf = {
        f"trainer/conf/{p.relative_to(REPO_ROOT / 'conf').as_posix()}" for p in (REPO_ROOT / "conf").rglob("*.yaml")
    }
    assert conf <= names, sorted(conf - names)
    assert {"examples/data/digits.npz", "examples/data/charlm_corpus.txt"} <= names

    # The installed copy, not this checkout: run from elsewhere with only the unpacked wheel on the path.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(installed)}
    composed = subprocess.run(
        [sys.executable, "-m", "trainer", "--cfg", "job", "experiment=charlm"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert composed.returncode == 0, composed.stderr[-3000:]
    assert "examples.charlm.CharLM" in composed.stdout
    located = subprocess.run(
        [sys.executable, "-c", "import trainer.cli.app as c; print(c.config_dir())"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(located.stdout.strip()) == installed / "trainer" / "conf"
