"""Lightning's callback options, each honoured: ModelCheckpoint, EarlyStopping, LearningRateMonitor, and the rest."""

from __future__ import annotations

import io
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import (
    Callback,
    EarlyStopping,
    LambdaCallback,
    LearningRateMonitor,
    ModelCheckpoint,
    ModelSummary,
    ProgressBar,
    RichModelSummary,
    ThroughputMonitor,
    Timer,
    TQDMProgressBar,
)
from callbacks.base import overridden_hooks
from tests.helpers.callback_tools import NotRankZero, Scripted, loaders
from tests.helpers.trainers import quiet_trainer
from trainer.checkpoint.files import load_checkpoint


class Recorder(Callback):
    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []

    def on_log_metrics(self, trainer: Any, pl_module: Any, metrics: dict[str, torch.Tensor], step: int) -> None:
        self.rows.append((step, {k: float(v) for k, v in metrics.items()}))

    def names(self) -> set[str]:
        return {k for _, m in self.rows for k in m}


def _fit(callbacks: list[Callback], module: Any = None, **kwargs: Any) -> Any:
    train, val = loaders()
    trainer = quiet_trainer(callbacks=callbacks, **{"max_epochs": 2, **kwargs})
    trainer.fit(module if module is not None else Scripted([1.0, 2.0, 3.0]), train, val)
    return trainer


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ----------------------------------------------------------------- ModelCheckpoint
def test_checkpoint_default_filename_and_auto_insert_metric_name(tmp_path: Path) -> None:
    _fit([ModelCheckpoint(dirpath=tmp_path / "a", save_top_k=-1)])
    assert _names(tmp_path / "a") == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"]
    _fit([ModelCheckpoint(dirpath=tmp_path / "b", filename="e{epoch:02d}-s{step}", auto_insert_metric_name=False)])
    assert _names(tmp_path / "b") == ["e01-s8.ckpt"]


def test_checkpoint_format_checkpoint_name_as_lightning(tmp_path: Path) -> None:
    ck = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}-{val/acc:.2f}")
    metrics = {"epoch": 3, "val/acc": 0.912}
    assert ck.format_checkpoint_name(metrics) == str(tmp_path / "epoch=3-val_acc=0.91.ckpt")
    assert ck.format_checkpoint_name(metrics, ver=2, prefix="p") == str(tmp_path / "p-epoch=3-val_acc=0.91-v2.ckpt")


def test_checkpoint_version_counter_keeps_a_file_of_the_same_name(tmp_path: Path) -> None:
    (tmp_path / "epoch=1-step=8.ckpt").write_text("someone else's")
    ck = ModelCheckpoint(dirpath=tmp_path)
    _fit([ck])
    assert _names(tmp_path) == ["epoch=1-step=8-v1.ckpt", "epoch=1-step=8.ckpt"]
    assert (tmp_path / "epoch=1-step=8.ckpt").read_text() == "someone else's"
    assert ck.best_model_path == str(tmp_path / "epoch=1-step=8-v1.ckpt")
    _fit([ModelCheckpoint(dirpath=tmp_path, enable_version_counter=False)])
    assert load_checkpoint(tmp_path / "epoch=1-step=8.ckpt")["progress"]["global_step"] == 8  # replaced


def test_checkpoint_save_last_link_is_a_symlink_to_the_newest_file(tmp_path: Path) -> None:
    ck = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, save_last="link")
    _fit([ck])
    last = tmp_path / "last.ckpt"
    assert last.is_symlink() and os.readlink(last) == "epoch=1-step=8.ckpt"
    assert ck.last_model_path == str(last)
    assert load_checkpoint(last)["progress"]["global_step"] == 8


def test_checkpoint_save_on_exception_saves_the_state_reached(tmp_path: Path) -> None:
    class Fails(Scripted):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.global_step == 6:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    ck = ModelCheckpoint(dirpath=tmp_path, save_on_exception=True)
    with pytest.raises(RuntimeError, match="boom"):
        _fit([ck], Fails([1.0, 2.0]))
    assert _names(tmp_path) == ["epoch=0-step=4.ckpt", "epoch=1-step=6.ckpt"]
    assert load_checkpoint(tmp_path / "epoch=1-step=6.ckpt")["progress"]["global_step"] == 6
    off = tmp_path / "off"
    with pytest.raises(RuntimeError, match="boom"):
        _fit([ModelCheckpoint(dirpath=off)], Fails([1.0, 2.0]))
    assert _names(off) == ["epoch=0-step=4.ckpt"]


