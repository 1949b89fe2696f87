"""Tuner.lr_find and Tuner.scale_batch_size, and their callbacks: results, restored state, attributes set."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import BatchSizeFinder, LearningRateFinder
from trainer import Trainer, TrainModule, Tuner, seed_everything
from trainer.common.errors import MisconfigurationException


def _data(n: int = 256, batch_size: int = 16) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True)


class Regression(TrainModule):
    def __init__(self, lr: float = 0.05, batch_size: int = 16, oom_above: int | None = None) -> None:
        super().__init__()
        self.lr, self.batch_size, self.oom_above = lr, batch_size, oom_above
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 1))
        self.seen_sizes: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.seen_sizes.append(len(x))
        if self.oom_above is not None and len(x) > self.oom_above:
            raise torch.OutOfMemoryError(f"CUDA out of memory (simulated: batch of {len(x)} > {self.oom_above})")
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)}

    def train_dataloader(self) -> DataLoader[Any]:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(256, 4, generator=g)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=self.batch_size, shuffle=True)


def _trainer(**kwargs: Any) -> Trainer:
    kwargs = {"max_epochs": 2, "logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
              "enable_model_summary": False, **kwargs}  # fmt: skip
    return Trainer(**kwargs)


def _weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_lr_find_restores_weights_and_the_trainer_fits_as_a_fresh_one() -> None:
    seed_everything(1)
    module = Regression()
    before = _weights(module)
    trainer = _trainer()
    result = Tuner(trainer).lr_find(module, num_training=30, update_attr=False)
    assert result is not None
    assert len(result.results["lr"]) == len(result.results["loss"]) > 10
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert module.lr == 0.05 and trainer.global_step == 0
    trainer.fit(module)
    # The same job on a fresh trainer and module, from the same seed: identical weights.
    seed_everything(1)
    fresh = Regression()
    fresh_trainer = _trainer()
    fresh_trainer.fit(fresh)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in module.state_dict().items())
    assert trainer.global_step == fresh_trainer.global_step
    assert (
        trainer.lr_scheduler_configs[0].scheduler.get_last_lr()
        == fresh_trainer.lr_scheduler_configs[0].scheduler.get_last_lr()
    )


def test_lr_find_sweeps_exponentially_and_sets_the_suggestion() -> None:
    module = Regression()
    result = Tuner(_trainer()).lr_find(module, min_lr=1e-6, max_lr=1.0, num_training=40, early_stop_threshold=None)
    assert result is not None
    lrs = result.results["lr"]
    assert len(lrs) == 40 and lrs[0] == pytest.approx(1e-6)
    ratios = [b / a for a, b in itertools.pairwise(lrs)]
    assert max(ratios) == pytest.approx(min(ratios)) and ratios[0] == pytest.approx((1.0 / 1e-6) ** (1 / 40))
    suggestion = result.suggestion()
    assert suggestion is not None and module.lr == suggestion
    linear = Tuner(_trainer()).lr_find(
        Regression(), min_lr=0.01, max_lr=0.5, num_training=20, mode="linear", update_attr=False
    )
    assert linear is not None
    steps = [b - a for a, b in itertools.pairwise(linear.results["lr"])]
    assert max(steps) == pytest.approx(min(steps))


class Quadratic(TrainModule):
    """Each batch reports loss(w) = h/2 * |w|^2 after one SGD step from w = 1 at the previous batch's rate.

    So the loss at rate ``lr`` is ``h/2 * 16 * (1 - lr*h)^2``: it falls while ``lr < 1/h`` (the best rate,
    one step to the minimum) and grows past the start once ``lr > 2/h`` (SGD diverges).
    """

    h = 4.0

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(16))
        self.lr = 1.0
        self.probe = torch.ones(16)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.probe = self.w.detach().clone()
        with torch.no_grad():
            self.w.fill_(1.0)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        # Value: the loss where the last step landed; gradient: the loss's at w = 1.
        return 0.5 * self.h * ((self.w**2).sum() - 16 + (self.probe**2).sum())

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(torch.ones(64, 1)), batch_size=1)


def test_lr_find_stops_on_divergence_and_suggests_a_stable_rate() -> None:
    result = Tuner(_trainer()).lr_find(Quadratic(), min_lr=1e-3, max_lr=100.0, num_training=100)
    assert result is not None
    lrs = result.results["lr"]
    diverges = 2 / Quadratic.h
    # Stopped early: past the divergence point, well before the sweep's end.
    assert len(lrs) < 100 and lrs[-1] > diverges
    suggestion = result.suggestion()
    assert suggestion is not None and 1e-3 * 10 < suggestion < diverges, (suggestion, lrs[-1])


def test_lr_find_refuses_a_module_without_a_learning_rate_attribute_before_running() -> None:
    class NoLr(Regression):
        def __init__(self) -> None:
            super().__init__()
            del self.lr

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = NoLr()
    with pytest.raises(AttributeError, match="learning_rate"):
        Tuner(_trainer()).lr_find(module, num_training=5)
    assert module.seen_sizes == []
    with pytest.raises(ValueError, match="method='fit'"):
        Tuner(_trainer()).lr_find(module, method="validate")


def test_lr_find_sets_hparams_lr() -> None:
    class Hp(Regression):
        def __init__(self, lr: float = 0.05) -> None:
            super().__init__()
            del self.lr
            self.save_hyperparameters()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    module = Hp()
    result = Tuner(_trainer()).lr_find(module, num_training=30)
    assert result is not None and module.hparams.lr == result.suggestion() != 0.05


@pytest.mark.parametrize(("mode", "expected"), [("power", 32), ("binsearch", 44)])
def test_scale_batch_size_finds_the_largest_size_that_fits(mode: str, expected: int) -> None:
    module = Regression(batch_size=16, oom_above=47)
    before = _weights(module)
    trainer = _trainer()
    size = Tuner(trainer).scale_batch_size(module, mode=mode, steps_per_trial=2, init_val=2)
    # power: 2, 4, ..., 32 fit, 64 fails. binsearch: then 48 fails, 40, 44, 46, 47 fit -> 47, less the 5% margin: 44.
    assert size == expected and module.batch_size == expected
    assert max(module.seen_sizes) > 47  # a trial did run out of memory
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert trainer.global_step == 0
    module.seen_sizes.clear()
    trainer.fit(module)
    assert set(module.seen_sizes) <= {expected, 256 % expected}


def test_finder_callbacks_run_at_fit_start_and_the_fit_uses_the_result() -> None:
    module = Regression(batch_size=8, oom_above=20)
    finder = BatchSizeFinder(steps_per_trial=1, init_val=4)
    lr_finder = LearningRateFinder(num_training_steps=20)
    trainer = _trainer(max_epochs=1, callbacks=[finder, lr_finder])
    trainer.fit(module)
    assert finder.optimal_batch_size == 16 and module.batch_size == 16
    assert lr_finder.optimal_lr is not None and module.lr == lr_finder.optimal_lr.suggestion()
    # The fit's own steps: one epoch at the found size, after the trials were undone.
    assert trainer.global_step == 256 // 16
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(module.lr * 0.5)  # StepLR after one epoch


def test_lr_find_draws_the_curve_in_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from callbacks import TensorBoardLogger

    logger = TensorBoardLogger(save_dir=tmp_path, name="tb", version="")
    trainer = _trainer(logger=logger)
    result = Tuner(trainer).lr_find(Regression(), num_training=25)
    assert result is not None
    acc = EventAccumulator(str(logger.log_dir))
    acc.Reload()
    (image,) = acc.Images("lr_find")  # one figure: the curve with the suggestion marked
    assert image.encoded_image_string.startswith(b"\x89PNG") and image.width > 300
    assert trainer.logger is logger and logger in trainer.callbacks  # the trainer keeps its logger


def test_lr_find_without_matplotlib_writes_the_curve_as_scalars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from callbacks import TensorBoardLogger

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    logger = TensorBoardLogger(save_dir=tmp_path, name="tb", version="")
    result = Tuner(_trainer(logger=logger)).lr_find(Regression(), num_training=25)
    assert result is not None
    with pytest.raises(ImportError, match="pip install matplotlib"):
        result.plot()
    acc = EventAccumulator(str(logger.log_dir))
    acc.Reload()
    losses = [e.value for e in acc.Scalars("lr_find/loss")]
    lrs = [e.value for e in acc.Scalars("lr_find/lr")]
    assert losses == pytest.approx(result.results["loss"], rel=1e-6)
    assert lrs == pytest.approx(result.results["lr"], rel=1e-6)


@pytest.mark.slow
def test_tuner_under_ddp_restores_the_weights_and_sets_the_results_in_the_caller() -> None:
    module = Regression(batch_size=8, oom_above=20)
    before = _weights(module)
    trainer = _trainer(strategy="ddp_spawn", devices=2, accelerator="cpu")
    tuner = Tuner(trainer)
    result = tuner.lr_find(module, num_training=20, early_stop_threshold=None)
    assert result is not None and len(result.results["lr"]) == 20  # rank 0's curve came back
    assert module.lr == result.suggestion()
    # The loader's batch size is per rank, as in Lightning: 16 fits on each, 32 runs out of memory.
    size = tuner.scale_batch_size(module, steps_per_trial=1, init_val=4)
    assert size == 16 and module.batch_size == 16
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())


def test_a_finder_in_a_resumed_fit_leaves_the_resume_exact(tmp_path: Path) -> None:
    seed_everything(2)
    first = Regression()
    start = _trainer(max_steps=5)
    start.fit(first)  # stops mid-epoch: the resume replays the epoch's shuffled order
    ckpt = tmp_path / "mid.ckpt"
    start.save_checkpoint(ckpt)
    resumed = []
    for callbacks in ([], [LearningRateFinder(num_training_steps=12, update_attr=False)]):
        module = Regression()
        trainer = _trainer(max_epochs=2, callbacks=callbacks)
        trainer.fit(module, ckpt_path=ckpt)
        resumed.append((module.state_dict(), trainer.global_step))
    (plain, plain_steps), (tuned, tuned_steps) = resumed
    assert plain_steps == tuned_steps > 5
    assert all(torch.equal(plain[k], v) for k, v in tuned.items())


class TwoOptimizers(Regression):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        for opt in self.optimizers():
            opt.zero_grad()
            self.manual_backward(loss, retain_graph=True)
            opt.step()
        return loss

    def configure_optimizers(self) -> Any:
        return [torch.optim.SGD(self.parameters(), lr=self.lr), torch.optim.Adam(self.parameters(), lr=self.lr)]


def test_the_tuners_refusals_are_lightnings() -> None:
    """Lightning's exception types and words: several optimizers, loaders passed to fit, bad methods and modes."""
    with pytest.raises(MisconfigurationException, match="returned 2, but learning rate finder only works with single"):
        Tuner(_trainer()).lr_find(TwoOptimizers(), num_training=5)
    with pytest.raises(MisconfigurationException, match="Batch size finder cannot be used with dataloaders passed"):
        Tuner(_trainer()).scale_batch_size(Regression(), train_dataloaders=_data(), max_trials=2)
    with pytest.raises(ValueError, match="method 'prediction' is invalid"):
        Tuner(_trainer()).scale_batch_size(Regression(), method="prediction")
    with pytest.raises(MisconfigurationException, match="please consider setting `dataloaders` instead"):
        Tuner(_trainer()).scale_batch_size(Regression(), val_dataloaders=_data(), method="validate")
    with pytest.raises(ValueError, match="`mode` should be either of"):
        Tuner(_trainer()).scale_batch_size(Regression(), mode="triple")


