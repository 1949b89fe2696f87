"""The default job end to end: ``python -m trainer`` with no arguments, as a user would run it.

Both commands run at once in their own folders (Hydra names run directories by the second, so
they must not share one) to keep the suite's wall time down on two cores.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import REPO_ROOT
from tests.helpers.cli import run_many

pytestmark = pytest.mark.slow  # every test here starts processes

JOBS = {
    "default": [],  # the full default job: fit 20 epochs, then test
    "smoke": ["trainer.max_epochs=1", "task=fit"],
}
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[int, str, Path]]]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}  # the checkout under test, not an install
    yield run_many(
        {name: (tmp_path_factory.mktemp(name), args, None) for name, args in JOBS.items()}, timeout=TIMEOUT_S, env=env
    )


def stated_range(page: Path) -> tuple[float, float]:
    """The range of the default job's test accuracy that ``page`` states: "`test/acc` LOW-HIGH" (an en dash)."""
    found = re.search(r"`test/acc` (\d\.\d+)[\u2013-](\d\.\d+)", page.read_text())
    assert found is not None, f"{page} no longer states the test accuracy as a range"
    return float(found.group(1)), float(found.group(2))


def final_metrics(output: str) -> tuple[dict[str, float], Path]:
    """Parse the table the job prints last, and the run directory it names."""
    header = re.search(r"^final metrics \((\w+), run directory (.+)\):$", output, re.MULTILINE)
    assert header is not None, output[-3000:]
    table = output[header.end() :]
    metrics = {k: float(v) for k, v in re.findall(r"^  (\S+)\s+(-?[\d.]+)$", table, re.MULTILINE)}
    return metrics, Path(header.group(2))


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_default_job_reaches_accuracy_and_leaves_its_artifacts(jobs: Any) -> None:
    code, output, cwd = jobs["default"]
    assert code == 0, output[-3000:]
    metrics, run_dir = final_metrics(output)
    assert metrics["val/acc"] >= 0.95, metrics
    assert metrics["test/acc"] >= 0.95, metrics
    # What the README and the examples guide promise a user is what this run gives.
    low, high = stated_range(REPO_ROOT / "README.md")
    assert stated_range(REPO_ROOT / "docs" / "examples.md") == (low, high)
    assert low >= 0.95 and low <= metrics["test/acc"] <= high, (low, high, metrics)
    best = [p.name for p in (run_dir / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt"]
    assert len(best) == 1 and re.fullmatch(r"epoch=\d+-step=\d+-val_acc=0\.\d{4}\.ckpt", best[0]), best
    assert run_dir.is_relative_to(cwd / "outputs")
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}/\d{2}-\d{2}-\d{2}", run_dir.relative_to(cwd / "outputs").as_posix())

    events = list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert events, sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*"))
    written = b"".join(p.read_bytes() for p in events)
    for tag in (b"train/loss", b"val/acc", b"test/acc"):
        assert tag in written, tag

    from examples.digits import DigitsClassifier, DigitsData

    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    model = DigitsClassifier(**ckpt["hyper_parameters"])
    model.load_state_dict(ckpt["state_dict"])
    model.eval()
    data = DigitsData()
    data.setup("test")
    assert data.test_set is not None
    x, y = data.test_set.tensors
    with torch.no_grad():
        accuracy = float((model(x).argmax(dim=1) == y).float().mean())
    assert accuracy == pytest.approx(metrics["test/acc"], abs=1e-3)  # the file holds the trained weights


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_one_epoch_fit_smoke(jobs: Any) -> None:
    code, output, _ = jobs["smoke"]
    assert code == 0, output[-3000:]
    metrics, run_dir = final_metrics(output)
    assert "val/acc" in metrics and "test/acc" not in metrics
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
