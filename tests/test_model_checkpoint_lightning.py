"""``ModelCheckpoint`` behaves as Lightning 2.6's (issue 23): the outcomes below were observed running
the same schedules under pytorch-lightning 2.6.6 (scores per epoch, files left, bookkeeping)."""

from __future__ import annotations

import math
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from callbacks import CSVLogger, ModelCheckpoint
from tests.helpers.regression import Regressor, make_loader
from tests.helpers.trainers import quiet_trainer
from trainer.checkpoint import load_checkpoint


class Scored(Regressor):
    """Logs ``val`` = ``scores[epoch]`` at each validation."""

    def __init__(self, scores: list[float] | None = None) -> None:
        super().__init__()
        self.scores = scores or []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val", torch.tensor(self.scores[self.current_epoch] if self.scores else 0.0))


def fit(cb: ModelCheckpoint, root: Path, scores: list[float] | None = None, epochs: int = 4, **kw: Any) -> Any:
    trainer = quiet_trainer(root, max_epochs=epochs, callbacks=[cb], enable_checkpointing=True, **kw)
    trainer.fit(Scored(scores), make_loader(8, 4), make_loader(8, 4))  # 2 steps an epoch
    return trainer


def names(folder: Path | str) -> list[str]:
    return sorted(os.listdir(folder))


def base(path: str) -> str:
    return os.path.basename(path)


SCORES = [0.5, 0.4, 0.6, 0.3]


def test_state_key_is_lightnings() -> None:
    assert ModelCheckpoint(monitor="v", every_n_train_steps=3).state_key == (
        "ModelCheckpoint{'monitor': 'v', 'mode': 'min', 'every_n_train_steps': 3, 'every_n_epochs': 0, "
        "'train_time_interval': None}"
    )
    assert ModelCheckpoint(train_time_interval=timedelta(seconds=5)).state_key == (
        "ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 0, "
        "'train_time_interval': datetime.timedelta(seconds=5)}"
    )

    class Mine(ModelCheckpoint):
        pass

    assert Mine(monitor="val", mode="max").state_key.startswith(
        f"{Mine.__qualname__}{{'monitor': 'val', 'mode': 'max', "
    )


def test_dirpath_expands_the_home_folder_and_is_a_str(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    cb = ModelCheckpoint(dirpath="~/a/../ckpts")
    assert cb.dirpath == os.path.realpath(tmp_path / "ckpts") and isinstance(cb.dirpath, str)


def test_default_folder_is_under_the_loggers_version(tmp_path: Path) -> None:
    cb = ModelCheckpoint()
    fit(cb, tmp_path, epochs=1, logger=CSVLogger(tmp_path, name="exp"))
    assert cb.dirpath == str(tmp_path / "exp" / "version_0" / "checkpoints")
    assert names(cb.dirpath) == ["epoch=0-step=2.ckpt"]
    named = ModelCheckpoint()
    fit(named, tmp_path / "b", epochs=1, logger=CSVLogger(tmp_path / "b", name="exp", version="abc"))
    assert named.dirpath == str(tmp_path / "b" / "exp" / "abc" / "checkpoints")
    no_logger = ModelCheckpoint()
    fit(no_logger, tmp_path / "c", epochs=1)
    assert no_logger.dirpath == str(tmp_path / "c" / "checkpoints")


@pytest.mark.parametrize(
    ("k", "files", "best", "kth", "kth_value"),
    [
        (1, ["model.ckpt"], "model.ckpt", "model.ckpt", 0.3),  # always the same name
        (2, ["model-v1.ckpt", "model.ckpt"], "model.ckpt", "model-v1.ckpt", 0.4),  # 0.3 took model.ckpt's place
        (-1, ["model-v1.ckpt", "model-v2.ckpt", "model-v3.ckpt", "model.ckpt"], "model-v3.ckpt", "model-v2.ckpt", 0.6),
    ],
)
def test_versioned_names_and_kth_as_lightning(
    tmp_path: Path, k: int, files: list[str], best: str, kth: str, kth_value: float
) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path, filename="model", monitor="val", save_top_k=k)
    fit(cb, tmp_path, SCORES)
    assert names(tmp_path) == files
    assert (base(cb.best_model_path), base(cb.kth_best_model_path)) == (best, kth)
    assert cb.kth_value == pytest.approx(kth_value) and cb.current_score == pytest.approx(0.3)
    assert cb.best_model_score == pytest.approx(0.3)


def test_scores_are_lightnings_tensors_and_survive_a_restore(tmp_path: Path) -> None:
    """A Lightning objective returns ``best_model_score.item()``; scores are 0-d tensors there."""
    cb = ModelCheckpoint(dirpath=tmp_path, filename="model", monitor="val", save_top_k=2)
    fit(cb, tmp_path, SCORES)
    values = [cb.best_model_score, cb.kth_value, cb.current_score, *cb.best_k_models.values()]
    assert all(isinstance(v, torch.Tensor) and v.ndim == 0 for v in values), values
    assert cb.best_model_score.item() == pytest.approx(0.3)
    again = ModelCheckpoint(dirpath=tmp_path, filename="model", monitor="val", save_top_k=2)
    again.load_state_dict(cb.state_dict())
    assert again.best_model_score.item() == cb.best_model_score.item()
    assert {p: v.item() for p, v in again.best_k_models.items()} == {p: v.item() for p, v in cb.best_k_models.items()}


def test_without_monitor_one_file_keeps_its_name(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path, filename="model")
    fit(cb, tmp_path)
    assert names(tmp_path) == ["model.ckpt"] and base(cb.best_model_path) == "model.ckpt"