def test_lr_find_sweeps_down_when_min_lr_is_above_max_lr_and_zero_trials_keep_the_size() -> None:
    result = Tuner(_trainer()).lr_find(Regression(), min_lr=1.0, max_lr=1e-4, num_training=5, update_attr=False)
    assert result is not None
    lrs = result.results["lr"]
    assert lrs == sorted(lrs, reverse=True) and all(1e-4 <= lr <= 1.0 for lr in lrs)
    module = Regression(batch_size=16)
    assert Tuner(_trainer()).scale_batch_size(module, max_trials=0, init_val=4) == 4
    assert module.batch_size == 4 and module.seen_sizes == []


class Evaluated(Regression):
    """Every stage's loader reads ``batch_size``; each step records its batch's size and "runs out of memory"
    above ``oom_above``."""

    def _eval(self, batch: Any) -> torch.Tensor:
        x, y = batch
        self.seen_sizes.append(len(x))
        if self.oom_above is not None and len(x) > self.oom_above:
            raise torch.OutOfMemoryError(f"CUDA out of memory (simulated: batch of {len(x)} > {self.oom_above})")
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self._eval(batch))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test_loss", self._eval(batch))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._eval(batch)

    val_dataloader = test_dataloader = predict_dataloader = Regression.train_dataloader


