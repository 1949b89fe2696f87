"""The package builds without setuptools warnings, and an installed wheel finds its configs."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
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
    folders |= {"trainer.examples.data"}
    # Every Python package of the library: one left out is missing from an installed geartrain.
    folders |= {
        ".".join(p.parent.relative_to(REPO_ROOT).parts)
        for top in ("trainer", "strategies", "callbacks")
        for p in (REPO_ROOT / top).rglob("__init__.py")
    }
    assert folders <= packages, f"add to [tool.setuptools] packages: {sorted(folders - packages)}"
    with_yaml = {f for f in folders if f.startswith("trainer.conf") and any(_folder(f).glob("*.yaml"))}
    assert with_yaml <= set(config["package-data"]), sorted(with_yaml - set(config["package-data"]))


def _folder(package: str) -> Path:
    return REPO_ROOT.joinpath("conf", *package.split(".")[2:])


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_wheel_builds_quietly_and_installed_trains_the_default_job(tmp_path: Path) -> None:
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
    conf = {
        f"trainer/conf/{p.relative_to(REPO_ROOT / 'conf').as_posix()}" for p in (REPO_ROOT / "conf").rglob("*.yaml")
    }
    assert conf <= names, sorted(conf - names)
    assert {"trainer/examples/data/digits.npz", "trainer/examples/data/charlm_corpus.txt"} <= names
    # Only the library takes top-level names; the examples and benchmarks are not among them.
    assert {n.split("/")[0] for n in names if "/" in n and ".dist-info" not in n} == {
        "trainer",
        "strategies",
        "callbacks",
    }
    # Beside them, the start-up line that names a user's trainer.py hiding the package, and what it calls.
    assert {n for n in names if "/" not in n} == {"geartrain-excepthook.pth", "_geartrain_excepthook.py"}

    # A real install into a fresh venv (its dependencies lent from this one by a .pth line, which pip
    # never reads for this checkout's editable hook): run from elsewhere, nothing of the checkout can help.
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True, timeout=120)  # type: ignore[attr-defined]
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "lent_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HYDRA_FULL_ERROR")}
    probe = (
        "import importlib.util as u, trainer, trainer.cli.app as c, trainer.examples.digits as d; "
        "print(u.find_spec('examples'), u.find_spec('bench'), trainer.__file__, c.config_dir(), d.DIGITS_PATH.is_file())"
    )
    located = subprocess.run([str(python), "-c", probe], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert located.returncode == 0, located.stderr[-3000:]
    examples, bench, package, conf, data = located.stdout.split()
    assert (examples, bench, data) == ("None", "None", "True"), located.stdout
    assert Path(package).parent.parent == Path(site) and Path(conf) == Path(site) / "trainer" / "conf"
    composed = subprocess.run(
        [str(venv / "bin" / "geartrain"), "--cfg", "job", "experiment=charlm"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert composed.returncode == 0, composed.stderr[-3000:]
    assert "trainer.examples.charlm.CharLM" in composed.stdout
    # The default job itself, cut short: its model, data and bundled digits come from the wheel.
    job = [
        "task=fit",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
        "trainer.enable_progress_bar=false",
    ]
    ran = subprocess.run(
        [str(venv / "bin" / "geartrain"), *job],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    assert "val/acc" in ran.stdout and list(elsewhere.glob("outputs/*/*/checkpoints/last.ckpt")), ran.stdout[-2000:]
    (elsewhere / "trainer.py").write_text("from trainer import Trainer\n")
    hidden = subprocess.run([str(python), "trainer.py"], cwd=elsewhere, env=env, capture_output=True, text=True)
    lines = hidden.stderr.splitlines()  # the traceback whole, then the one line
    assert lines[0] == "Traceback (most recent call last):" and lines[-1] == (
        f"geartrain: {elsewhere / 'trainer.py'} hides geartrain's package 'trainer': rename it (e.g. my_trainer.py) "
        "and its imports"
    ), hidden.stderr
