"""A monitored metric that is never logged: Lightning's defaults raise; the lenient options stand aside.

``ModelCheckpoint(missing_monitor="warn")`` keeps ``last.ckpt`` only and ``EarlyStopping(strict=False)``
lets training run to its end; each says so once, naming the metric it wanted, the metrics that were
logged, and how to monitor one of those (the override under ``geartrain``, the argument in Python).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from callbacks import EarlyStopping, ModelCheckpoint
from callbacks._monitor import MonitorNotLoggedWarning
from tests.helpers.callback_tools import NotRankZero, Scripted, loaders
from tests.helpers.trainers import quiet_trainer
from trainer.errors import MetricNotLoggedError, UserError

EPOCHS = 3


def _fit(callback: object, **kwargs: object) -> tuple[int, list[warnings.WarningMessage]]:
    """Fit ``Scripted`` (logs train/loss, val/loss) for EPOCHS epochs; return the steps and the warnings."""
    train, val = loaders()
    trainer = quiet_trainer(callbacks=[callback], max_epochs=EPOCHS, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Scripted(), train, val)
    return trainer.global_step, [w for w in caught if issubclass(w.category, MonitorNotLoggedWarning)]


def test_checkpoint_keeps_last_and_says_once_which_metric_it_wanted(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="val/acc", mode="max", save_last=True, missing_monitor="warn")
    steps, said = _fit(cb)
    assert steps == EPOCHS * 4  # trained to the end
    assert len(said) == 1
    text = str(said[0].message)
    assert "ModelCheckpoint(monitor='val/acc')" in text and "logged: train/loss, val/loss" in text
    assert "ModelCheckpoint(monitor='val/loss'" in text  # the closest logged metric, as a Python argument
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert cb.best_model_path == "" and cb.last_model_path.endswith("last.ckpt")


def test_under_the_command_the_message_names_the_override(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="val/acc", save_last=True, missing_monitor="warn")
    cb.config_key = "callbacks.model_checkpoint"  # what build_callbacks sets
    _, said = _fit(cb)
    assert "callbacks.model_checkpoint.monitor=val/loss" in str(said[0].message)


def test_early_stopping_stands_aside_and_says_once() -> None:
    es = EarlyStopping(monitor="val/acc", mode="max", patience=0, strict=False)
    steps, said = _fit(es)
    assert steps == EPOCHS * 4 and es.stopped_epoch == 0
    assert len(said) == 1
    assert "EarlyStopping(monitor='val/acc')" in str(said[0].message)
    assert "stands aside" in str(said[0].message)


def test_only_rank_zero_says_it() -> None:
    es = EarlyStopping(monitor="val/acc", strict=False)
    _, said = _fit(es, strategy=NotRankZero(device="cpu"))
    assert said == []


def test_strict_early_stopping_fails_fast_naming_what_was_logged() -> None:
    es = EarlyStopping(monitor="val/acc")  # strict=True: Lightning's default
    with pytest.raises(MetricNotLoggedError, match=r"val/acc.*never logged \(logged: train/loss, val/loss\)") as info:
        _fit(es)
    # The types it had before (KeyError) and the one the command reports (a user's mistake).
    assert isinstance(info.value, KeyError) and isinstance(info.value, UserError)
    assert str(info.value).startswith("EarlyStopping(monitor='val/acc')")  # not quoted like a KeyError's key


def test_checkpoint_raises_by_default(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="val/acc")
    with pytest.raises(MetricNotLoggedError, match=r"ModelCheckpoint\(monitor='val/acc'\)"):
        _fit(cb)


def test_a_bad_option_is_refused() -> None:
    with pytest.raises(ValueError, match="missing_monitor"):
        ModelCheckpoint(monitor="val/acc", missing_monitor="ignore")
