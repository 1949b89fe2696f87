"""Where data comes from and what validate/test/predict return."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, IterableDataset

from tests.helpers.regression import Regressor, assert_same_weights, make_dataset, make_loader, plain_copy, sgd
from tests.helpers.tiny_mlp import Batches, TinyMLP, make_batches
from tests.helpers.trainers import quiet_trainer
from trainer import DataModule


def test_predict_returns_every_batch_in_order(make_trainer: Any) -> None:
    module = Regressor()
    outputs = make_trainer().predict(module, make_loader(10, 4))
    assert [len(o) for o in outputs] == [4, 4, 2]
    x = make_dataset(10).tensors[0]
    with torch.no_grad():  # batch by batch: a matmul over all 10 rows may round differently
        expected = torch.cat([module(x[:4]), module(x[4:8]), module(x[8:])])
    assert torch.equal(torch.cat(outputs), expected)
    assert module.training  # the module's mode is restored afterwards


def test_validate_and_test_return_hand_computed_metrics(make_trainer: Any) -> None:
    module = Regressor()
    x, y = make_dataset(10).tensors
    with torch.no_grad():
        per_sample = F.mse_loss(module(x), y, reduction="none").squeeze(1)
    expected = float(per_sample.double().mean())  # the mean over samples = the size-weighted batch mean
    trainer = make_trainer()
    assert trainer.validate(module, make_loader(10, 4))[0] == {"val_loss": pytest.approx(expected, rel=1e-6)}
    assert trainer.test(module, make_loader(10, 4))[0] == {"test_loss": pytest.approx(expected, rel=1e-6)}
    assert trainer.global_step == 0


def test_validate_mean_matches_hand_computed() -> None:
    batches = Batches([(x[: 10 + i], y[: 10 + i]) for i, (x, y) in enumerate(make_batches(5).batches)])
    torch.manual_seed(0)
    model = TinyMLP()
    result = quiet_trainer(strategy="auto", num_sanity_val_steps=2).validate(model, dataloaders=batches)[0]
    with torch.no_grad():
        losses = [nn.functional.cross_entropy(model.net(x), y).double() * len(x) for x, y in batches]
    expected = float(sum(losses) / sum(len(x) for x, _ in batches))
    assert result["val/loss"] == pytest.approx(expected, rel=1e-6)


class RecordingData(DataModule):
    """A DataModule that records its calls and serves batches of ``batch_size``."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.calls: list[str] = []

    def prepare_data(self) -> None:
        self.calls.append("prepare_data")

    def setup(self, stage: str) -> None:
        self.calls.append("setup:" + stage)  # Lightning passes TrainerFn (a str enum): its value

    def teardown(self, stage: str) -> None:
        self.calls.append("teardown:" + stage)

    def loader(self) -> DataLoader[Any]:
        return make_loader(8, self.batch_size)

    def train_dataloader(self) -> DataLoader[Any]:
        return self.loader()

    def val_dataloader(self) -> DataLoader[Any]:
        return self.loader()

    def test_dataloader(self) -> DataLoader[Any]:
        return self.loader()

    def predict_dataloader(self) -> DataLoader[Any]:
        return self.loader()


def test_datamodule_setup_gets_each_stage(make_trainer: Any) -> None:
    data = RecordingData(batch_size=4)
    module = Regressor()
    trainer = make_trainer(max_epochs=1)
    trainer.fit(module, datamodule=data)
    trainer.validate(module, datamodule=data)
    trainer.test(module, datamodule=data)
    trainer.predict(module, datamodule=data)
    stages = ("fit", "validate", "test", "predict")
    assert data.calls == [c for s in stages for c in ("prepare_data", f"setup:{s}", f"teardown:{s}")]
    assert trainer.global_step == 2


