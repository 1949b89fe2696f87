"""Lightning's read-only Trainer attributes: state and flags, callbacks, devices, data, estimates."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import Callback, CSVLogger, EarlyStopping, ModelCheckpoint, ProgressBar, TensorBoardLogger
from tests.helpers.regression import Regressor, make_loader
from trainer import Trainer, TrainModule
from trainer.state import RunningStage, TrainerFn, TrainerStatus


class StateLog(Callback):
    """Records ``(hook, fn, stage, flags)`` at the moments a Lightning user reads them."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[Any, ...]] = {}

    def _note(self, hook: str, trainer: Trainer) -> None:
        s = trainer.state
        flags = tuple(
            name
            for name in ("training", "validating", "testing", "predicting", "sanity_checking", "evaluating")
            if getattr(trainer, name)
        )
        self.seen.setdefault(hook, (s.fn, s.stage, s.status, flags))

    def on_sanity_check_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._note("sanity", trainer)

    def on_train_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int) -> None:
        self._note("train", trainer)
        self.seen.setdefault("last_flags", ())
        self.seen["last_flags"] += (trainer.is_last_batch,)

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        if not trainer.sanity_checking:
            self._note("val_in_fit" if trainer.state.fn == "fit" else "validate", trainer)

    def on_test_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._note("test", trainer)

    def on_predict_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._note("predict", trainer)


def test_state_and_stage_flags_follow_lightning(make_trainer: Any) -> None:
    log = StateLog()
    trainer = make_trainer(max_epochs=1, callbacks=[log], num_sanity_val_steps=1)
    assert trainer.state.status == TrainerStatus.INITIALIZING and trainer.state.fn is None
    module = Regressor()
    trainer.fit(module, make_loader(6, 2), make_loader(4, 2))
    trainer.validate(module, make_loader(4, 2), verbose=False)
    trainer.test(module, make_loader(4, 2), verbose=False)
    trainer.predict(module, make_loader(4, 2))
    running = TrainerStatus.RUNNING
    assert log.seen["sanity"] == ("fit", "sanity_check", running, ("sanity_checking", "evaluating"))
    assert log.seen["train"] == (TrainerFn.FITTING, RunningStage.TRAINING, running, ("training",))
    assert log.seen["val_in_fit"] == ("fit", "validate", running, ("validating", "evaluating"))
    assert log.seen["validate"] == ("validate", "validate", running, ("validating", "evaluating"))
    assert log.seen["test"] == ("test", "test", running, ("testing", "evaluating"))
    assert log.seen["predict"] == ("predict", "predict", running, ("predicting",))
    assert log.seen["last_flags"] == (False, False, True)
    assert (trainer.state.fn, trainer.state.stage, trainer.state.status) == ("predict", None, "finished")
    assert not trainer.interrupted and not trainer.received_sigterm


def test_an_exception_marks_the_run_interrupted(make_trainer: Any) -> None:
    class Boom(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            raise RuntimeError("boom")

    trainer = make_trainer(max_epochs=1)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Boom(), make_loader())
    assert trainer.interrupted and trainer.state.status == TrainerStatus.INTERRUPTED


def test_callback_attributes(tmp_path: Path) -> None:
    tb, csv = TensorBoardLogger(save_dir=tmp_path), CSVLogger(save_dir=tmp_path)
    stop, ckpt = EarlyStopping(monitor="val_loss"), ModelCheckpoint(dirpath=tmp_path)
    trainer = Trainer(callbacks=[tb, csv, stop, ckpt], default_root_dir=tmp_path)
    assert trainer.logger is tb and trainer.loggers == [tb, csv]
    assert trainer.early_stopping_callback is stop and trainer.early_stopping_callbacks == [stop]
    assert trainer.checkpoint_callback is ckpt and trainer.checkpoint_callbacks == [ckpt]
    assert isinstance(trainer.progress_bar_callback, ProgressBar)
    bare = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert bare.logger is None and bare.loggers == [] and bare.early_stopping_callback is None
    assert bare.checkpoint_callbacks == [] and bare.progress_bar_callback is None


def test_device_and_process_attributes_on_one_cpu(make_trainer: Any) -> None:
    trainer = make_trainer(precision="bf16-mixed")
    assert (trainer.num_devices, trainer.device_ids, trainer.num_nodes) == (1, [0], 1)
    assert (trainer.local_rank, trainer.node_rank, trainer.global_rank, trainer.world_size) == (0, 0, 0, 1)
    assert trainer.precision == "bf16-mixed" and make_trainer().precision == "32-true"
    with trainer.init_module():
        layer = torch.nn.Linear(2, 2)
    assert layer.weight.device == trainer.strategy.root_device


