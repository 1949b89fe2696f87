"""Progress bar, CSV logger, learning rates, model summary, throughput, timer, hook dispatch."""

from __future__ import annotations

import csv
import io
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import (
    Callback,
    CSVLogger,
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    ModelSummary,
    ProgressBar,
    ThroughputMonitor,
    Timer,
)
from callbacks.base import DISPATCHED_HOOKS, HOOKS
from tests.helpers import REPO_ROOT
from tests.helpers.callback_tools import NotRankZero, Recorder, Scripted, loaders
from tests.helpers.trainers import quiet_trainer
from trainer.checkpoint.files import load_checkpoint

# ----------------------------------------------------------------- progress bar
NUM = r"[-+0-9.e]+"


def test_progress_bar_plain_lines() -> None:
    out = io.StringIO()
    train, val = loaders()  # 4 training batches, 2 validation batches
    quiet_trainer(
        callbacks=[ProgressBar(refresh_every_n_steps=2, stream=out)], max_epochs=2, num_sanity_val_steps=2
    ).fit(Scripted(), train, val)
    metrics = rf"train/loss={NUM} val/loss={NUM}"
    expected = [
        rf"epoch 0 \| batch 2/4 \| step 2 \| {NUM} it/s \| eta 0:00:\d\d \| train/loss={NUM}",
        rf"validation \| epoch 0 \| 2 batches \| {metrics}",
        rf"epoch 0 \| batch 4/4 \| step 4 \| {NUM} it/s \| took 0:00:\d\d \| {metrics}",
        rf"epoch 1 \| batch 2/4 \| step 6 \| {NUM} it/s \| eta 0:00:\d\d \| {metrics}",
        rf"validation \| epoch 1 \| 2 batches \| {metrics}",
        rf"epoch 1 \| batch 4/4 \| step 8 \| {NUM} it/s \| took 0:00:\d\d \| {metrics}",
    ]
    lines = out.getvalue().splitlines()
    assert len(lines) == len(expected), lines  # the sanity check prints nothing
    for line, pattern in zip(lines, expected):
        assert re.fullmatch(pattern, line), (line, pattern)
    assert "\x1b" not in out.getvalue()  # no terminal control codes in logs


def test_progress_bar_in_a_terminal_draws_with_rich() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    train, val = loaders()
    quiet_trainer(callbacks=[ProgressBar(stream=out)], max_epochs=2).fit(Scripted(), train, val)
    text = out.getvalue()
    assert "Epoch 0" in text and "Epoch 1" in text and "4/4" in text and "train/loss=" in text


