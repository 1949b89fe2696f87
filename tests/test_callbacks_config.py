"""The callbacks and logger config groups: defaults on, each one Hydra override away."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import callbacks as cbs
from tests.helpers import REPO_ROOT
from trainer.cli.app import build_callbacks, config_dir


def _build(*overrides: str) -> tuple[Any, list[Any], dict[str, Any]]:
    with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
        cfg = compose("config", overrides=list(overrides))
    kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert isinstance(kwargs, dict)
    return cfg, build_callbacks(cfg, kwargs), kwargs


def _kinds(built: list[Any]) -> list[str]:
    return [type(cb).__name__ for cb in built]


def test_defaults_are_on_and_the_trainer_adds_no_second_copy() -> None:
    _, built, kwargs = _build()
    assert _kinds(built) == [
        "ProgressBar",
        "ModelSummary",
        "ModelCheckpoint",
        "LearningRateMonitor",
        "EarlyStopping",
        "TensorBoardLogger",
    ]
    checkpoint = built[2]
    assert (checkpoint.monitor, checkpoint.mode, checkpoint.save_last) == ("val/acc", "max", True)
    # No defaults of the Trainer's beside the group's; the group's bar and checkpoint are the ones (as Lightning,
    # either beside enable_progress_bar=False / enable_checkpointing=False would be refused).
    assert (kwargs["enable_progress_bar"], kwargs["enable_checkpointing"], kwargs["logger"]) == (True, True, False)


def test_one_override_turns_a_callback_off_or_tunes_it() -> None:
    _, built, kwargs = _build("~callbacks.progress_bar", "callbacks.early_stopping.patience=3")
    assert "ProgressBar" not in _kinds(built) and kwargs["enable_progress_bar"] is False
    (early,) = [cb for cb in built if isinstance(cb, cbs.EarlyStopping)]
    assert early.patience == 3


@pytest.mark.parametrize(
    ("overrides", "loggers"),
    [
        (["logger=none"], []),
        (["logger=csv"], ["CSVLogger"]),
        (["logger=[tensorboard,csv]"], ["TensorBoardLogger", "CSVLogger"]),
        (["trainer.logger=false"], []),
        (["logger=tensorboard"], ["TensorBoardLogger"]),
        (["logger=mlflow"], ["MLFlowLogger"]),
        (["logger=wandb"], ["WandbLogger"]),
        (["logger=[tensorboard,mlflow]"], ["TensorBoardLogger", "MLFlowLogger"]),
        (["logger=[csv,wandb,mlflow]"], ["CSVLogger", "WandbLogger", "MLFlowLogger"]),
    ],
)
def test_logger_group(overrides: list[str], loggers: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # built, never contacted
    _, built, kwargs = _build(*overrides)
    assert [k for k in _kinds(built) if k.endswith("Logger")] == loggers
    assert kwargs["logger"] is False


def test_trainer_switches_still_drop_group_entries() -> None:
    _, built, _ = _build("trainer.enable_progress_bar=false", "trainer.enable_checkpointing=false")
    assert "ProgressBar" not in _kinds(built) and "ModelCheckpoint" not in _kinds(built)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cli_run_with_overrides(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "-m", "trainer", "task=fit", "trainer.max_epochs=2", "trainer.limit_train_batches=3"]
    cmd += ["~callbacks.progress_bar"]
    cmd += ["logger=csv", f"hydra.run.dir={tmp_path / 'run'}"]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Trainable params" in out.stdout  # the model summary
    assert "epoch 0 |" not in out.stdout and "validation |" not in out.stdout  # no progress bar
    run = tmp_path / "run"
    assert not (run / "tensorboard").exists()
    assert (run / "csv" / "metrics.csv").read_text().startswith("step,epoch,")
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert len(names) == 2 and names[-1] == "last.ckpt" and names[0].startswith("epoch=") and "-val_acc=0." in names[0]
