"""``RichProgressBar``: Lightning's rich bars, their tasks and counts, the metrics column, stopping once, off."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

import callbacks as cbs
import callbacks.rich_progress as rich_progress
from callbacks._rich_columns import CustomProgress
from callbacks.rich_progress import RichProgressBar, RichProgressBarTheme
from tests.helpers.regression import Regressor, make_loader
from tests.helpers.trainers import quiet_trainer


class Shown(Regressor):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        self.log("shown", 1.25, prog_bar=True)
        return loss


def _metrics_text(bar: RichProgressBar) -> str:
    """What the metrics column drew last beside the training bar (its final drawing, at the run's end)."""
    assert bar.progress is not None and bar.train_progress_bar_id is not None
    return str(bar.progress.columns[-1]._renderable_cache[bar.train_progress_bar_id][1])


def test_the_tasks_count_every_loop_and_the_training_bar_shows_the_metrics(tmp_path: Path) -> None:
    bar = RichProgressBar(theme=RichProgressBarTheme(metrics_format=".2e"))
    logger = cbs.CSVLogger(tmp_path, version=3)
    trainer = quiet_trainer(
        tmp_path, callbacks=[bar], logger=logger, max_epochs=2, num_sanity_val_steps=1, log_every_n_steps=1
    )
    trainer.fit(Shown(), make_loader(12, 4), make_loader(8, 4))
    assert bar.progress is not None
    sanity, train, val = (bar.progress.tasks[i] for i in range(3))
    assert (sanity.completed, sanity.total, sanity.visible) == (1, 1, False)
    assert (train.completed, train.total, train.visible) == (3, 3, True)  # one training task, reset per epoch
    assert train.description == "Epoch 1/1 "  # padded to "Validation"'s width
    assert (val.completed, val.total, val.visible) == (2, 2, False)  # hidden when the pass ends
    assert bar.val_progress_bar_id == 3 and len(bar.progress.tasks) == 4  # epoch 1's validation: a new task
    assert _metrics_text(bar) == "v_num: 3.00e+00 shown: 1.25e+00"  # every number in theme.metrics_format

    trainer.test(Shown(), make_loader(8, 4))  # the fit's progress is stopped: a new one, the test task only
    assert [(t.completed, t.total) for t in bar.progress.tasks] == [(2, 2)]
    assert bar.test_progress_bar_id == 0 and bar.train_progress_bar_id is None
    pickle.dumps(bar)  # the live progress (thread locks) is left out


@pytest.mark.parametrize("leave", [False, True])
def test_leave_keeps_each_epochs_bar_in_a_progress_of_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, leave: bool
) -> None:
    made: list[CustomProgress] = []
    original = CustomProgress.start
    monkeypatch.setattr(CustomProgress, "start", lambda self: (made.append(self), original(self))[1])
    bar = RichProgressBar(leave=leave)
    quiet_trainer(tmp_path, callbacks=[bar], max_epochs=3, limit_val_batches=0).fit(Shown(), make_loader(8, 4))
    assert len(made) == (3 if leave else 1)
    assert len(made[-1].tasks) == 1 and made[-1].tasks[0].completed == 2  # one training task: reset, or new


def test_an_exception_stops_the_progress_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stops: list[CustomProgress] = []
    original = CustomProgress.stop
    monkeypatch.setattr(CustomProgress, "stop", lambda self: (stops.append(self), original(self))[1])

    class Failing(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            raise ValueError("stop here")

    bar = RichProgressBar()
    with pytest.raises(ValueError, match="stop here"):
        quiet_trainer(tmp_path, callbacks=[bar], max_epochs=1).fit(Failing(), make_loader(8, 4))
    assert stops == [bar.progress]  # on_exception stopped it; teardown did not stop it again


def test_a_bar_that_is_off_makes_no_progress_object(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(rich_progress, "CustomProgress", lambda *a, **k: pytest.fail("a disabled bar drew"))
    switched_off = RichProgressBar()
    switched_off.disable()
    for bar in (RichProgressBar(refresh_rate=0), switched_off):
        trainer = quiet_trainer(tmp_path, callbacks=[bar], max_epochs=1, num_sanity_val_steps=1)
        trainer.fit(Shown(), make_loader(8, 4), make_loader(8, 4))
        trainer.predict(Shown(), make_loader(8, 4))
        assert bar.progress is None and bar.train_progress_bar_id is None and bar.predict_progress_bar_id is None


def test_without_rich_the_bar_is_refused_by_lightnings_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rich_progress, "_RICH_AVAILABLE", False)
    with pytest.raises(ModuleNotFoundError, match="`RichProgressBar` requires `rich`"):
        RichProgressBar()


def test_the_lightning_module_path_reaches_the_bars_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    import trainer.lightning.callbacks.progress.rich_progress as lightning_rich

    assert lightning_rich.RichProgressBarTheme is RichProgressBarTheme
    assert lightning_rich.RichProgressBar is cbs.RichProgressBar is RichProgressBar
    monkeypatch.setattr(lightning_rich, "_RICH_AVAILABLE", False)  # a test of Lightning's does this
    assert rich_progress._RICH_AVAILABLE is False


@pytest.mark.slow
def test_building_a_trainer_does_not_import_rich() -> None:
    import subprocess
    import sys

    from tests.helpers import REPO_ROOT

    code = (
        "import sys, trainer; trainer.Trainer(logger=False, enable_checkpointing=False); "
        "print(sorted(m for m in sys.modules if m == 'rich' or m.startswith('callbacks.rich')))"
    )
    env = {"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True)
    assert out.stdout.strip() == "[]"  # the default summary's choice looks for a RichProgressBar without importing it