def test_nan_ranks_as_the_worst_score(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="val", mode="max", save_top_k=2)
    fit(cb, tmp_path, [math.nan, 0.4, math.nan, 0.3])
    # Epoch 0's NaN was kept as -inf while there was room, then pushed out; epoch 2's never got in.
    assert names(tmp_path) == ["epoch=1-step=4.ckpt", "epoch=3-step=8.ckpt"]
    assert cb.best_model_score == pytest.approx(0.4) and cb.kth_value == pytest.approx(0.3)

    first = ModelCheckpoint(dirpath=tmp_path / "b", monitor="val", mode="max", save_top_k=2)
    fit(first, tmp_path / "b", [math.nan], epochs=1)
    assert list(first.best_k_models.values()) == [-math.inf] and first.current_score == -math.inf


@pytest.mark.parametrize(
    ("monitor", "mode", "files", "best"),
    [
        ("epoch", "max", ["epoch=2-step=6.ckpt", "epoch=3-step=8.ckpt"], 3),
        ("step", "min", ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt"], 2),
    ],
)
def test_monitor_epoch_or_step(tmp_path: Path, monitor: str, mode: str, files: list[str], best: int) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path, monitor=monitor, mode=mode, save_top_k=2)
    fit(cb, tmp_path, SCORES)
    assert names(tmp_path) == files and cb.best_model_score == best


def test_to_yaml_writes_the_kept_files_and_scores(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="val", save_top_k=2)
    fit(cb, tmp_path, SCORES)
    cb.to_yaml()
    kept = yaml.safe_load((tmp_path / "best_k_models.yaml").read_text())
    assert {base(p): pytest.approx(v) for p, v in kept.items()} == {
        "epoch=1-step=4.ckpt": 0.4,
        "epoch=3-step=8.ckpt": 0.3,
    }
    cb.to_yaml(tmp_path / "other.yaml")
    assert yaml.safe_load((tmp_path / "other.yaml").read_text()) == kept


def test_class_attributes_name_the_last_file_too(tmp_path: Path) -> None:
    class Custom(ModelCheckpoint):
        CHECKPOINT_NAME_LAST = "{epoch}-last"
        FILE_EXTENSION = ".pt"
        CHECKPOINT_JOIN_CHAR = "_"
        CHECKPOINT_EQUALS_CHAR = ":"

    cb = Custom(dirpath=tmp_path, save_last=True, filename="m-{epoch}")
    fit(cb, tmp_path, epochs=2)
    assert names(tmp_path) == ["epoch:1-last.pt", "m-epoch:1.pt"]  # the previous last file is gone
    assert cb.last_model_path == str(tmp_path / "epoch:1-last.pt")
    again = Custom(dirpath=tmp_path / "v", filename="m", save_top_k=-1)
    fit(again, tmp_path / "v", epochs=2)
    assert names(tmp_path / "v") == ["m.pt", "m_v1.pt"]


def test_state_dict_holds_lightnings_entries(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="val", save_top_k=2, save_last=True)
    fit(cb, tmp_path, SCORES)
    state = load_checkpoint(tmp_path / "last.ckpt")["callbacks"][cb.state_key]
    lightnings = {
        "monitor",
        "best_model_score",
        "best_model_path",
        "current_score",
        "dirpath",
        "best_k_models",
        "kth_best_model_path",
        "kth_value",
        "last_model_path",
    }
    assert lightnings <= set(state)
    assert (state["monitor"], state["dirpath"], base(state["kth_best_model_path"])) == (
        "val",
        str(tmp_path),
        "epoch=1-step=4.ckpt",
    )


class _CountsStateDict(ModelCheckpoint):
    """Counts the calls of its ``state_dict`` override (which, as a Lightning test's, returns nothing)."""

    calls = 0

    def state_dict(self) -> Any:
        super().state_dict()
        self.calls += 1


def test_state_dict_is_called_once_per_checkpoint_written(tmp_path: Path) -> None:
    """As Lightning: a checkpoint callback's ``state_dict`` is called to write a checkpoint, once per file; its own
    bookkeeping (the state a failed save rolls back to) does not go through a subclass's override."""
    checkpoint = _CountsStateDict(dirpath=tmp_path, monitor="val_loss", save_top_k=-1)
    trainer = quiet_trainer(tmp_path, callbacks=[checkpoint], max_epochs=3)
    trainer.fit(Regressor(), make_loader(), make_loader())
    assert len(list(tmp_path.glob("*.ckpt"))) == 3
    assert checkpoint.calls == 3


def test_scores_keep_the_monitored_values_kind_so_step_scores_are_integers(tmp_path: Path) -> None:
    from callbacks._tracker import new_checkpoints

    by_step = ModelCheckpoint(dirpath=tmp_path / "step", monitor="step", save_top_k=2)
    fit(by_step, tmp_path, epochs=2)
    # As Lightning's: the score is the step as monitored (an integer tensor); trackers store 4, not 4.0.
    assert by_step.best_model_score is not None and by_step.best_model_score.dtype == torch.int64
    assert by_step.best_model_score.item() == 2 and by_step.current_score.item() == 4  # type: ignore[union-attr]
    assert sorted(c.score for c in new_checkpoints(by_step, {})) == [2, 4]
    assert all(type(c.score) is int for c in new_checkpoints(by_step, {}))
    saved = load_checkpoint(by_step.best_model_path)["callbacks"][by_step.state_key]["best_model_score"]
    assert saved.dtype == torch.int64
    by_val = ModelCheckpoint(dirpath=tmp_path / "val", monitor="val")  # a float metric stays a float
    fit(by_val, tmp_path, scores=[0.5, 0.25], epochs=2)
    assert by_val.best_model_score is not None and by_val.best_model_score.dtype == torch.float32