def test_checkpoint_train_time_interval_saves_by_rank_zeros_clock(tmp_path: Path) -> None:
    now = [0.0]

    class Ticks(Scripted):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            now[0] += 1.0  # one second per step
            return super().training_step(batch, batch_idx)

    ck = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, train_time_interval=timedelta(seconds=3))
    ck._clock = lambda: now[0]
    _fit([ck], Ticks())
    assert _names(tmp_path) == ["epoch=0-step=3.ckpt", "epoch=1-step=6.ckpt"]
    with pytest.raises(ValueError, match="every_n_epochs and train_time_interval are mutually exclusive"):
        ModelCheckpoint(every_n_epochs=1, train_time_interval=timedelta(seconds=1))


def test_checkpoint_save_on_train_epoch_end_false_saves_after_every_validation(tmp_path: Path) -> None:
    _fit([ModelCheckpoint(dirpath=tmp_path / "a", save_top_k=-1, save_on_train_epoch_end=False)], val_check_interval=2)
    assert _names(tmp_path / "a") == [f"epoch={(s - 1) // 4}-step={s}.ckpt" for s in (2, 4, 6, 8)]
    # The default (None) does the same where validation runs inside the epoch, as Lightning 2.6.6 does.
    _fit([ModelCheckpoint(dirpath=tmp_path / "b", save_top_k=-1)], val_check_interval=2)
    assert _names(tmp_path / "b") == _names(tmp_path / "a")
    _fit([ModelCheckpoint(dirpath=tmp_path / "c", save_top_k=-1, save_on_train_epoch_end=True)], val_check_interval=2)
    assert _names(tmp_path / "c") == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"]


def test_checkpoint_verbose_says_what_it_saved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fit([ModelCheckpoint(dirpath=tmp_path, monitor="val/score", mode="max", verbose=True)])
    out = capsys.readouterr().out
    assert "Epoch 0, global step 4: 'val/score' reached 1.00000 (best 1.00000), saving model to" in out
    assert "Epoch 1, global step 8: 'val/score' reached 2.00000 (best 2.00000)" in out


# ----------------------------------------------------------------- EarlyStopping
def test_early_stopping_strict_false_skips_a_missing_metric_with_a_warning() -> None:
    with pytest.warns(UserWarning, match=r"val/typo.*strict=False"):
        trainer = _fit([EarlyStopping("val/typo", strict=False)], max_epochs=3)
    assert trainer.current_epoch >= 2 and not trainer.should_stop
    with pytest.raises(KeyError, match="never logged"):
        _fit([EarlyStopping("val/typo")])


def test_early_stopping_check_on_train_epoch_end_false_checks_after_each_validation() -> None:
    after_validation = EarlyStopping("val/score", patience=1, check_on_train_epoch_end=False)
    trainer = _fit([after_validation], Scripted([1.0, 1.0, 1.0]), max_epochs=3, val_check_interval=2)
    assert after_validation.stopped_epoch == 0 and trainer.global_step == 4  # 2nd validation of epoch 0
    # The default (None) is Lightning's rule: validation runs more than once an epoch, so it checks after each too.
    default = EarlyStopping("val/score", patience=1)
    trainer = _fit([default], Scripted([1.0, 1.0, 1.0]), max_epochs=3, val_check_interval=2)
    assert default.stopped_epoch == 0 and trainer.global_step == 4
    at_epoch_end = EarlyStopping("val/score", patience=1, check_on_train_epoch_end=True)
    trainer = _fit([at_epoch_end], Scripted([1.0, 1.0, 1.0]), max_epochs=3, val_check_interval=2)
    assert at_epoch_end.stopped_epoch == 1 and trainer.global_step == 8


def test_early_stopping_log_rank_zero_only() -> None:
    for rank_zero_only, expected in ((False, "[rank: 1] EarlyStopping: stopping after epoch 1"), (True, "")):
        out = io.StringIO()
        es = EarlyStopping("val/score", patience=1, verbose=True, log_rank_zero_only=rank_zero_only, stream=out)
        _fit([es], Scripted([1.0, 1.0]), strategy=NotRankZero(device="cpu"))
        assert out.getvalue().startswith(expected) and bool(out.getvalue()) == bool(expected)


