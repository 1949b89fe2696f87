"""The default job starts cheaply: bundled data instead of scikit-learn, plain-tensor accuracy instead of
torchmetrics, and the same numbers as before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torchmetrics.classification import MulticlassAccuracy

from examples.digits import DIGITS_PATH, DigitsClassifier, DigitsData, load_digits
from tests.helpers import REPO_ROOT
from tests.helpers.trainers import quiet_trainer
from trainer import seed_everything

#: Imported by the default job before its data moved into the repository; each cost start-up time.
HEAVY = ("sklearn", "scipy", "torchmetrics")


def test_bundled_digits_equal_scikit_learns_copy() -> None:
    from sklearn.datasets import load_digits as sklearn_digits

    images, labels = load_digits()
    expected_images, expected_labels = sklearn_digits(return_X_y=True)
    assert images.dtype == labels.dtype == np.uint8
    assert images.shape == (1797, 64) and labels.shape == (1797,)
    np.testing.assert_array_equal(images, expected_images)
    np.testing.assert_array_equal(labels, expected_labels)
    assert DIGITS_PATH.stat().st_size < 64_000  # small enough to live in the repository


def test_data_module_gives_the_tensors_the_sklearn_path_gave() -> None:
    from sklearn.datasets import load_digits as sklearn_digits

    data = DigitsData(seed=3)
    data.setup("fit")
    assert data.train_set is not None and data.val_set is not None and data.test_set is not None
    # What DigitsData.setup computed from scikit-learn before the data were bundled (with the test
    # split cut from the training part since: validation first, then test, then training).
    images, labels = sklearn_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32) / 16.0
    y = torch.tensor(labels, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(3))
    val_idx, test_idx, train_idx = order[:359], order[359:718], order[718:]
    for got, want in zip(
        (*data.train_set.tensors, *data.val_set.tensors, *data.test_set.tensors),
        (x[train_idx], y[train_idx], x[val_idx], y[val_idx], x[test_idx], y[test_idx]),
    ):
        assert got.dtype == want.dtype
        assert torch.equal(got, want)


def test_accuracy_is_the_share_of_correct_predictions_over_the_whole_set(tmp_path: Path) -> None:
    # 359 validation samples in batches of 256 and 103: an unweighted mean of the two batch
    # accuracies would differ from the share over all samples, and from torchmetrics' micro accuracy.
    seed_everything(0)
    module = DigitsClassifier()
    data = DigitsData()
    trainer = quiet_trainer(tmp_path, strategy="auto", num_sanity_val_steps=2, max_steps=5)
    trainer.fit(module, datamodule=data)
    metrics = trainer.validate(module, datamodule=data)[0]
    assert data.val_set is not None
    x, y = data.val_set.tensors
    module.eval()
    with torch.no_grad():
        logits = module(x)
    by_hand = (logits.argmax(dim=1) == y).double().mean().item()
    reference = MulticlassAccuracy(num_classes=10, average="micro")
    for start in (0, 256):
        reference.update(logits[start : start + 256], y[start : start + 256])
    assert metrics["val/acc"] == pytest.approx(by_hand, abs=1e-6)
    assert metrics["val/acc"] == pytest.approx(float(reference.compute()), abs=1e-6)
    assert metrics["val/loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, y).item(), abs=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_default_job_imports_neither_scikit_learn_nor_scipy_nor_torchmetrics(tmp_path: Path) -> None:
    # The job as `geartrain trainer.max_steps=1` runs it; the modules are listed when the process exits.
    code = (
        "import atexit, runpy, sys; "
        f"atexit.register(lambda: print('HEAVY:' + ','.join(m for m in {HEAVY!r} if m in sys.modules))); "
        f"sys.argv = ['geartrain', 'trainer.max_steps=1', 'hydra.run.dir={tmp_path / 'run'}']; "
        "runpy.run_module('trainer', run_name='__main__', alter_sys=True)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=110
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "test/acc" in proc.stdout, proc.stdout[-3000:]  # the job ran to its end
    heavy = [line for line in proc.stdout.splitlines() if line.startswith("HEAVY:")]
    assert heavy == ["HEAVY:"], heavy


#: The user's side of a geartrain run: a module imported after the freeze, as Hydra imports the user's.
_USER_CODE = """
import atexit, gc, sys, threading, time
from pathlib import Path

out = Path(__file__).parent
def slow_write():
    time.sleep(0.3)
    (out / "thread.txt").write_text("done")
threading.Thread(target=slow_write, daemon=False).start()
atexit.register(lambda: (out / "atexit.txt").write_text("done"))
unclosed = open(out / "unclosed.txt", "w")  # buffered and never closed: the normal exit flushes it
unclosed.write("kept")
class Cycle:  # garbage in a reference cycle: still collected, its finaliser runs
    def __del__(self):
        (out / "collected.txt").write_text("done")
a, b = Cycle(), Cycle()
a.other, b.other = b, a
del a, b
gc.collect()
sys.stdout.write("buffered, no newline")
"""

_FREEZE_SCRIPT = """
import gc, sys
from trainer.cli.command import freeze_startup_objects

freeze_startup_objects()
sys.stderr.write(f"frozen={gc.get_freeze_count()}")
sys.path.insert(0, sys.argv[1])
import user_code
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_freezing_the_startup_objects_keeps_collection_and_the_normal_exit(tmp_path: Path) -> None:
    """torch's import-time objects are frozen; the user's are collected, and the exit is Python's own."""
    (tmp_path / "user_code.py").write_text(_USER_CODE)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _FREEZE_SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=50
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stderr.removeprefix("frozen=")) > 10_000  # torch's import alone makes far more
    assert (tmp_path / "collected.txt").read_text() == "done"
    assert (tmp_path / "thread.txt").read_text() == "done"  # a non-daemon thread finished first
    assert (tmp_path / "atexit.txt").read_text() == "done"
    assert (tmp_path / "unclosed.txt").read_text() == "kept"
    assert proc.stdout == "buffered, no newline"


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_import_trainer_leaves_heavy_packages_out() -> None:
    code = (
        "import sys, trainer, strategies, callbacks; "
        "print(','.join(m for m in ('tensorboard', 'torchmetrics', 'hydra', 'rich', 'sklearn', 'omegaconf') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": str(REPO_ROOT)}, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
