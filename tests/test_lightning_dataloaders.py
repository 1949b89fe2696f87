"""Several dataloaders per stage, as Lightning runs them: dataloader_idx, key suffixes, max_size_cycle."""

from __future__ import annotations

import itertools
import pickle
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


def test_train_dataloader_is_the_loader_given(make_trainer: Any) -> None:
    """As Lightning: a loader the trainer need not change is the one given (its ``batch_size`` readable),
    though the loop iterates a resumable copy of it."""
    loader = make_loader(10, 2)
    trainer = make_trainer(max_epochs=1)
    trainer.fit(Regressor(), loader)
    assert trainer.train_dataloader is loader and trainer.train_dataloader.batch_size == 2


class Nested(Regressor):
    """Trains on ``{"a": [batch, batch], "b": batch}``: the mean of the three losses."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        assert isinstance(batch, dict) and len(batch["a"]) == 2
        parts = [*batch["a"], batch["b"]]
        return sum(F.mse_loss(self(x), y) for x, y in parts) / 3


@pytest.mark.parametrize(("mode", "batches"), [("min_size", 2), ("max_size_cycle", 5)])
def test_a_nested_collection_of_train_loaders_combines_as_lightnings(
    make_trainer: Any, mode: str, batches: int
) -> None:
    from trainer.lightning.utilities.combined_loader import CombinedLoader

    def loaders() -> Any:
        return {"a": [make_loader(10, 2), make_loader(6, 2, seed=1)], "b": make_loader(4, 2, seed=2)}

    module = Nested()
    net = plain_copy(module)
    trainer = make_trainer(max_epochs=1)
    trainer.fit(module, CombinedLoader(loaders(), mode))
    assert trainer.num_training_batches == batches == trainer.global_step
    shown = trainer.train_dataloader
    assert list(shown) == ["a", "b"] and len(shown["a"]) == 2
    opt = sgd(net)
    a1, a2, b = loaders()["a"][0], loaders()["a"][1], loaders()["b"]
    cycle = itertools.cycle if mode == "max_size_cycle" else iter
    for parts in itertools.islice(zip(a1, cycle(a2), cycle(b)), batches):
        loss = sum(F.mse_loss(net(x), y) for x, y in parts) / 3
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert_same_weights(module.net, net)


def test_combined_loader_is_lightnings() -> None:
    from trainer.lightning.utilities.combined_loader import CombinedLoader

    class Started(torch.utils.data.DataLoader):  # type: ignore[type-arg]
        started = False

        def _get_iterator(self) -> Any:
            self.started = True
            return super()._get_iterator()

    combined = CombinedLoader([[0], [[1], [[2]]]])  # a list of numbers only is one iterable
    assert combined.flattened == [[0], [1], [2]]
    with pytest.raises(RuntimeError, match=r"Please call `iter\(combined_loader\)` first"):
        len(combined)
    combined.flattened = [[3], [2], [1]]
    assert combined.iterables == [[3], [[2], [[1]]]]
    for mode, started in (("min_size", [True, True]), ("sequential", [True, False])):
        loaders = [Started(range(4), batch_size=2), Started(range(6), batch_size=2)]
        iter(CombinedLoader(loaders, mode))  # starts the iterators (their workers) at once
        assert [loader.started for loader in loaders] == started
    combined = CombinedLoader([torch.utils.data.DataLoader(range(4)), list(range(3))])
    next(iter(combined))
    pickle.loads(pickle.dumps(combined))  # mid-pass too (a module holding it goes to ddp_spawn's workers)


def test_sequential_mode_in_fit_is_refused_in_lightnings_words(make_trainer: Any) -> None:
    from trainer.lightning.utilities.combined_loader import CombinedLoader

    with pytest.raises(ValueError, match="`FitLoop` does not support"):
        make_trainer().fit(Regressor(), CombinedLoader([make_loader(4, 2)], "sequential"))


def test_spawned_workers_that_are_not_persistent_get_lightnings_advice(make_trainer: Any) -> None:
    loader = torch.utils.data.DataLoader(make_dataset(8), num_workers=1, multiprocessing_context="spawn")
    with pytest.warns(UserWarning, match="Consider setting `persistent_workers=True` in 'train_dataloader'"):
        make_trainer(max_epochs=1, limit_train_batches=0).fit(Regressor(), loader)  # no batch: no worker started


def test_seed_everything_sets_lightnings_variables_too() -> None:
    import os

    from trainer import seed_everything

    seed_everything(3, workers=True)
    assert (os.environ["PL_GLOBAL_SEED"], os.environ["PL_SEED_WORKERS"]) == ("3", "1")


class OneInAList(Regressor):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        (inner,) = batch.values() if isinstance(batch, dict) else batch  # Lightning's batch keeps the collection
        return super().training_step(inner, batch_idx)


@pytest.mark.parametrize("as_dict", [False, True])
def test_one_loader_in_a_collection_keeps_the_collection_and_trains_as_the_loader(
    make_trainer: Any, as_dict: bool
) -> None:
    module, plain = OneInAList(), Regressor()
    loader = make_loader(10, 2)
    trainer = make_trainer(max_epochs=2)
    trainer.fit(module, {"only": loader} if as_dict else [loader])
    make_trainer(max_epochs=2).fit(plain, make_loader(10, 2))
    assert_same_weights(module.net, plain.net)
    assert trainer.train_dataloader == ({"only": loader} if as_dict else [loader])


def test_one_shuffled_loader_in_a_list_resumes_mid_epoch_exactly(make_trainer: Any, tmp_path: Any) -> None:
    from trainer import seed_everything

    def loaders() -> list[Any]:
        return [torch.utils.data.DataLoader(make_dataset(20), batch_size=2, shuffle=True)]

    seed_everything(1)
    whole = OneInAList()
    make_trainer(max_epochs=2).fit(whole, loaders())
    seed_everything(1)
    module = OneInAList()
    first = make_trainer(max_steps=3)  # stops mid-epoch 0
    first.fit(module, loaders())
    first.save_checkpoint(tmp_path / "mid.ckpt")
    resumed = OneInAList()
    make_trainer(max_epochs=2).fit(resumed, loaders(), ckpt_path=tmp_path / "mid.ckpt")
    assert_same_weights(resumed.net, whole.net)


class _SeesBatches(TrainModule):
    """Records every test batch and its index (a module with no parameters: the batches are plain numbers)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[Any, int]] = []

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.seen.append((batch, batch_idx))


@pytest.mark.parametrize("loaders", [[0], (1.5, 2.5), ["a", "b"]])
def test_a_list_of_numbers_or_strings_is_one_loader_of_those_batches(loaders: Any) -> None:
    """Lightning's rule: a list of primitives is one iterable whose items are the batches (``trainer.test(m, [0])``)."""
    module = _SeesBatches()
    Trainer(barebones=True, accelerator="cpu").test(module, loaders)
    assert module.seen == [(item, i) for i, item in enumerate(loaders)]


def test_lists_of_numbers_in_a_list_are_one_loader_each_as_in_lightning(make_trainer: Any) -> None:
    class Echo(Regressor):
        def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
            return (batch, batch_idx, dataloader_idx)

    trainer = make_trainer()
    assert trainer.predict(Echo(), [[0, 1], [2, 3]]) == [[(0, 0, 0), (1, 1, 0)], [(2, 0, 1), (3, 1, 1)]]
    assert trainer.predict(Echo(), [0, 1]) == [(0, 0, 0), (1, 1, 0)]  # a list of numbers alone: one loader
