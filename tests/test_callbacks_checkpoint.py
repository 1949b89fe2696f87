"""ModelCheckpoint: top-k bookkeeping over a known metric sequence, file names, atomic writes."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import get_args

import pytest
import torch

from callbacks import ModelCheckpoint
from tests.helpers.callback_tools import NotRankZero, Scripted, loaders
from tests.helpers.trainers import quiet_trainer
from trainer.checkpoint.files import load_checkpoint
from trainer.common.errors import MisconfigurationException

SCORES = [0.5, 0.8, 0.6, 0.9, 0.7, 0.85]  # val/score per epoch; 4 steps per epoch


def _fit(tmp_path: Path, cb: ModelCheckpoint, scores: list[float] = SCORES, **kwargs: object) -> None:
    train, val = loaders()
    trainer = quiet_trainer(tmp_path, [cb], max_epochs=len(scores), **kwargs)
    trainer.fit(Scripted(scores), train, val)


def _names(path: Path) -> set[str]:
    return {p.name for p in path.iterdir()}


def test_top_k_max_keeps_the_k_best_files_and_reports_the_best(tmp_path: Path) -> None:
    cb = ModelCheckpoint(
        dirpath=tmp_path / "ck", filename="{epoch}-{val/score:.2f}", monitor="val/score", mode="max", save_top_k=2
    )
    _fit(tmp_path, cb)
    assert _names(tmp_path / "ck") == {"epoch=3-val_score=0.90.ckpt", "epoch=5-val_score=0.85.ckpt"}
    assert cb.best_model_path == str(tmp_path / "ck" / "epoch=3-val_score=0.90.ckpt")
    assert cb.best_model_score == pytest.approx(0.9)
    assert sorted(cb.best_k_models.values()) == pytest.approx([0.85, 0.9])
    # The checkpoint of the best epoch holds the weights and progress of that moment.
    best = load_checkpoint(cb.best_model_path)
    assert best["progress"]["epoch"] == 3 and best["progress"]["global_step"] == 16


def test_top_k_min_mode_and_last(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}", monitor="val/score", mode="min", save_last=True)
    _fit(tmp_path, cb)
    assert _names(tmp_path) == {"epoch=0.ckpt", "last.ckpt"}
    assert cb.best_model_score == pytest.approx(0.5)
    last = load_checkpoint(tmp_path / "last.ckpt")
    assert last["progress"]["global_step"] == 24
    # Callback state travels in the checkpoint so a resume keeps ranking.
    (state,) = [v for k, v in last["callbacks"].items() if k.startswith("ModelCheckpoint")]
    assert state["best_model_path"] == str(tmp_path / "epoch=0.ckpt")


def test_last_is_a_copy_of_the_file_saved_at_the_same_moment(tmp_path: Path) -> None:
    # Epoch 5 (0.85) enters the top 2 and is also the last state: last.ckpt is that very file.
    cb = ModelCheckpoint(
        dirpath=tmp_path, filename="{epoch}", monitor="val/score", mode="max", save_top_k=2, save_last=True
    )
    _fit(tmp_path, cb)
    assert (tmp_path / "last.ckpt").read_bytes() == (tmp_path / "epoch=5.ckpt").read_bytes()
    assert load_checkpoint(tmp_path / "last.ckpt")["progress"]["global_step"] == 24
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_save_top_k_all_and_none(tmp_path: Path) -> None:
    every = ModelCheckpoint(dirpath=tmp_path / "all", monitor="val/score", mode="max", save_top_k=-1)
    _fit(tmp_path, every)
    assert len(list((tmp_path / "all").iterdir())) == len(SCORES)
    none = ModelCheckpoint(dirpath=tmp_path / "none", monitor="val/score", save_top_k=0, save_last=True)
    _fit(tmp_path, none)
    assert _names(tmp_path / "none") == {"last.ckpt"}
    assert none.best_model_path == ""


def test_without_monitor_keeps_the_newest_and_every_n_train_steps(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path, filename="{step}", save_top_k=-1, every_n_train_steps=3)
    _fit(tmp_path, cb, scores=[0.0, 0.0])  # 8 steps: saves at 3 and 6
    assert _names(tmp_path) == {"step=3.ckpt", "step=6.ckpt"}
    assert cb.best_model_path.endswith("step=6.ckpt")
    assert cb.best_k_models == {}  # nothing ranked, as Lightning's
    newest = ModelCheckpoint(dirpath=tmp_path / "one", filename="{step}", every_n_train_steps=3)
    _fit(tmp_path, newest, scores=[0.0, 0.0])
    assert _names(tmp_path / "one") == {"step=6.ckpt"}


def test_a_top_k_without_a_monitor_is_refused_as_in_lightning(tmp_path: Path) -> None:
    # Lightning refuses it (nothing to rank by); -1 (every save) and 1 (the newest) are the choices.
    with pytest.raises(MisconfigurationException, match=r"save_top_k=3, monitor=None\) is not a valid"):
        ModelCheckpoint(dirpath=tmp_path, save_top_k=3)
    # The signature holds types, not strings: a parser can build save_last's choices from it.
    annotation = inspect.signature(ModelCheckpoint).parameters["save_last"].annotation
    assert not isinstance(annotation, str)
    assert bool in get_args(annotation)


def test_filename_template_gives_valid_names() -> None:
    cb = ModelCheckpoint(filename="{epoch}-{step}-{val/acc:.4f}-{a b}")
    name = cb.format_filename({"epoch": 2, "step": 7, "val/acc": torch.tensor(0.91234), "a b": 1})
    assert name == "epoch=2-step=7-val_acc=0.9123-a_b=1.ckpt"
    assert "/" not in name and os.sep not in name
    # A metric not logged reads 0, formatted by its field, as in Lightning.
    assert cb.format_filename({"epoch": 0, "step": 0}) == "epoch=0-step=0-val_acc=0.0000-a_b=0.ckpt"


def test_skips_ranking_in_epochs_without_validation(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}", monitor="val/score", mode="max", save_top_k=-1)
    _fit(tmp_path, cb, check_val_every_n_epoch=2)
    # Validation ran after epochs 1, 3, 5: only those are ranked, no stale duplicates.
    assert _names(tmp_path) == {"epoch=1.ckpt", "epoch=3.ckpt", "epoch=5.ckpt"}
    assert cb.best_model_path.endswith("epoch=3.ckpt")


def test_typo_in_monitor_is_a_clear_error(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="val/scroe")
    with pytest.raises(KeyError, match=r"val/scroe.*never logged.*val/score"):
        _fit(tmp_path, cb)


def test_interrupted_write_leaves_previous_files_and_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scores = [0.5, 0.9]
    cb = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}", monitor="val/score", mode="max", save_last=True)
    train, val = loaders()
    trainer = quiet_trainer(tmp_path, [cb], max_epochs=2)
    real_save = torch.save
    calls = {"n": 0}

    def failing_save(obj: object, f: object, *args: object, **kwargs: object) -> None:
        calls["n"] += 1
        # Epoch 0 serialised one file (and copied it to last.ckpt); the next write, epoch=1.ckpt, dies midway.
        if calls["n"] == 2:
            f.write(b"half a checkpoint")  # type: ignore[attr-defined]
            raise OSError("disk full")
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(Exception, match="disk full"):
        trainer.fit(Scripted(scores), train, val)
    assert _names(tmp_path) == {"epoch=0.ckpt", "last.ckpt"}  # no epoch=1.ckpt, no temporary file
    for name in ("epoch=0.ckpt", "last.ckpt"):
        state = load_checkpoint(tmp_path / name)
        assert state["progress"]["epoch"] == 0
    # The bookkeeping did not move to the file that failed.
    assert cb.best_model_path == str(tmp_path / "epoch=0.ckpt")
    assert cb.best_model_score == pytest.approx(0.5)


def test_only_rank_zero_writes(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val/score", mode="max", save_last=True)
    train, val = loaders()
    trainer = quiet_trainer(tmp_path, [cb], max_epochs=2, strategy=NotRankZero(device="cpu"))
    trainer.fit(Scripted([0.1, 0.2]), train, val)
    assert not (tmp_path / "ck").exists()
    assert cb.best_model_score == pytest.approx(0.2)  # the bookkeeping is the same on every rank


@pytest.mark.parametrize("where", ["dirpath", "default_root_dir", "save_dir"])
def test_a_url_is_refused_where_files_are_written(tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given to os.path, "s3://bucket/runs" became a local folder named "s3:" and the run wrote there.
    from callbacks import TensorBoardLogger
    from trainer import Trainer

    monkeypatch.chdir(tmp_path)
    build = {
        "dirpath": lambda: ModelCheckpoint(dirpath="s3://bucket/runs"),
        "default_root_dir": lambda: Trainer(default_root_dir="s3://bucket/runs"),
        "save_dir": lambda: TensorBoardLogger(save_dir="s3://bucket/runs"),
    }[where]
    with pytest.raises(MisconfigurationException, match=r"'s3://bucket/runs' is a URL: geartrain writes local files"):
        build()
    assert list(tmp_path.iterdir()) == []
