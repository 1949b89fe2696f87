"""Lightning's Trainer methods: parameter names and positions, return shapes, the results table, ckpt_path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F

from callbacks import ModelCheckpoint
from tests.helpers.regression import Regressor, make_dataset, make_loader
from trainer import DataModule, Trainer
from trainer.common.errors import CheckpointError


class Indexed(Regressor):
    """A regressor whose evaluation steps take ``dataloader_idx``, as Lightning's do with several loaders."""

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        super().validation_step(batch, batch_idx)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return super().predict_step(batch, batch_idx)


class Data(DataModule):
    """Train on 8 samples in batches of ``batch_size``; validate, test and predict on 6 in batches of 3."""

    def __init__(self, batch_size: int = 2) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self) -> Any:
        return make_loader(8, self.batch_size)

    def val_dataloader(self) -> Any:
        return make_loader(6, 3, seed=1)

    def test_dataloader(self) -> Any:
        return make_loader(6, 3, seed=1)

    def predict_dataloader(self) -> Any:
        return make_loader(6, 3, seed=1)


def _val_loss(module: Regressor, n: int = 6, seed: int = 1) -> float:
    x, y = make_dataset(n, seed=seed).tensors
    with torch.no_grad():
        return float(F.mse_loss(module(x), y, reduction="none").double().mean())


def test_fit_takes_lightning_names_and_a_positional_datamodule(make_trainer: Any) -> None:
    trainer = make_trainer(max_epochs=1)
    trainer.fit(model=Regressor(), datamodule=Data(batch_size=2))
    assert trainer.global_step == 4  # 8 samples in batches of 2: the datamodule's loader
    trainer = make_trainer(max_epochs=1)
    trainer.fit(Regressor(), Data(batch_size=4))  # positional, as in Lightning
    assert trainer.global_step == 2
    trainer = make_trainer(max_epochs=1)
    trainer.fit(Regressor(), train_dataloaders=make_loader(8, 8), weights_only=True)
    assert trainer.global_step == 1


def test_validate_and_test_return_one_dict_per_loader_with_lightning_parameters(make_trainer: Any) -> None:
    module = Regressor()
    expected = pytest.approx(_val_loss(module), rel=1e-6)
    trainer = make_trainer()
    assert trainer.validate(module, Data(), verbose=False) == [{"val_loss": expected}]  # positional datamodule
    assert trainer.validate(model=module, datamodule=Data(), verbose=False) == [{"val_loss": expected}]
    assert trainer.test(module, None, None, False, Data()) == [{"test_loss": expected}]  # Lightning's positions
    assert trainer.test(model=module, dataloaders=make_loader(6, 3, seed=1), verbose=False) == [{"test_loss": expected}]


def test_verbose_prints_lightning_results_table_on_rank_zero(make_trainer: Any, capsys: Any) -> None:
    module = Indexed()
    results = make_trainer().validate(module, [make_loader(6, 3, seed=1), make_loader(4, 2, seed=2)])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines[0] == lines[2] == lines[-1] and set(lines[0]) == {"─"}
    assert lines[1].split() == ["Validate", "metric", "DataLoader", "0", "DataLoader", "1"]
    # One row per metric, the loader suffix dropped, one value per loader.
    assert lines[3].split() == [
        "val_loss",
        str(results[0]["val_loss/dataloader_idx_0"]),
        str(results[1]["val_loss/dataloader_idx_1"]),
    ]
    make_trainer().test(module, make_loader(6, 3), verbose=False)
    assert capsys.readouterr().out == ""


def test_predict_returns_a_list_per_loader_and_honours_return_predictions(make_trainer: Any) -> None:
    module = Indexed()
    x, _ = make_dataset(6, seed=1).tensors
    out = make_trainer().predict(module, Data())
    assert isinstance(out, list) and len(out) == 2
    assert torch.equal(out[0], module(x[:3]).detach()) and torch.equal(out[1], module(x[3:]).detach())
    several = make_trainer().predict(module, [make_loader(6, 3, seed=1), make_loader(4, 4)])
    assert [len(o) for o in several] == [2, 1]

    class Counting(Regressor):
        calls = 0

        def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            Counting.calls += 1
            return super().predict_step(batch, batch_idx)

    counting = Counting()
    assert make_trainer().predict(counting, datamodule=Data(), return_predictions=False) is None
    assert Counting.calls == 2  # predict ran; nothing was kept