# ----------------------------------------------------------------- LearningRateMonitor
class ThreeOptimizers(Scripted):
    """The set-up whose keys were recorded from Lightning 2.6.6 (see LIGHTNING_KEYS)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.other = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        for opt in self.optimizers():
            opt.zero_grad()
        x, y = batch
        self.manual_backward(torch.nn.functional.mse_loss(self.layer(x) + self.other(x), y))
        for opt in self.optimizers():
            opt.step()

    def configure_optimizers(self) -> Any:
        groups: list[dict[str, Any]] = [
            {"params": self.layer.parameters()},
            {"params": self.other.parameters(), "lr": 1.0},
        ]
        sgd = torch.optim.SGD(
            groups,
            lr=0.1,
            momentum=0.9,
            weight_decay=0.01,
        )
        adam = torch.optim.Adam(self.other.parameters(), lr=0.2)
        sgd2 = torch.optim.SGD(self.other.parameters(), lr=0.3)
        return [sgd, adam, sgd2], [{"scheduler": torch.optim.lr_scheduler.StepLR(adam, 1), "name": "mine"}]


LIGHTNING_KEYS = {
    "lr-SGD-1": 0.3, "lr-SGD-1-momentum": 0.0, "lr-SGD-1-weight_decay": 0.0,
    "lr-SGD/pg1": 0.1, "lr-SGD/pg1-momentum": 0.9, "lr-SGD/pg1-weight_decay": 0.01,
    "lr-SGD/pg2": 1.0, "lr-SGD/pg2-momentum": 0.9, "lr-SGD/pg2-weight_decay": 0.01,
    "mine": 0.2, "mine-momentum": 0.9, "mine-weight_decay": 0.0,
}  # fmt: skip


def test_learning_rate_monitor_names_keys_as_lightning() -> None:
    recorder = Recorder()
    monitor = LearningRateMonitor(logging_interval="epoch", log_momentum=True, log_weight_decay=True)
    _fit([monitor, recorder], ThreeOptimizers(), max_epochs=1)
    first = next(m for _, m in recorder.rows if "mine" in m)
    assert first == pytest.approx(LIGHTNING_KEYS)
    assert monitor.lrs == {"lr-SGD-1": [0.3], "lr-SGD/pg1": [0.1], "lr-SGD/pg2": [1.0], "mine": [0.2]}


def test_learning_rate_monitor_keeps_the_history_under_pg1_when_a_group_is_added() -> None:
    class Unfreeze(Callback):  # a second parameter group from epoch 1 on (what BackboneFinetuning does)
        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            if trainer.current_epoch == 1:
                trainer.optimizers[0].add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.5})

    class TwoOptimizers(Scripted):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> None:
            for optimizer in self.optimizers():
                optimizer.zero_grad()
                self.manual_backward(super().training_step(batch, batch_idx))
                optimizer.step()

        def configure_optimizers(self) -> Any:
            return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.Adam(self.parameters(), lr=0.2)]

    monitor = LearningRateMonitor(logging_interval="epoch")
    _fit([Unfreeze(), monitor], TwoOptimizers(), max_epochs=2)
    # "lr-SGD" went on as "lr-SGD/pg1", moved behind the others, as in Lightning's dict
    assert monitor.lrs == {"lr-Adam": [0.2, 0.2], "lr-SGD/pg1": [0.1, 0.1], "lr-SGD/pg2": [0.5]}
    assert list(monitor.lrs) == ["lr-Adam", "lr-SGD/pg1", "lr-SGD/pg2"]


def test_learning_rate_monitor_refuses_duplicate_group_names() -> None:
    class Twice(Scripted):
        def configure_optimizers(self) -> Any:
            groups: list[dict[str, Any]] = [
                {"params": [self.layer.weight], "name": "g"},
                {"params": [self.layer.bias], "name": "g"},
            ]
            return torch.optim.SGD(groups, lr=0.1)

    with pytest.raises(ValueError, match="same 'name'"):
        _fit([LearningRateMonitor(logging_interval="epoch")], Twice())


# ----------------------------------------------------------------- the rest
def test_model_summary_max_depth_minus_one_lists_every_level() -> None:
    class Nested(Scripted):
        def __init__(self) -> None:
            super().__init__()
            self.block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.ReLU()))

    out = io.StringIO()
    _fit([ModelSummary(max_depth=-1, stream=out)], Nested(), max_epochs=1)
    names = [line.split("|")[1].strip() for line in out.getvalue().splitlines() if line[:1].isdigit() and "|" in line]
    assert names == ["layer", "block", "block.0", "block.1", "block.1.0"]
    RichModelSummary(header_style="bold")  # styling: accepted
    with pytest.raises(TypeError, match=r"unknown option.*colour"):
        ModelSummary(colour="red")


def test_lambda_callback_calls_the_given_functions_only() -> None:
    epochs: list[int] = []
    cb = LambdaCallback(on_train_epoch_end=lambda trainer, pl_module: epochs.append(trainer.current_epoch))
    _fit([cb])
    assert epochs == [0, 1]
    by_hook = overridden_hooks([cb])
    assert by_hook["on_train_epoch_end"] == [cb] and by_hook["on_train_batch_end"] == []


def test_tqdm_progress_bar_is_the_progress_bar_and_refresh_rate_zero_silences_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bar = TQDMProgressBar(refresh_rate=0)
    trainer = _fit([bar], enable_progress_bar=True)
    assert [cb for cb in trainer.callbacks if isinstance(cb, ProgressBar)] == [bar]  # no second, default bar
    assert capsys.readouterr().out == ""


def test_progress_bar_subclass_uses_lightnings_methods(capsys: pytest.CaptureFixture[str]) -> None:
    class Mine(ProgressBar):
        def __init__(self) -> None:
            super().__init__(force_plain=True, refresh_every_n_steps=1)
            self.seen: list[dict[str, Any]] = []

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            self.seen.append(self.get_metrics(trainer, pl_module))

    bar = Mine()
    bar.disable()
    assert bar.is_disabled and not bar.is_enabled
    _fit([bar], enable_progress_bar=True)
    assert capsys.readouterr().out == ""  # disabled: nothing drawn
    assert [sorted(m) for m in bar.seen] == [["train/loss", "val/loss"]] * 2
    bar.enable()
    assert bar.is_enabled


def test_timer_duration_and_stage_times() -> None:
    now = [0.0]

    class Ticks(Scripted):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            now[0] += 1.0
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            now[0] += 0.5
            super().validation_step(batch, batch_idx)

    timer = Timer(duration=timedelta(seconds=6.5), clock=lambda: now[0], verbose=False)
    trainer = _fit([timer], Ticks(), max_epochs=5)
    assert trainer.global_step == 6  # 4 steps + 2 validation seconds, then 2 steps reach 6.5 s
    assert timer.time_elapsed("validate") == 1.0  # the latest validation pass: 2 batches
    assert timer.time_remaining() == pytest.approx(6.5 - timer.time_elapsed())
    with pytest.raises(ValueError, match="not both"):
        Timer(duration=1, max_time=1)


def test_timer_spent_budget_stops_at_fit_start_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]

    class Ticks(Scripted):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            now[0] += 1.0
            return super().training_step(batch, batch_idx)

    timer = Timer(duration=timedelta(seconds=3), clock=lambda: now[0])
    ck = ModelCheckpoint(dirpath=tmp_path, save_top_k=0, save_last=True)
    with caplog.at_level("INFO"):
        first = _fit([timer, ck], Ticks(), max_epochs=5)
    assert first.global_step == 3 and timer._offset == 0.0  # as Lightning: the offset is a resumed run's
    assert "Time limit reached. Elapsed time is 0:00:03. Signaling Trainer to stop." in caplog.text
    resumed = Timer(duration=timedelta(seconds=3), clock=lambda: now[0], verbose=False)
    trainer = quiet_trainer(callbacks=[resumed], max_epochs=5)
    train, val = loaders()
    trainer.fit(Ticks(), train, val, ckpt_path=str(tmp_path / "last.ckpt"))
    assert trainer.global_step == 3  # the budget was spent: no step ran
    assert resumed.time_elapsed() == 3.0


def test_timer_refuses_bad_durations_and_intervals_with_lightnings_words() -> None:
    from trainer.common.errors import MisconfigurationException

    for text in ("6:00:00", "60 minutes"):
        with pytest.raises(MisconfigurationException, match="format DD:HH:MM:SS"):
            Timer(duration=text)
    with pytest.raises(MisconfigurationException, match=r"Unsupported parameter value `Timer\(interval=hour\)`"):
        Timer(interval="hour")


def test_throughput_monitor_batch_size_fn_and_length_fn(tmp_path: Path) -> None:
    from callbacks import CSVLogger

    recorder = Recorder()
    monitor = ThroughputMonitor(
        lambda batch: 2 * len(batch[0]), length_fn=lambda batch: 40, window_size=3, separator="|"
    )
    _fit([monitor, recorder], logger=CSVLogger(tmp_path), log_every_n_steps=1, max_epochs=1)
    rows = {step: m for step, m in recorder.rows if "train|samples" in m}
    assert [(m["train|batches"], m["train|samples"], m["train|lengths"]) for m in rows.values()] == [
        (b, 16.0 * b, 40.0 * b)
        for b in (1, 2, 3, 4)  # running totals from batch_size_fn and length_fn
    ]
    assert "train|device|items_per_sec" not in rows[1] and "train|device|items_per_sec" in rows[2]  # window: 3
    for m in (rows[2], rows[3]):
        batches = m["train|device|batches_per_sec"]
        assert m["train|device|samples_per_sec"] == pytest.approx(16 * batches)
        assert m["train|device|items_per_sec"] == pytest.approx(40 * batches)
    with pytest.raises(TypeError, match="ThroughputMonitor got available_flops: its options are those of Throughput"):
        ThroughputMonitor(lambda b: 1, available_flops=5)
    with pytest.raises(ValueError, match="window_size=1"):
        ThroughputMonitor(lambda b: 1, window_size=1)
