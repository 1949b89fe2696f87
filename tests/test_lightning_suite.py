"""What Lightning 2.6's own tests of public behaviour expect, said in our words.

Each case is a behaviour that Lightning's test suite (run against geartrain through an alias package,
see docs/lightning.md) found different: the error a user catches, the words in a message a user reads,
the key a checkpoint stores a callback's state under, ``self.log`` inside a callback.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback, EarlyStopping, ModelCheckpoint
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule
from trainer.errors import MisconfigurationException


class Line(TrainModule):
    """One weight, a fixed validation value per epoch (``scores``), logged as ``val_loss``."""

    def __init__(self, scores: list[float] | None = None) -> None:
        super().__init__()
        self.w = nn.Linear(2, 1)
        self.scores = scores or [1.0] * 20

    def forward(self, batch: Any) -> torch.Tensor:
        return self.w(batch[0])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.scores[self.current_epoch])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _loaders(n: int = 2) -> tuple[DataLoader[Any], DataLoader[Any]]:
    return DataLoader(TensorDataset(torch.ones(n, 2))), DataLoader(TensorDataset(torch.ones(1, 2)))


# ----------------------------------------------------------------------------- refusals users catch
@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda: ModelCheckpoint(save_top_k=-2), "Must be >= -1"),
        (lambda: ModelCheckpoint(every_n_epochs=-1), "Must be >= 0"),
        (lambda: ModelCheckpoint(every_n_train_steps=-5), "Must be >= 0"),
        (lambda: ModelCheckpoint(every_n_train_steps=2, every_n_epochs=3), "Combination of parameters"),
        (
            lambda: ModelCheckpoint(train_time_interval=timedelta(seconds=9), every_n_train_steps=1),
            "Combination of parameters",
        ),
        (lambda: ModelCheckpoint(mode="maximum"), "`mode` can be min, max but got maximum"),
        (lambda: EarlyStopping("val_loss", mode="low"), "`mode` can be min, max, got low"),
    ],
)
def test_bad_callback_options_are_lightnings_misconfiguration(build: Any, words: str) -> None:
    # Lightning code catching MisconfigurationException must catch these; older code catching ValueError too.
    with pytest.raises(MisconfigurationException, match=words) as caught:
        build()
    assert isinstance(caught.value, ValueError)


def test_logging_with_neither_step_nor_epoch_is_a_misconfiguration() -> None:
    class Both(Line):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.log("x", 1.0, on_step=False, on_epoch=False)
            return super().training_step(batch, batch_idx)

    with pytest.raises(MisconfigurationException, match="is not useful"):
        quiet_trainer(max_steps=1, limit_val_batches=0).fit(Both(), _loaders()[0])


def test_interval_longer_than_the_epoch_says_lightnings_words() -> None:
    trainer = quiet_trainer(max_epochs=1, val_check_interval=5)
    with pytest.raises(ValueError, match="must be less than or equal to the number of the training batches"):
        trainer.fit(Line(), *_loaders(3))


# ----------------------------------------------------------------------------- early stopping
def test_early_stopping_state_key_is_lightnings() -> None:
    # Lightning finds a callback's state in a checkpoint by this string: the same string resumes both ways.
    assert EarlyStopping("val_loss").state_key == "EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}"
    assert EarlyStopping("acc", mode="max").state_key == "EarlyStopping{'monitor': 'acc', 'mode': 'max'}"


@pytest.mark.parametrize(
    ("options", "scores", "words"),
    [
        ({"stopping_threshold": 0.5}, [0.9, 0.4, 0.3], "Stopping threshold reached"),
        ({"divergence_threshold": 5.0}, [1.0, 6.0, 7.0], "Divergence threshold reached"),
    ],
)
def test_threshold_stops_name_their_reason_as_lightning(
    options: dict[str, Any], scores: list[float], words: str
) -> None:
    es = EarlyStopping("val_loss", **options)
    quiet_trainer(max_epochs=3, callbacks=[es]).fit(Line(scores), *_loaders())
    assert es.stopped_epoch == 1
    assert es.stopping_reason_message is not None and words in es.stopping_reason_message


# ----------------------------------------------------------------------------- self.log in a callback
def test_callbacks_log_with_self_log_during_a_run() -> None:
    class Logs(Callback):
        def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
            self.log("at_start", 1.0)  # type: ignore[attr-defined]

        def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, *args: Any) -> None:
            self.log_dict({"at_batch": 3.0})  # type: ignore[attr-defined]

        def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
            self.log("at_epoch_end", 5.0)  # type: ignore[attr-defined]

    trainer = quiet_trainer(max_epochs=1, limit_val_batches=0, callbacks=[Logs()])
    trainer.fit(Line(), _loaders()[0])
    assert {k: float(v) for k, v in trainer.callback_metrics.items()} == {
        "at_start": 1.0,
        "at_batch": 3.0,
        "at_epoch_end": 5.0,
    }


# ----------------------------------------------------------------------------- LearningRateMonitor
class Scheduled(Line):
    def __init__(self, optimizer: type[torch.optim.Optimizer] = torch.optim.SGD, groups: int = 1) -> None:
        super().__init__()
        self.optimizer, self.groups = optimizer, groups

    def configure_optimizers(self) -> Any:
        params = list(self.parameters())
        groups = [{"params": params[:1], "name": "g"}, {"params": params[1:], "name": "g"}][: self.groups]
        opt = self.optimizer(groups if self.groups > 1 else params, lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]


def _monitored(monitor: Callback, module: Line, **options: Any) -> Trainer:
    from callbacks import CSVLogger

    trainer = quiet_trainer(callbacks=[monitor], logger=CSVLogger("."), **options)
    trainer.fit(module, *_loaders())
    return trainer


def test_learning_rates_are_callback_metrics_that_early_stopping_can_watch(tmp_path: Any, monkeypatch: Any) -> None:
    from callbacks import LearningRateMonitor

    monkeypatch.chdir(tmp_path)
    es = EarlyStopping("lr-SGD", stopping_threshold=0.03, check_on_train_epoch_end=True)
    lr = LearningRateMonitor()
    trainer = quiet_trainer(callbacks=[lr, es], max_epochs=6, limit_val_batches=0, logger=False)
    trainer.fit(Scheduled(), _loaders()[0])
    assert lr.lrs["lr-SGD"] == [0.1, 0.05, 0.025]  # 0.025 < 0.03 stops after the third epoch
    assert trainer.callback_metrics["lr-SGD"] == torch.tensor(0.025)
    assert es.stopping_reason_message is not None and "Stopping threshold reached" in es.stopping_reason_message


def test_momentum_asked_of_an_optimizer_without_it_warns_and_logs_zero(tmp_path: Any, monkeypatch: Any) -> None:
    from callbacks import LearningRateMonitor

    monkeypatch.chdir(tmp_path)
    lr = LearningRateMonitor(log_momentum=True)
    with pytest.warns(RuntimeWarning, match="optimizers do not have momentum"):
        _monitored(lr, Scheduled(torch.optim.ASGD), max_epochs=1)
    assert lr.last_momentum_values == {"lr-ASGD-momentum": 0.0}


def test_two_groups_with_one_name_fail_before_training_as_misconfiguration(tmp_path: Any, monkeypatch: Any) -> None:
    from callbacks import LearningRateMonitor

    monkeypatch.chdir(tmp_path)
    module = Scheduled(groups=2)
    with pytest.raises(MisconfigurationException, match="cannot have multiple parameter groups with identical"):
        _monitored(LearningRateMonitor(logging_interval="step"), module, max_epochs=1)
    assert module.trainer.global_step == 0


# ----------------------------------------------------------------------------- dataloader_idx
class NeedsIndex(Line):
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int) -> None:
        self.log("v", 1.0)


class HookNeedsIndex(Line):
    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int) -> None:  # type: ignore[override]
        pass


class KeywordsOnly(Line):
    def validation_step(self, batch: Any, batch_idx: int, **kwargs: Any) -> None:
        self.log("v", 1.0)


@pytest.mark.parametrize(
    ("module", "loaders", "words"),
    [
        (NeedsIndex(), 1, r"only a single `val_dataloader`, but have included `dataloader_idx` in `NeedsIndex.valid"),
        (HookNeedsIndex(), 1, r"included `dataloader_idx` in `HookNeedsIndex.on_validation_batch_start\(\)`"),
        (KeywordsOnly(), 2, r"multiple `val_dataloader`, but no `dataloader_idx` argument in `KeywordsOnly.valid"),
    ],
)
def test_dataloader_idx_that_cannot_fit_the_loaders_is_said_before_the_first_batch(
    module: Line, loaders: int, words: str
) -> None:
    val = [_loaders()[1]] * loaders
    with pytest.raises(RuntimeError, match=words):
        quiet_trainer().validate(module, val if loaders > 1 else val[0], verbose=False)


def test_default_predict_step_takes_the_index_of_several_loaders() -> None:
    out = quiet_trainer().predict(Line(), [_loaders()[1], _loaders(3)[0]])
    assert [len(per_loader) for per_loader in out] == [1, 3]  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- when ModelCheckpoint saves
@pytest.mark.parametrize(
    ("options", "expected"),
    [
        # Validation inside the epoch: a save after each pass, holding that pass's metrics (Lightning 2.6.6).
        ({"val_check_interval": 2, "max_epochs": 1}, ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]),
        # Validation every other epoch: saves follow it, so epochs without validation save nothing.
        ({"check_val_every_n_epoch": 2, "max_epochs": 4}, ["epoch=1-step=8.ckpt", "epoch=3-step=16.ckpt"]),
        # Once at every epoch's end: one save per epoch, as before.
        ({"max_epochs": 2}, ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"]),
        # No validation data: at each training epoch's end.
        ({"max_epochs": 2, "limit_val_batches": 0}, ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"]),
    ],
)
def test_default_checkpoint_moment_follows_the_validation_schedule(
    tmp_path: Any, options: dict[str, Any], expected: list[str]
) -> None:
    ck = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)
    quiet_trainer(callbacks=[ck], **options).fit(Line(), *_loaders(4))
    assert sorted(p.name for p in tmp_path.iterdir()) == expected


# ----------------------------------------------------------------------------- resuming never deletes others' files
def _ranked_by_step(folder: Any) -> ModelCheckpoint:
    return ModelCheckpoint(dirpath=folder, monitor="step", mode="max", save_top_k=2, every_n_train_steps=2)


def _names_in(folder: Any) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_resuming_into_another_folder_leaves_the_first_folder_alone(tmp_path: Any) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    module = Line()
    quiet_trainer(callbacks=[_ranked_by_step(first)], max_steps=4, limit_val_batches=0).fit(module, _loaders(8)[0])
    assert _names_in(first) == {"epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"}
    again = _ranked_by_step(second)
    with pytest.warns(UserWarning, match="The dirpath has changed from"):
        quiet_trainer(callbacks=[again], max_steps=8, limit_val_batches=0).fit(
            module, _loaders(8)[0], ckpt_path=str(first / "epoch=0-step=4.ckpt")
        )
    assert _names_in(first) == {"epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"}
    assert _names_in(second) == {"epoch=0-step=6.ckpt", "epoch=0-step=8.ckpt"}
    assert set(again.best_k_models) == {str(second / "epoch=0-step=6.ckpt"), str(second / "epoch=0-step=8.ckpt")}


def test_resuming_in_the_same_folder_keeps_the_file_it_resumed_from(tmp_path: Any) -> None:
    module = Line()
    quiet_trainer(callbacks=[_ranked_by_step(tmp_path)], max_steps=4, limit_val_batches=0).fit(module, _loaders(8)[0])
    quiet_trainer(callbacks=[_ranked_by_step(tmp_path)], max_steps=8, limit_val_batches=0).fit(
        module, _loaders(8)[0], ckpt_path=str(tmp_path / "epoch=0-step=4.ckpt")
    )
    assert _names_in(tmp_path) == {"epoch=0-step=4.ckpt", "epoch=0-step=6.ckpt", "epoch=0-step=8.ckpt"}


@pytest.mark.parametrize(("value", "words"), [(1, "1 batch will be used."), (1.0, "100% of the batches will be used.")])
def test_overfit_batches_of_one_says_what_it_means(caplog: Any, value: Any, words: str) -> None:
    import logging

    with caplog.at_level(logging.INFO):
        Trainer(overfit_batches=value, logger=False, enable_checkpointing=False, max_epochs=1)
    assert f"`Trainer(overfit_batches={value})` was configured so {words}" in caplog.messages


# ----------------------------------------------------------------------------- a stop in the middle of an epoch
class StopsAtBatch(Line):
    def __init__(self, stop_at: int) -> None:
        super().__init__()
        self.stop_at = stop_at
        self.validated_at: list[tuple[int, int]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == self.stop_at:
            self.trainer.should_stop = True
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.validated_at.append((self.trainer.current_epoch, self.trainer.global_step))


def test_a_stop_asked_for_mid_epoch_validates_before_training_ends() -> None:
    module = StopsAtBatch(stop_at=4)
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(module, *_loaders(10))
    assert (trainer.global_step, trainer.current_epoch) == (5, 1)
    assert module.validated_at == [(0, 5)]


def test_a_stop_that_min_epochs_holds_back_validates_only_on_schedule() -> None:
    module = StopsAtBatch(stop_at=1)
    quiet_trainer(max_epochs=3, min_epochs=2).fit(module, *_loaders(4))
    # Neither epoch may stop early (min_epochs=2): each validates at its end only, then training stops.
    assert module.validated_at == [(0, 4), (1, 8)]


# ----------------------------------------------------------------------------- how loggers are called
@pytest.mark.parametrize("kind", ["Logger", "TensorBoardLogger", "CSVLogger"])
def test_loggers_receive_metrics_and_step_by_keyword(tmp_path: Any, kind: str) -> None:
    import callbacks

    calls: list[dict[str, Any]] = []

    class Records(getattr(callbacks, kind)):  # type: ignore[misc]
        def log_metrics(self, *, metrics: Any, step: Any = None) -> None:  # keyword-only: positional calls fail
            calls.append({"metrics": dict(metrics), "step": step})

    class LogsAtStart(Line):
        def on_train_start(self) -> None:
            self.log("foo", 123.0)

    logger = Records(save_dir=str(tmp_path))
    quiet_trainer(max_epochs=2, limit_val_batches=0, logger=logger).fit(LogsAtStart(), _loaders(1)[0])
    assert calls[0] == {"metrics": {"foo": 123.0, "epoch": 0}, "step": 0}


# ----------------------------------------------------------------------------- public attributes' types and setters
def test_a_module_can_be_given_a_trainer_and_its_child_modules_get_it_too(tmp_path: Any) -> None:
    parent, child = Line(), Line()
    parent.child = child
    trainer = Trainer(default_root_dir=tmp_path, logger=False)
    parent.trainer = trainer  # tests and programs attach a trainer by hand, as Lightning allows
    assert parent.trainer is trainer and child.trainer is trainer
    parent.trainer = None
    with pytest.raises(RuntimeError, match="not attached"):
        child.trainer  # noqa: B018 - reading it is the test


def test_log_dir_is_a_string_and_stages_name_their_dataloader_prefix(tmp_path: Any) -> None:
    from trainer.state import RunningStage

    assert Trainer(default_root_dir=tmp_path, logger=False).log_dir == str(tmp_path)
    prefixes = {stage.value: stage.dataloader_prefix for stage in RunningStage}
    assert prefixes == {
        "train": "train",
        "sanity_check": "val",
        "validate": "val",
        "test": "test",
        "predict": "predict",
    }


def test_fast_dev_run_puts_a_dummy_logger_where_the_loggers_were(tmp_path: Any) -> None:
    from trainer.lightning.loggers.logger import DummyLogger

    class UsesItsLogger(Line):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.logger.experiment.add_scalar("x", 1.0, self.global_step)  # TensorBoard-style call
            self.logger[0].log_metrics({"y": 2.0}, step=self.global_step)
            return super().training_step(batch, batch_idx)

    with pytest.warns(UserWarning, match="fast_dev_run: leaving out TensorBoardLogger"):
        trainer = quiet_trainer(tmp_path, fast_dev_run=2, logger=True)
    trainer.fit(UsesItsLogger(), *_loaders(4))
    assert isinstance(trainer.logger, DummyLogger) and trainer.loggers == [trainer.logger]
    assert (trainer.logger.name, trainer.logger.version) == ("", "")
    assert trainer.global_step == 2 and not any(tmp_path.iterdir())  # nothing written
    assert quiet_trainer(tmp_path, fast_dev_run=True, logger=False).logger is None


def test_configure_optimizers_returning_none_trains_with_no_optimizer() -> None:
    # Lightning warns and runs the fit with a stand-in optimizer: every step and hook runs, no weight moves.
    class NoOptim(Line):
        def __init__(self) -> None:
            super().__init__()
            self.steps = 0

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.steps += 1
            return super().training_step(batch, batch_idx)

        def configure_optimizers(self) -> Any:
            return None

    module = NoOptim()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = quiet_trainer(max_epochs=2, limit_val_batches=0)
    with pytest.warns(UserWarning, match="will run with no optimizer"):
        trainer.fit(module, _loaders(3)[0])
    assert module.steps == 6 and trainer.global_step == 6
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_evaluating_without_a_module_is_lightnings_type_error(stage: str) -> None:
    with pytest.raises(TypeError, match=rf"`Trainer.{stage}\(\)` requires a `LightningModule`"):
        getattr(quiet_trainer(), stage)()


def test_a_sanity_check_of_every_batch_reads_as_infinity() -> None:
    trainer = quiet_trainer(num_sanity_val_steps=-1, max_epochs=1)
    assert trainer.num_sanity_val_steps == float("inf")
    assert quiet_trainer(num_sanity_val_steps=3).num_sanity_val_steps == 3
    module = Line()
    trainer.fit(module, *_loaders(2))  # the sanity check still runs every validation batch
    assert trainer.global_step == 2


def test_a_dataloader_that_cannot_be_iterated_is_lightnings_type_error() -> None:
    loader = _loaders()[0]
    with pytest.raises(TypeError, match=r"invalid dataloader was passed to `Trainer.fit\(train_dataloaders=\.\.\.\)`"):
        quiet_trainer(max_epochs=1).fit(Line(), object())
    with pytest.raises(TypeError, match=r"invalid dataloader was passed to `Trainer.validate\(dataloaders=.*Found 1"):
        quiet_trainer().validate(Line(), [loader, 1])

    class Returns5(Line):
        def val_dataloader(self) -> Any:
            return 5

    with pytest.raises(TypeError, match=r"invalid dataloader was returned from `Returns5.val_dataloader\(\)`. Found 5"):
        quiet_trainer().validate(Returns5())
    trainer = quiet_trainer(max_epochs=1, limit_val_batches=0)
    trainer.fit(Line(), [(torch.ones(1, 2),), (torch.ones(1, 2),)])  # a list of batches is still one loader
    assert trainer.global_step == 2


def test_the_batch_limits_in_force_read_as_lightnings_attributes() -> None:
    names = ["limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches"]
    assert [getattr(quiet_trainer(), name) for name in names] == [1.0, 1.0, 1.0, 1.0]
    given = quiet_trainer(limit_train_batches=3, limit_val_batches=0.25)
    assert (given.limit_train_batches, given.limit_val_batches, given.limit_test_batches) == (3, 0.25, 1.0)
    quick = quiet_trainer(fast_dev_run=2)
    assert [getattr(quick, name) for name in names] == [2, 2, 2, 2]
    overfit = quiet_trainer(overfit_batches=4)
    assert (overfit.limit_train_batches, overfit.limit_val_batches) == (4, 4)


def test_a_flat_dict_of_loaders_trains_one_batch_of_each_per_step() -> None:
    loader = _loaders()[0]

    class Combined(Line):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.w(batch["a"][0]).pow(2).mean() + self.w(batch["b"][0]).pow(2).mean()

    trainer = quiet_trainer(max_epochs=1, limit_val_batches=0)
    trainer.fit(Combined(), {"a": loader, "b": loader})
    assert trainer.global_step == 2


def test_simple_profiler_records_every_calls_duration() -> None:
    from trainer.profilers import SimpleProfiler

    profiler = SimpleProfiler()
    for _ in range(3):
        with profiler.profile("load"):
            pass
    durations = profiler.recorded_durations["load"]
    assert len(durations) == 3 and all(d >= 0 for d in durations)
    assert sum(durations) == pytest.approx(profiler.stats["load"].total)
    trainer = quiet_trainer(max_epochs=1, limit_val_batches=0, profiler=profiler)
    trainer.fit(Line(), _loaders(4)[0])
    assert len(profiler.recorded_durations["run_training_batch"]) == 4
    # As Lightning's: the record goes on over stages (the table and ``stats`` are the stage's).
    assert profiler.recorded_durations["load"] == durations and "load" not in profiler.stats


@pytest.mark.parametrize("stage", ["validate", "test"])
def test_best_without_a_best_checkpoint_is_lightnings_value_error(tmp_path: Any, stage: str) -> None:
    class Logs(Line):
        def test_step(self, batch: Any, batch_idx: int) -> None:
            self.log("t", 1.0)

    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[ModelCheckpoint(monitor="val_loss", save_top_k=0)])
    trainer.fit(module := Logs(), *_loaders())
    with pytest.raises(ValueError, match=r"`ModelCheckpoint` is not configured to save the best model") as caught:
        getattr(trainer, stage)(module, _loaders()[1], ckpt_path="best")
    assert f'`.{stage}(ckpt_path="best")` is set' in str(caught.value)