@pytest.mark.parametrize("method", ["validate", "test", "predict"])
def test_scale_batch_size_searches_on_evaluation_methods_as_lightning(method: str) -> None:
    """Lightning's search runs the stage's own batches: power doubles 2..32, 64 runs out of memory."""
    module = Evaluated(batch_size=16, oom_above=47)
    before = _weights(module)
    trainer = _trainer()
    size = Tuner(trainer).scale_batch_size(module, method=method, steps_per_trial=2, init_val=2)
    assert size == 32 and module.batch_size == 32
    assert module.seen_sizes == [2, 2, 4, 4, 8, 8, 16, 16, 32, 32, 64]  # trials of 2 batches, no evaluation after
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert trainer.global_step == 0 and trainer.callback_metrics == {}
    loaders = {"validate": trainer.val_dataloaders, "test": trainer.test_dataloaders}
    loader = loaders.get(method, trainer.predict_dataloaders)
    assert loader.batch_size == 32  # the stage's loader, rebuilt at the size found


def test_the_batch_size_finder_in_test_goes_on_with_the_size_found() -> None:
    module = Evaluated(batch_size=4, oom_above=20)
    trainer = _trainer(callbacks=[BatchSizeFinder(steps_per_trial=1, init_val=4)])
    (result,) = trainer.test(module, verbose=False)
    assert module.batch_size == 16 and "test_loss" in result
    # Trials 4, 8, 16 fit and 32 fails; then the whole test set at 16 (256 samples: 16 batches).
    assert module.seen_sizes == [4, 8, 16, 32] + [16] * 16