def test_nothing_is_printed_on_other_ranks(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = io.StringIO()
    train, val = loaders()
    callbacks = [ProgressBar(refresh_every_n_steps=1), ModelSummary(stream=out)]  # one bar (two are refused)
    callbacks += [EarlyStopping(monitor="val/loss", patience=0), Timer(max_time=0), CSVLogger(save_dir=tmp_path)]
    trainer = quiet_trainer(callbacks=callbacks, max_epochs=3, strategy=NotRankZero(device="cpu"))
    trainer.fit(Scripted(), train, val)
    assert trainer.should_stop  # the timer did run and stop training
    assert out.getvalue() == ""
    assert capsys.readouterr() == ("", "")
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------- loggers
def test_csv_logger_writes_what_loggers_get(tmp_path: Path) -> None:
    recorder, logger = Recorder(), CSVLogger(save_dir=tmp_path, name="csv", version="")
    train, val = loaders()
    trainer = quiet_trainer(callbacks=[logger, LearningRateMonitor(), recorder], max_epochs=2, log_every_n_steps=1)
    trainer.fit(Scripted(), train, val)
    assert logger.path == tmp_path / "csv" / "metrics.csv"
    with logger.path.open() as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == ["step", "epoch", "lr-SGD", "train/loss", "val/loss"]
        rows = list(reader)
    got = sorted((k, int(r["step"]), float(v)) for r in rows for k, v in r.items() if k not in ("step", "epoch") and v)
    # Loggers get each epoch row's ``epoch`` as a value too (Lightning's rows do); the CSV file has it as a column.
    assert got == sorted(row for row in recorder.rows if row[0] != "epoch")
    epochs = {(step, value) for name, step, value in recorder.rows if name == "epoch"}
    assert epochs <= {(int(r["step"]), float(r["epoch"])) for r in rows if r["epoch"]}
    assert [r["epoch"] for r in rows if r["val/loss"]] == ["0", "1"]


class StepDecay(Scripted):
    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD([{"params": [self.layer.weight]}, {"params": [self.layer.bias], "lr": 1.0}], lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def test_learning_rate_monitor_logs_the_rate_each_logged_step_used() -> None:
    recorder = Recorder()
    train, val = loaders()
    trainer = quiet_trainer(callbacks=[LearningRateMonitor(), recorder], max_epochs=2, log_every_n_steps=2)
    trainer.fit(StepDecay(), train, val)
    assert recorder.of("lr-SGD/pg1") == [(i, pytest.approx(0.1 * 0.5**i)) for i in (1, 3, 5, 7)]
    assert recorder.of("lr-SGD/pg2") == [(i, pytest.approx(0.5**i)) for i in (1, 3, 5, 7)]
    assert [s for s, _ in recorder.of("train/loss")] == [1, 3, 5, 7]  # the same x positions


class TwoOptimizers(Scripted):
    """Manual optimisation stepping two optimizers each batch, each decayed per step."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        for optimizer, scheduler in zip(self.optimizers(), self.lr_schedulers(), strict=True):
            optimizer.zero_grad()
            self.manual_backward(super().training_step(batch, batch_idx))
            optimizer.step()
            scheduler.step()

    def configure_optimizers(self) -> Any:
        opts = [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.2)]
        return opts, [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) for opt in opts]


def test_learning_rate_monitor_logs_once_per_logged_batch_with_several_optimizers() -> None:
    # Lightning's rule: every log_every_n_steps batches that stepped, whatever the number of optimizers
    # (global_step counts each optimizer's step: 2 per batch here), at x = the batches before this one.
    recorder, monitor = Recorder(), LearningRateMonitor(logging_interval="step")
    trainer = quiet_trainer(callbacks=[monitor, recorder], max_epochs=2, log_every_n_steps=2)
    trainer.fit(TwoOptimizers(), *loaders())  # 4 batches an epoch
    assert trainer.global_step == 16
    assert recorder.of("lr-SGD") == [(i, pytest.approx(0.1 * 0.5**i)) for i in (1, 3, 5, 7)]
    assert recorder.of("lr-SGD-1") == [(i, pytest.approx(0.2 * 0.5**i)) for i in (1, 3, 5, 7)]
    assert monitor.lrs["lr-SGD"] == pytest.approx([0.1 * 0.5**i for i in (1, 3, 5, 7)])


def test_throughput_is_logged_through_the_loggers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import types

    import callbacks.throughput

    ticks = iter(range(1000))  # a clock that advances one second per reading: every rate is exact
    monkeypatch.setattr(callbacks.throughput, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    recorder = Recorder()
    train, val = loaders()  # 4 training batches of 8, 2 validation batches
    monitor = ThroughputMonitor(window_size=2)
    logger = CSVLogger(tmp_path)
    trainer = quiet_trainer(callbacks=[monitor, recorder], logger=logger, max_epochs=2, log_every_n_steps=2)
    trainer.fit(Scripted(), train, val)
    # every second step, at x = the step before it; the validation in between is not training time
    assert recorder.of("train/time") == [(1, 2.0), (3, 4.0), (5, 6.0), (7, 8.0)]
    assert recorder.of("train/samples") == [(1, 16.0), (3, 32.0), (5, 48.0), (7, 64.0)]
    assert recorder.of("train/device/samples_per_sec") == [(s, 8.0) for s in (1, 3, 5, 7)]  # over the window
    # validation: every second batch of a run, at x = validation batches of the fit so far
    assert recorder.of("validate/time") == [(2, 2.0), (4, 2.0)]
    assert recorder.of("validate/device/batches_per_sec") == [(2, 1.0), (4, 1.0)]
    assert not [k for k, _, _ in recorder.rows if k.startswith("train/") and "items" in k]  # no length_fn


def test_model_summary_table() -> None:
    out = io.StringIO()
    train, val = loaders()
    quiet_trainer(callbacks=[ModelSummary(stream=out)], max_epochs=1).fit(Scripted(), train, val)
    assert out.getvalue().splitlines() == [  # Lightning's table, cell for cell
        "  | Name  | Type   | Params | Mode  | FLOPs",
        "-" * 49,
        "0 | layer | Linear | 5      | train | 0    ",
        "-" * 49,
        "5         Trainable params",
        "0         Non-trainable params",
        "5         Total params",
        "0.000     Total estimated model params size (MB)",
        "1         Modules in train mode",
        "0         Modules in eval mode",
        "0         Total Flops",
    ]


# ----------------------------------------------------------------- timer
def test_timer_stops_cleanly_when_time_is_up(tmp_path: Path) -> None:
    now = [100.0]

    class Tick(Callback):  # every batch takes 10 s on the fake clock
        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
            now[0] += 10.0

    timer = Timer(max_time="00:00:00:25", clock=lambda: now[0], verbose=False)
    ck = ModelCheckpoint(dirpath=tmp_path, save_top_k=0, save_last=True)
    train, val = loaders()
    trainer = quiet_trainer(callbacks=[Tick(), timer, ck], max_epochs=5)
    trainer.fit(Scripted(), train, val)
    assert trainer.global_step == 3  # 30 s >= 25 s after the third step
    assert timer.time_elapsed() == 30.0
    last = load_checkpoint(tmp_path / "last.ckpt")  # fit ended normally: the final state was saved
    assert last["progress"]["global_step"] == 3
    assert last["callbacks"]["Timer"] == {"time_elapsed": 30.0}


def test_timer_reads_the_time_module_lightnings_path_holds() -> None:
    # Lightning's programs and tests patch `lightning.pytorch.callbacks.timer.time` to fake the clock.
    from unittest import mock

    with mock.patch("trainer.lightning.callbacks.timer.time") as fake:
        fake.monotonic.return_value = 100.0
        timer = Timer(duration=10)
        timer.on_train_start(trainer=mock.Mock(), pl_module=mock.Mock())
        fake.monotonic.return_value = 103.0
        assert (timer.start_time(), timer.time_elapsed(), timer.time_remaining()) == (100.0, 3.0, 7.0)


# ----------------------------------------------------------------- hooks
EXPECTED_HOOKS = (
    {f"on_{stage}_{when}" for stage in ("fit", "train", "validation", "test", "predict") for when in ("start", "end")}
    | {
        f"on_{stage}_{part}_{when}"
        for stage in ("train", "validation", "test", "predict")
        for part in ("epoch", "batch")
        for when in ("start", "end")
    }
    | {
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_exception",
        "on_save_checkpoint",
        "on_load_checkpoint",
        "on_log_metrics",
    }
)


def test_every_hook_exists_and_is_called_in_order(tmp_path: Path) -> None:
    assert set(DISPATCHED_HOOKS) >= EXPECTED_HOOKS

    class Each(Callback):
        pass

    for hook in DISPATCHED_HOOKS:
        setattr(Each, hook, lambda self, *args, _h=hook, **kwargs: self.calls.append(_h))
    each: Any = Each()
    each.calls = []
    train, val = loaders(n_train=16)
    trainer = quiet_trainer(callbacks=[each], max_epochs=1)
    trainer.fit(Scripted(), train, val)
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    batch = [
        "on_train_batch_start",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_before_zero_grad",
        "on_train_batch_end",
    ]
    val_pass = ["on_validation_start", "on_validation_epoch_start"]
    val_pass += ["on_validation_batch_start", "on_validation_batch_end"] * 2
    val_pass += ["on_validation_epoch_end", "on_log_metrics", "on_validation_end"]  # Lightning logs after the hook
    assert each.calls == [
        "setup",
        "on_fit_start",
        "on_train_start",
        "on_train_epoch_start",
        *batch,
        *batch,
        *val_pass,
        "on_train_epoch_end",  # no epoch-level training values: nothing to log
        "on_train_end",
        "on_fit_end",
        "teardown",
        "on_save_checkpoint",
    ]


def test_exception_reaches_on_exception_and_teardown_still_runs() -> None:
    seen: list[Any] = []

    class Watch(Callback):
        def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
            seen.append(exception)

        def teardown(self, trainer: Any, module: Any, stage: str) -> None:
            seen.append("teardown " + stage)  # a TrainerFn, as in Lightning: its value

    class Broken(Scripted):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if batch_idx == 1:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    train, val = loaders()
    with pytest.raises(RuntimeError, match="boom"):
        quiet_trainer(callbacks=[Watch()], max_epochs=1).fit(Broken(), train, val)
    assert isinstance(seen[0], RuntimeError) and seen[1:] == ["teardown fit"]


def test_callback_state_round_trips_through_a_checkpoint(tmp_path: Path) -> None:
    class Counter(Callback):
        def __init__(self) -> None:
            self.batches = 0
            self.loaded: dict[str, Any] = {}

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.batches += 1

        def state_dict(self) -> dict[str, Any]:
            return {"batches": self.batches}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.loaded = state

    train, val = loaders()
    first = quiet_trainer(callbacks=[Counter()], max_epochs=1)
    first.fit(Scripted(), train, val)
    first.save_checkpoint(tmp_path / "c.ckpt")
    fresh = Counter()
    quiet_trainer(callbacks=[fresh], max_epochs=2).fit(Scripted(), train, val, ckpt_path=tmp_path / "c.ckpt")
    assert fresh.loaded == {"batches": 4}


@pytest.mark.slow
def test_import_callbacks_is_cheap() -> None:
    code = (
        "import sys, callbacks; heavy = ('tensorboard', 'rich', 'torchmetrics', 'torch.utils.tensorboard');"
        "print([m for m in heavy if m in sys.modules]); print(sorted(callbacks.__all__))"
    )
    env = {"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True)
    heavy, names = out.stdout.splitlines()
    assert heavy == "[]"
    for name in ("ModelSummary", "ThroughputMonitor", "Timer", "CSVLogger", "EarlyStopping", "LearningRateMonitor"):
        assert name in names


def test_a_mock_with_the_callback_spec_gets_every_hook_a_callback_overriding_all_gets() -> None:
    from unittest.mock import Mock

    calls: list[str] = []

    class All(Callback):
        pass

    for hook in HOOKS:  # a class overriding every hook, recording its name
        setattr(All, hook, lambda self, *a, _h=hook, **k: calls.append(_h))
    mock = Mock(spec=Callback)
    train, val = loaders()
    quiet_trainer(callbacks=[All(), mock], max_epochs=1).fit(Scripted(), train, val)
    assert calls and [c[0] for c in mock.method_calls if c[0] in HOOKS] == calls


def test_a_stand_in_logger_gets_lightnings_calls(tmp_path: Path) -> None:
    from unittest.mock import Mock

    logger = Mock()  # answers every attribute: not a checkpoint callback, not a folder of its own
    logger.save_dir = tmp_path
    train, _ = loaders()
    trainer = quiet_trainer(logger=logger, max_epochs=1, log_every_n_steps=2)
    trainer.fit(Scripted(), train)
    assert trainer.logger is logger and trainer.checkpoint_callbacks == []
    assert trainer.log_dir == str(tmp_path)  # Lightning: the save_dir of a logger that is not TensorBoard's or CSV's
    calls = logger.log_metrics.call_args_list
    assert [c.kwargs["step"] for c in calls if "train/loss" in c.kwargs["metrics"]] == [1, 3]
    assert all(type(v) in (int, float) for c in calls for v in c.kwargs["metrics"].values())  # Python numbers
    # saved after each, and once when the run starts (log_graph, save), as Lightning does
    assert logger.save.call_count == len(calls) + 1