def test_dataloader_precedence_explicit_then_datamodule_then_module(make_trainer: Any) -> None:
    class WithLoaders(Regressor):
        def train_dataloader(self) -> DataLoader[Any]:
            return make_loader(8, 8)

        def predict_dataloader(self) -> DataLoader[Any]:
            return make_loader(8, 8)

    def steps(**sources: Any) -> int:
        trainer = make_trainer(max_epochs=1)
        trainer.fit(WithLoaders(), **sources)
        return trainer.global_step

    assert steps() == 1  # the module's own loader: one batch of 8
    assert steps(datamodule=RecordingData(4)) == 2
    assert steps(train_dataloaders=make_loader(8, 2), datamodule=RecordingData(4)) == 4
    assert len(make_trainer().predict(WithLoaders())) == 1


def test_missing_data_is_a_clear_error(make_trainer: Any) -> None:
    # (Several loaders are supported since issue #13: tests/test_lightning_dataloaders.py.)
    with pytest.raises(ValueError, match=r"No data for fit.*train_dataloader\(\)"):
        make_trainer(max_epochs=1).fit(Regressor())


class Stream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """An unsized stream over :func:`make_dataset` (the trainer cannot ask for its length)."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        yield from zip(*make_dataset(10).tensors)


def test_unsized_loader_closes_the_last_accumulation_window(make_trainer: Any) -> None:
    module = Regressor()
    net = plain_copy(module)
    trainer = make_trainer(max_epochs=2, accumulate_grad_batches=2)
    trainer.fit(module, DataLoader(Stream(), batch_size=2))  # 5 batches: steps after 2, 4 and 5
    opt = sgd(net)
    for _ in range(2):
        for i, (x, y) in enumerate(make_loader(10, 2)):
            (F.mse_loss(net(x), y) / 2).backward()
            if i % 2 == 1 or i == 4:
                opt.step()
                opt.zero_grad(set_to_none=True)
    assert trainer.global_step == 6
    assert_same_weights(module.net, net)


def test_str_of_a_datamodule_lists_each_stages_dataset_size(make_trainer: Any) -> None:
    """``str(dm)`` as Lightning prints it; ``trainer.datamodule`` is assignable, as Lightning's plain attribute."""
    import os

    class Endless(IterableDataset[torch.Tensor]):
        def __iter__(self) -> Iterator[torch.Tensor]:
            yield torch.zeros(2)

    class Data(DataModule):
        def setup(self, stage: str) -> None:
            self.ready = True

        def train_dataloader(self) -> Any:
            if not getattr(self, "ready", False):
                raise RuntimeError("setup first")
            return make_loader(6, 2)

        def val_dataloader(self) -> Any:
            return [make_loader(4, 2), DataLoader(Endless(), batch_size=None)]

    dm = Data()
    none, lists = "{Train dataloader: None}", "{Validation dataloader: 1. size=4 ; 2. size=NA}"
    assert str(dm) == os.linesep.join([none, lists, "{Test dataloader: None}", "{Predict dataloader: None}"])
    dm.setup("fit")
    assert str(dm).splitlines()[0] == "{Train dataloader: size=6}"
    trainer = make_trainer()
    trainer.datamodule = dm
    assert trainer.datamodule is dm


def test_no_dataloader_is_lightnings_type_error(make_trainer: Any) -> None:
    """As Lightning: a missing loader, or a method returning None, is a TypeError naming the call or the method."""
    with pytest.raises(
        TypeError, match=r"An invalid dataloader was passed to `Trainer.fit\(train_dataloaders=\.\.\.\)`"
    ):
        make_trainer(max_epochs=1).fit(Regressor(), train_dataloaders=None)
    with pytest.raises(TypeError, match=r"An invalid dataloader was passed to `Trainer.test\(dataloaders=\.\.\.\)`"):
        make_trainer().test(Regressor())

    class ReturnsNone(Regressor):
        def predict_dataloader(self) -> Any:
            return None

    with pytest.raises(TypeError, match=r"invalid dataloader was returned from `ReturnsNone.predict_dataloader\(\)`"):
        make_trainer().predict(ReturnsNone())