def test_the_search_stops_at_the_dataset_length_with_lightnings_messages(caplog: pytest.LogCaptureFixture) -> None:
    module = Regression(batch_size=16)
    with caplog.at_level("INFO"):
        size = Tuner(_trainer()).scale_batch_size(module, init_val=128, steps_per_trial=1)
    # 128 fits, 256 (the whole training set) fits, and the search stops there: it covers the dataset.
    assert size == 256 and module.seen_sizes == [128, 256]
    assert "Batch size 128 succeeded, trying batch size 256" in caplog.text
    assert "The batch size 256 is greater or equal than the length of your dataset: 256." in caplog.text


class TwoValLoaders(Evaluated):
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        super().validation_step(batch, batch_idx)

    def val_dataloader(self) -> list[DataLoader[Any]]:
        return [self.train_dataloader(), self.train_dataloader()]


def test_the_tuners_other_refusals_and_skips_are_lightnings() -> None:
    with pytest.raises(ValueError, match="Trainer is already configured with a `BatchSizeFinder` callback"):
        Tuner(_trainer(callbacks=[BatchSizeFinder()])).scale_batch_size(Regression())
    with pytest.raises(ValueError, match="Trainer is already configured with a `LearningRateFinder` callback"):
        Tuner(_trainer(callbacks=[LearningRateFinder()])).lr_find(Regression())
    with pytest.raises(MisconfigurationException, match="cannot be used with multiple val dataloaders"):
        Tuner(_trainer()).scale_batch_size(TwoValLoaders(), method="validate")
    with pytest.raises(MisconfigurationException, match=r"cannot be used with dataloaders passed directly to `\.test"):
        Tuner(_trainer()).scale_batch_size(Evaluated(), method="test", dataloaders=_data())
    module = Regression()
    module.seen_sizes.clear()
    fast = Tuner(_trainer(fast_dev_run=True))
    with pytest.warns(UserWarning, match="Skipping learning rate finder since `fast_dev_run` is enabled"):
        assert fast.lr_find(module) is None
    with pytest.warns(UserWarning, match="Skipping batch size scaler since `fast_dev_run` is enabled"):
        assert fast.scale_batch_size(module) is None
    assert module.seen_sizes == []