def test_ckpt_path_best_and_last_after_fit_load_those_weights(tmp_path: Path) -> None:
    best_cb = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", mode="max", save_last=True)
    trainer = Trainer(
        max_epochs=3,
        callbacks=[best_cb],
        logger=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    module = Regressor()
    trainer.fit(module, make_loader(8, 2), make_loader(6, 3, seed=1))
    assert best_cb.best_model_path and Path(best_cb.best_model_path).name != "last.ckpt"
    for which, path in (("best", best_cb.best_model_path), ("last", best_cb.last_model_path)):
        reference = Regressor()
        reference.load_state_dict(torch.load(path, weights_only=True)["state_dict"])
        module.load_state_dict(Regressor(seed=5).state_dict())  # other weights: the loading must be visible
        assert _val_loss(module) != pytest.approx(_val_loss(reference), rel=1e-6)
        result = trainer.validate(ckpt_path=which, dataloaders=make_loader(6, 3, seed=1), verbose=False)
        assert result == [{"val_loss": pytest.approx(_val_loss(reference), rel=1e-6)}]
        assert trainer.ckpt_path == str(path)
        assert _val_loss(module) == _val_loss(reference)  # the weights were loaded into the module


def test_ckpt_path_none_after_fit_evaluates_the_best_checkpoint_as_lightning(make_trainer: Any, tmp_path: Path) -> None:
    """No model and no ckpt_path after fit: Lightning's warning, then the best checkpoint is loaded and evaluated;
    with the module passed, its current weights are."""
    best_cb = ModelCheckpoint(dirpath=tmp_path / "ckpts", monitor="val_loss", save_top_k=1)
    trainer = make_trainer(max_epochs=3, callbacks=[best_cb], enable_checkpointing=True)
    module = Regressor()
    trainer.fit(module, make_loader(8, 2), make_loader(6, 3, seed=1))
    reference = Regressor()
    reference.load_state_dict(torch.load(best_cb.best_model_path, weights_only=True)["state_dict"])
    module.load_state_dict(Regressor(seed=5).state_dict())  # other weights: which ones are evaluated shows
    result = trainer.test(module, make_loader(6, 3, seed=1), verbose=False)
    assert result == [{"test_loss": pytest.approx(_val_loss(module), rel=1e-6)}]
    assert trainer.ckpt_path is None  # this run loaded nothing
    with pytest.warns(UserWarning, match=r"`.test\(ckpt_path=None\)` was called without a model. The best model"):
        result = trainer.test(dataloaders=make_loader(6, 3, seed=1), verbose=False)
    assert result == [{"test_loss": pytest.approx(_val_loss(reference), rel=1e-6)}]
    assert trainer.ckpt_path == best_cb.best_model_path
    without = make_trainer(max_epochs=1)
    without.fit(Regressor(), make_loader(4, 2))
    with pytest.warns(UserWarning, match="The best model"), pytest.raises(ValueError, match="'best'"):
        without.validate(dataloaders=make_loader(4, 2))  # no checkpoint callback: no best checkpoint, as Lightning
    with pytest.raises(CheckpointError, match="'best'"):
        make_trainer().test(Regressor(), make_loader(6, 3), ckpt_path="best")


def test_save_checkpoint_takes_lightning_parameters(make_trainer: Any, tmp_path: Path) -> None:
    trainer = make_trainer(max_epochs=1)
    trainer.fit(Regressor(), make_loader(4, 2))
    trainer.save_checkpoint(filepath=tmp_path / "w.ckpt", weights_only=True, storage_options=None)
    trainer.save_checkpoint(tmp_path / "full.ckpt", None)
    assert "optimizer_states" not in torch.load(tmp_path / "w.ckpt", weights_only=True)
    assert "optimizer_states" in torch.load(tmp_path / "full.ckpt", weights_only=True)
    with pytest.raises(ValueError, match="storage_options"):
        trainer.save_checkpoint(tmp_path / "x.ckpt", storage_options={"bucket": "b"})


def test_current_epoch_counts_finished_epochs_as_lightning(tmp_path: Path) -> None:
    seen: list[tuple[str, int]] = []

    class Watch(Regressor):
        def on_train_epoch_start(self) -> None:
            seen.append(("start", self.current_epoch))

        def on_train_epoch_end(self) -> None:
            seen.append(("end", self.current_epoch))

        def on_train_end(self) -> None:
            seen.append(("train_end", self.current_epoch))

    cb = ModelCheckpoint(dirpath=tmp_path / "ck", save_top_k=-1, filename="{epoch}")
    trainer = Trainer(max_epochs=3, callbacks=[cb], logger=False, enable_progress_bar=False, default_root_dir=tmp_path)
    trainer.fit(Watch(), make_loader(4, 2))
    assert trainer.current_epoch == 3
    assert seen == [("start", 0), ("end", 0), ("start", 1), ("end", 1), ("start", 2), ("end", 2), ("train_end", 3)]
    # Callbacks' on_train_epoch_end still sees the ending epoch: files are named 0, 1, 2, and the
    # checkpoints' progress is what it always was (the finished epoch, resuming at the next one).
    assert sorted(p.name for p in (tmp_path / "ck").glob("epoch=*.ckpt")) == [f"epoch={e}.ckpt" for e in range(3)]
    progress = torch.load(tmp_path / "ck" / "epoch=2.ckpt", weights_only=True)["progress"]
    assert (progress["epoch"], progress["epoch_finished"]) == (2, True)