def test_ddp_topology_attributes_before_launch() -> None:
    trainer = Trainer(strategy="ddp", devices=2, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert (trainer.num_devices, trainer.device_ids, trainer.num_nodes) == (2, [0, 1], 1)


def test_model_data_and_estimated_steps(make_trainer: Any) -> None:
    estimates: list[float] = []

    class Scheduled(Regressor):
        def configure_optimizers(self) -> Any:
            estimates.append(self.trainer.estimated_stepping_batches)  # as OneCycleLR's total_steps
            return super().configure_optimizers()

    module = Scheduled()
    trainer = make_trainer(max_epochs=3, accumulate_grad_batches=2)
    assert trainer.model is None and not trainer.enable_validation
    train, val = make_loader(10, 2), make_loader(4, 2)  # 5 batches: 3 optimizer steps per epoch
    trainer.fit(module, train, val)
    assert estimates == [9] and trainer.global_step == 9
    assert trainer.model is module and trainer.lightning_module is module
    assert trainer.train_dataloader.dataset is train.dataset and trainer.val_dataloaders.dataset is val.dataset
    assert trainer.enable_validation
    assert make_trainer(max_epochs=5, max_steps=4).estimated_stepping_batches == 4  # not yet fitted: max_steps
    assert make_trainer(max_steps=-1, max_epochs=-1).estimated_stepping_batches == float("inf")
    capped = make_trainer(max_epochs=3, max_steps=4)
    capped.fit(Scheduled(), make_loader(10, 2))
    assert estimates[-1] == 4
    trainer.test(module, make_loader(4, 2), verbose=False)
    trainer.predict(module, make_loader(6, 2))
    assert trainer.test_dataloaders is not None and trainer.num_test_batches == [2]
    assert trainer.predict_dataloaders is not None and trainer.num_predict_batches == [3]


def test_print_writes_on_rank_zero(make_trainer: Any, capsys: Any) -> None:
    make_trainer().print("hello", 3)
    assert capsys.readouterr().out == "hello 3\n"


def test_sigterm_sets_received_sigterm_and_interrupted(make_trainer: Any) -> None:
    class Terminate(Callback):
        def on_train_batch_end(self, trainer: Trainer, module: TrainModule, *args: Any) -> None:
            if trainer.global_step == 2:
                os.kill(os.getpid(), signal.SIGTERM)  # the preemption handler notes it; fit saves and returns

    trainer = make_trainer(max_epochs=3, callbacks=[Terminate()], preemption_exit_code=None)
    trainer.fit(Regressor(), make_loader(8, 2))
    assert trainer.received_sigterm and trainer.interrupted and trainer.global_step == 2
    assert not make_trainer().received_sigterm


class BatchCounts(Callback):
    """Records Lightning's per-loader batch counts where a callback reads them."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[Any, ...]] = {}

    def on_sanity_check_start(self, trainer: Trainer, module: TrainModule) -> None:
        self.seen["before"] = (trainer.num_val_batches, trainer.num_sanity_val_batches)  # not requested yet

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        self.seen.setdefault("sanity", (trainer.num_val_batches, trainer.num_sanity_val_batches))

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        self.seen["train"] = (trainer.num_val_batches, trainer.num_sanity_val_batches)


class SeveralLoaders(Regressor):
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        super().validation_step(batch, batch_idx)


def test_batch_counts_are_lists_per_loader_as_lightning(make_trainer: Any) -> None:
    """One loader or several, ``num_val/test/predict/sanity_val_batches`` are lists (empty before a stage runs);
    during the sanity check ``num_val_batches`` is the full validation's, the sanity check's own is cut."""
    counts = BatchCounts()
    trainer = make_trainer(max_epochs=1, num_sanity_val_steps=2, callbacks=[counts])
    assert (trainer.num_val_batches, trainer.num_test_batches, trainer.num_predict_batches) == ([], [], [])
    assert trainer.num_sanity_val_batches == []
    trainer.fit(Regressor(), make_loader(8, 2), make_loader(8, 2))
    assert counts.seen == {"before": ([], []), "sanity": ([4], [2]), "train": ([4], [2])}
    trainer.test(Regressor(), make_loader(6, 2), verbose=False)
    assert trainer.num_test_batches == [3]
    trainer.validate(SeveralLoaders(), [make_loader(6, 3), make_loader(2, 2)], verbose=False)
    assert trainer.num_val_batches == [2, 1]


@pytest.mark.parametrize(("interval", "expected"), [(4, 4), (0.5, 3), (1.0, 7)])
def test_val_check_batch_is_the_batches_between_validations(interval: int | float, expected: int) -> None:
    from tests.helpers.trainers import quiet_trainer

    trainer = quiet_trainer(max_epochs=1, val_check_interval=interval)
    trainer.fit(Regressor(), make_loader(28, 4), make_loader(8, 4))  # 7 training batches
    assert trainer.val_check_batch == expected  # Lightning: int as given, else max(1, int(7 * fraction))
