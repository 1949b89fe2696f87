"""Several dataloaders per stage, as Lightning runs them: dataloader_idx, key suffixes, max_size_cycle."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch.nn import functional as F

from callbacks import Callback
from tests.helpers.regression import Regressor, assert_same_weights, make_dataset, make_loader, plain_copy, sgd
from trainer import Trainer, TrainModule
from trainer.common.errors import MisconfigurationException


class TwoLoaders(Regressor):
    """Records the calls of the validation step and its batch hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = []

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.calls.append(("step", batch_idx, dataloader_idx))
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y))

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.calls.append(("start", batch_idx, dataloader_idx))

    def on_validation_epoch_end(self) -> None:
        self.log("shared", 1.0)


class HookArgs(Callback):
    def __init__(self) -> None:
        self.ends: list[tuple[Any, ...]] = []

    def on_validation_batch_end(self, trainer: Trainer, module: TrainModule, *args: Any) -> None:
        self.ends.append(args[2:])  # after outputs and batch: batch_idx[, dataloader_idx]


def _loss(module: Regressor, n: int, seed: int) -> float:
    x, y = make_dataset(n, seed=seed).tensors
    with torch.no_grad():
        return float(F.mse_loss(module(x), y, reduction="none").double().mean())


def test_several_val_loaders_get_dataloader_idx_suffixes_and_one_result_each(make_trainer: Any) -> None:
    module, recorder = TwoLoaders(), HookArgs()
    trainer = make_trainer(callbacks=[recorder])
    results = trainer.validate(module, [make_loader(6, 3, seed=1), make_loader(4, 4, seed=2)], verbose=False)
    assert module.calls == [
        ("start", 0, 0), ("step", 0, 0), ("start", 1, 0), ("step", 1, 0), ("start", 0, 1), ("step", 0, 1),
    ]  # fmt: skip
    assert recorder.ends == [(0, 0), (1, 0), (0, 1)]
    assert results == [
        {"val_loss/dataloader_idx_0": pytest.approx(_loss(module, 6, 1), rel=1e-6), "shared": 1.0},
        {"val_loss/dataloader_idx_1": pytest.approx(_loss(module, 4, 2), rel=1e-6), "shared": 1.0},
    ]
    assert trainer.num_val_batches == [2, 1]
    assert "val_loss/dataloader_idx_1" in trainer.callback_metrics


def test_a_dict_of_val_loaders_runs_in_order(make_trainer: Any) -> None:
    module = TwoLoaders()
    results = make_trainer().validate(module, {"a": make_loader(3, 3), "b": make_loader(4, 2)}, verbose=False)
    assert [sorted(r) for r in results] == [
        ["shared", "val_loss/dataloader_idx_0"],
        ["shared", "val_loss/dataloader_idx_1"],
    ]
    assert [c for c in module.calls if c[0] == "step"] == [("step", 0, 0), ("step", 0, 1), ("step", 1, 1)]


def test_one_val_loader_passes_no_dataloader_idx_and_no_suffix(make_trainer: Any) -> None:
    module, recorder = TwoLoaders(), HookArgs()
    results = make_trainer(callbacks=[recorder]).validate(module, make_loader(6, 3), verbose=False)
    assert list(results[0]) == ["val_loss", "shared"]
    assert recorder.ends == [(0,), (1,)]  # Lightning passes dataloader_idx to hooks only for several loaders
    assert module.calls[:2] == [("start", 0, 0), ("step", 0, 0)]  # the defaults, not passed values


def test_several_loaders_need_a_step_taking_dataloader_idx(make_trainer: Any) -> None:
    with pytest.raises(TypeError, match=r"validation_step\(batch, batch_idx, dataloader_idx\).*dataloader_idx"):
        make_trainer().validate(Regressor(), [make_loader(), make_loader()], verbose=False)


def test_fit_validates_on_several_loaders(make_trainer: Any) -> None:
    module = TwoLoaders()
    trainer = make_trainer(max_epochs=1)
    trainer.fit(module, make_loader(4, 2), [make_loader(6, 3, seed=1), make_loader(4, 4, seed=2)])
    assert float(trainer.callback_metrics["val_loss/dataloader_idx_1"]) == pytest.approx(_loss(module, 4, 2), rel=1e-6)
    assert len(trainer.val_dataloaders) == 2


class Paired(Regressor):
    """Trains on a list (or dict) batch: the mean of both loaders' losses."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        parts = batch.values() if isinstance(batch, dict) else batch
        return sum(F.mse_loss(self(x), y) for x, y in parts) / 2


@pytest.mark.parametrize("as_dict", [False, True])
def test_several_train_loaders_combine_in_max_size_cycle_mode(make_trainer: Any, as_dict: bool) -> None:
    module = Paired()
    net = plain_copy(module)
    long, short = make_loader(10, 2), make_loader(4, 2, seed=3)  # 5 batches and 2, cycled
    trainer = make_trainer(max_epochs=2)
    trainer.fit(module, {"long": long, "short": short} if as_dict else [long, short])
    assert trainer.global_step == 10 and trainer.num_training_batches == 5
    opt = sgd(net)
    for _ in range(2):
        for (x1, y1), (x2, y2) in zip(make_loader(10, 2), itertools.cycle(make_loader(4, 2, seed=3))):
            loss = (F.mse_loss(net(x1), y1) + F.mse_loss(net(x2), y2)) / 2
            loss.backward()
            opt.step()
            opt.zero_grad()
    assert_same_weights(module.net, net)
    loaders = trainer.train_dataloader
    assert (list(loaders) == ["long", "short"]) if as_dict else (len(loaders) == 2)


class NoLength:
    """A loader whose ``__len__`` raises ``NotImplementedError`` (Lightning's way to say 'no length')."""

    def __init__(self, n: int) -> None:
        self.loader = make_loader(n, 2)

    def __iter__(self) -> Any:
        return iter(self.loader)

    def __len__(self) -> int:
        raise NotImplementedError


def test_a_len_raising_not_implemented_is_a_loader_without_length(make_trainer: Any) -> None:
    """It trains as an unsized loader (same weights as the sized one); a fraction of it is refused as Lightning."""
    sized, unsized = Regressor(), Regressor()
    make_trainer(max_epochs=2).fit(sized, make_loader(8, 2))
    trainer = make_trainer(max_epochs=2)
    trainer.fit(unsized, NoLength(8))
    assert_same_weights(sized, unsized)
    assert trainer.num_training_batches == float("inf")
    pattern = r"When using an `IterableDataset`, `Trainer\(limit_val_batches\)` must be `1.0` or an int"
    with pytest.raises(MisconfigurationException, match=pattern):
        make_trainer(limit_val_batches=0.5).validate(Regressor(), NoLength(8))


class TransferIdx(TwoLoaders):
    def __init__(self) -> None:
        super().__init__()
        self.transfer_idx: list[int] = []

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.transfer_idx.append(dataloader_idx)
        return batch


def test_batch_transfer_hooks_get_the_loaders_index_in_evaluation(make_trainer: Any) -> None:
    """As Lightning: the evaluation loader's index (training: 0) reaches the batch transfer hooks."""
    module = TransferIdx()
    make_trainer().validate(module, [make_loader(4, 2), make_loader(2, 2)], verbose=False)
    assert module.transfer_idx == [0, 0, 1]
    module.transfer_idx.clear()
    make_trainer(max_epochs=1, limit_val_batches=0).fit(module, make_loader(4, 2))
    assert module.transfer_idx == [0, 0]
