"""Trainer(profiler=...): the simple, advanced and PyTorch profilers, and no cost without one."""

from __future__ import annotations

import json
import logging
import pickle
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import callbacks as cbs
from tests.helpers.regression import Regressor, make_loader
from tests.helpers.trainers import quiet_trainer
from trainer import DataModule, Trainer
from trainer.common.errors import MisconfigurationException
from trainer.loops.step import make_automatic_step, make_train_batch
from trainer.profilers import (
    AdvancedProfiler,
    PassThroughProfiler,
    Profiler,
    PyTorchProfiler,
    SimpleProfiler,
    XLAProfiler,
)

S = "[Strategy]SingleDeviceStrategy."  # Lightning's names for the seams the strategy runs
TRAIN_NEXT = "[_TrainingEpochLoop].train_dataloader_next"  # Lightning's name for a training fetch
STEP_ACTIONS = (TRAIN_NEXT, f"{S}batch_to_device", f"{S}training_step", f"{S}backward", "optimizer_step")


class Wide(Regressor):
    """A regressor whose step takes a few milliseconds, so the loop's own bookkeeping is small beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 1))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return F.mse_loss(self(x.repeat(64, 1)), y.repeat(64, 1))


def _fit(tmp_path: Path, profiler: Any, **kwargs: Any) -> Trainer:
    logger = cbs.TensorBoardLogger(tmp_path)
    trainer = quiet_trainer(tmp_path, profiler=profiler, max_epochs=2, logger=logger, **kwargs)
    trainer.fit(Regressor(), make_loader(16, 4), make_loader(8, 4))
    return trainer


def test_simple_profiler_names_every_action_and_its_self_times_add_up_to_the_runs_wall_time(tmp_path: Path) -> None:
    # Wall time measured outside, with perf_counter around trainer.fit (which includes the launch and
    # the set-up before the profiler starts); the table's self times (each action's time less the
    # actions nested in it, so none is counted twice) must add up to it within 10%.
    torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)  # the first optimizer imports torch._dynamo
    trainer = quiet_trainer(tmp_path, profiler="simple", max_epochs=2, callbacks=[cbs.Timer()])
    began = time.perf_counter()
    trainer.fit(Wide(), make_loader(48, 4))
    wall = time.perf_counter() - began
    profiler = trainer.profiler
    assert isinstance(profiler, SimpleProfiler)
    in_actions = sum(s.self_time for s in profiler.stats.values())
    assert abs(in_actions - wall) <= 0.1 * wall, (in_actions, wall)
    for action in STEP_ACTIONS:
        assert profiler.stats[action].count == 24, action  # one fetch per batch, as in Lightning
    assert profiler.stats["[LightningModule]Wide.optimizer_zero_grad"].count == 24
    table = profiler.summary()
    assert isinstance(table, str)
    for name in (*STEP_ACTIONS, "run_training_batch", "[Callback]Timer.on_train_batch_end", "Percentage %"):
        assert f"| {name} " in table, name
    # The total and self times are the recorded ones, in the table's rows.
    row = next(line for line in table.splitlines() if line.startswith(f"| {S}training_step "))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[2] == "24" and float(cells[3]) == pytest.approx(profiler.stats[f"{S}training_step"].total, rel=1e-4)


def test_simple_profiler_writes_its_table_in_the_log_directory_and_summary_returns_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with caplog.at_level(logging.INFO, logger="trainer.profilers"):
        trainer = _fit(tmp_path, "simple")
    report = Path(trainer.log_dir) / "fit-profiler.txt"
    assert report.read_text().strip() == trainer.profiler.summary().strip()
    # Shown as Lightning shows it: an INFO record (pytest's handler is configured), not printed too.
    shown = [r for r in caplog.records if r.name == "trainer.profilers" and r.levelno == logging.INFO]
    assert [r.getMessage().splitlines()[0] for r in shown] == ["FIT Profiler Report"]
    assert "Profiler Report" not in capsys.readouterr().out
    assert f"| {S}validation_step " in report.read_text()
    assert "| [LightningModule]Regressor.on_train_epoch_end " in report.read_text()  # the module's hooks have rows


def test_advanced_profiler_reports_cprofile_rows_for_each_action(tmp_path: Path) -> None:
    trainer = _fit(tmp_path, AdvancedProfiler(filename="perf"))
    summary = trainer.profiler.summary()
    section = summary.split(f"Profile stats for: {S}training_step\n", 1)[1].split("Profile stats for:", 1)[0]
    # cProfile's rows: ncalls ... filename:lineno(function); the module's own training_step ran 8 times.
    assert "ncalls" in section and "cumtime" in section
    assert any(line.split()[0] == "8" and "(training_step)" in line for line in section.splitlines() if line.strip())
    assert "(mse_loss)" in section
    assert (Path(trainer.log_dir) / "fit-perf.txt").read_text().strip() == summary.strip()
    assert pickle.loads(pickle.dumps(trainer.profiler)).profiled_actions == {}  # travels to DDP workers


def test_pytorch_profiler_trace_is_valid_json_with_the_record_function_markers(tmp_path: Path) -> None:
    trainer = _fit(tmp_path, "pytorch")
    profiler = trainer.profiler
    assert isinstance(profiler, PyTorchProfiler)
    traces = sorted(Path(trainer.log_dir).glob("*.pt.trace.json"))
    assert [t.name.split(".")[0] for t in traces] == ["fit-profiler-rank0"] and traces == profiler.trace_files
    events = json.loads(traces[0].read_text())["traceEvents"]
    names = {event.get("name") for event in events}
    actions = (*STEP_ACTIONS, "run_training_batch", "[LightningModule]Regressor.optimizer_zero_grad")
    for marker in (*(f"[pl][profile]{action}" for action in actions), "[module]Regressor", "ProfilerStep#2"):
        assert marker in names, marker
    assert "aten::addmm" in names  # torch's own operators, inside the markers
    assert "[pl][profile]run_training_batch" in (Path(trainer.log_dir) / "fit-profiler.txt").read_text()
    # Lightning's `function_events`: torch's events of the recorded window, kept once the profiler stopped.
    recorded = {event.name for event in profiler.function_events}
    assert {f"[pl][profile]{S}training_step", f"[pl][profile]{S}validation_step", "aten::addmm"} <= recorded


@pytest.mark.slow
def test_pytorch_profiler_under_ddp_writes_one_trace_per_rank(tmp_path: Path) -> None:
    logger = cbs.TensorBoardLogger(tmp_path)
    trainer = quiet_trainer(tmp_path, strategy="ddp_spawn", devices=2, profiler="pytorch", max_epochs=1, logger=logger)
    trainer.fit(Regressor(), make_loader(32, 4))
    traces = sorted(Path(trainer.log_dir).glob("*.pt.trace.json"))
    assert [t.name.split(".")[0] for t in traces] == ["fit-profiler-rank0", "fit-profiler-rank1"]
    for trace in traces:
        names = {event.get("name") for event in json.loads(trace.read_text())["traceEvents"]}
        steps = ("[Strategy]DDPStrategy.training_step", "[Strategy]DDPStrategy.backward", "optimizer_step")
        assert {f"[pl][profile]{action}" for action in steps} <= names


def test_without_a_profiler_the_step_binds_the_very_seams_it_bound_before(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    assert isinstance(trainer.profiler, PassThroughProfiler)
    module = Regressor()
    trainer.fit(module, make_loader(8, 4))
    optimizer = trainer.optimizers[0]
    step = make_automatic_step(trainer, trainer.run_state)
    seams = _closure(step)
    seams.update(_closure(seams["run_pieces"]))  # forward_backward
    seams.update(_closure(seams["finish_window"]))
    assert seams["training_step"] == module.training_step  # the bound method itself, not a wrapper
    assert seams["backward"] is torch.Tensor.backward
    assert seams["optimizer_step"] == optimizer.step
    assert seams["clip"] is None and seams["user_optimizer_step"] is None
    assert seams["before_backward"] is None  # hooks nobody overrides stay unbound
    batch_seams = _closure(make_train_batch(trainer, trainer.run_state))
    assert batch_seams["to_device"].__qualname__ == "device_mover.<locals>.move"  # the plain move, unwrapped
    # Hook dispatch resolves to the module's and callbacks' own methods.
    timer = cbs.Timer()
    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[timer])
    trainer.hooks.bind(module)
    module_fn, callback_fns = trainer.hooks._resolve("on_train_batch_end")
    assert module_fn is None and [fn.func for fn in callback_fns] == [timer.on_train_batch_end]


def test_with_a_profiler_the_same_seams_are_wrapped_in_their_actions(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, max_epochs=1, profiler="simple")
    module = Regressor()
    trainer.fit(module, make_loader(8, 4))
    seams = _closure(make_automatic_step(trainer, trainer.run_state))
    seams.update(_closure(seams["run_pieces"]))
    assert seams["training_step"] != module.training_step
    assert seams["training_step"].__wrapped__ == module.training_step


def test_a_training_batch_hook_only_callbacks_override_calls_their_own_methods(tmp_path: Path) -> None:
    """Bound for the loop, a per-batch hook only callbacks override calls each callback's own bound method,
    in order (no partial in between); under a profiler each call stays wrapped in its action."""
    seen: list[tuple[Any, Any, Any, int]] = []

    class Sees(cbs.Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            seen.append((self, trainer, outputs, batch_idx))

    first, second = Sees(), Sees()
    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[first, second])
    trainer.hooks.bind(Regressor())
    bound = trainer.hooks.bound("on_train_batch_end")
    assert bound is not None
    assert _closure(bound)["methods"] == (first.on_train_batch_end, second.on_train_batch_end)
    bound("out", None, 3)
    assert seen == [(first, trainer, "out", 3), (second, trainer, "out", 3)]
    profiled = quiet_trainer(tmp_path, max_epochs=1, callbacks=[first], profiler="simple")
    profiled.hooks.bind(Regressor())
    wrapped = profiled.hooks.bound("on_train_batch_end")
    assert wrapped is not None and "methods" not in _closure(wrapped)
    wrapped("out", None, 4)
    assert seen[-1] == (first, profiled, "out", 4)


def test_profiler_argument_is_checked_and_lightnings_refusals_name_the_alternative() -> None:
    with pytest.raises(MisconfigurationException, match=r"^When passing string value for the `profiler` parameter"):
        Trainer(profiler="fast", logger=False)
    with pytest.raises(ValueError, match=r"Trainer\(profiler='fast'\).*'advanced', 'pytorch', 'simple'"):
        Trainer(profiler="fast", logger=False)
    with pytest.raises(NotImplementedError, match=r"XLAProfiler.*PyTorchProfiler"):
        XLAProfiler()
    with pytest.raises(ValueError, match=r"emit_nvtx.*nsys"):
        PyTorchProfiler(emit_nvtx=True)
    for name, cls in (("simple", SimpleProfiler), ("Advanced", AdvancedProfiler), ("pytorch", PyTorchProfiler)):
        assert type(Trainer(profiler=name, logger=False).profiler) is cls


def test_a_profiler_of_your_own_sees_the_actions_in_order(tmp_path: Path) -> None:
    class Recorder(Profiler):
        def __init__(self) -> None:
            super().__init__()
            self.events: list[str] = []

        def start(self, action_name: str) -> None:
            self.events.append(f"+{action_name}")

        def stop(self, action_name: str) -> None:
            self.events.append(f"-{action_name}")

    recorder = Recorder()
    quiet_trainer(tmp_path, profiler=recorder, max_steps=1).fit(Regressor(), make_loader(8, 4))
    batch = recorder.events[recorder.events.index("+run_training_batch") : recorder.events.index("-run_training_batch")]
    assert batch == [
        "+run_training_batch",
        f"+{S}batch_to_device",
        f"-{S}batch_to_device",
        f"+{S}training_step",
        f"-{S}training_step",
        f"+{S}backward",
        f"-{S}backward",
        "+optimizer_step",
        "-optimizer_step",
        "+[LightningModule]Regressor.optimizer_zero_grad",
        "-[LightningModule]Regressor.optimizer_zero_grad",
    ]


def _closure(fn: Any) -> dict[str, Any]:
    """The variables a closure captured, by name (what the loop bound once for the epoch)."""
    return {name: cell.cell_contents for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True)}


def test_the_pytorch_profiler_works_without_a_trainer(tmp_path: Path) -> None:
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="alone")
    with profiler.profile("outer"):
        a = torch.ones(3)
        with profiler.profile("inner"):
            _ = a + a
    profiler.describe()
    names = {event.name for event in profiler.function_events}
    assert {"[pl][profile]outer", "[pl][profile]inner", "aten::add", "aten::ones"} <= names
    assert "[pl][profile]inner" in (tmp_path / "alone.txt").read_text()


def test_lightnings_messages_for_misused_actions_and_table_options() -> None:
    simple = SimpleProfiler()
    with pytest.raises(ValueError, match=r"^Attempting to stop recording an action"):
        simple.stop("load")
    simple.start("load")
    with pytest.raises(ValueError, match=r"^Attempted to start load"):
        simple.start("load")
    with pytest.raises(ValueError, match=r"^Attempting to stop recording an action"):
        AdvancedProfiler().stop("load")
    with pytest.raises(KeyError, match=r"table_kwargs key: row_limit\. This is already a positional argument"):
        PyTorchProfiler(table_kwargs={"row_limit": 3})
    with pytest.raises(KeyError, match=r"table_kwargs key: colour\. Should be within"):
        PyTorchProfiler(table_kwargs={"colour": "red"})
    PyTorchProfiler(table_kwargs={"max_name_column_width": 80})  # one of torch's table options


def _recorded_steps(profiler: PyTorchProfiler) -> dict[str, int]:
    names = [event.name for event in profiler.function_events or []]
    return {kind: names.count(f"[pl][profile]{S}{kind}_step") for kind in ("training", "validation")}


def test_pytorch_profiler_counts_each_kind_of_batch_apart(tmp_path: Path) -> None:
    # 8 training batches, then 8 validation batches: each kind waits 1, warms up 1, records 3 of its own.
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="prof")
    trainer = quiet_trainer(tmp_path, profiler=profiler, max_epochs=1, num_sanity_val_steps=2)
    trainer.fit(Regressor(), make_loader(32, 4), make_loader(32, 4))
    # two windows, two traces (named with the filename); function_events: the last window's
    assert [t.name.split(".")[0] for t in profiler.trace_files] == ["fit-prof-rank0"] * 2
    assert _recorded_steps(profiler) == {"training": 0, "validation": 3}  # the sanity check's 2 are not counted
    train_window, val_window = (
        [e.get("name") for e in json.loads(t.read_text())["traceEvents"]] for t in profiler.trace_files
    )
    assert train_window.count(f"[pl][profile]{S}training_step") == 3
    assert val_window.count(f"[pl][profile]{S}validation_step") == 3


def test_pytorch_profiler_records_all_of_a_stage_too_short_for_its_window(tmp_path: Path) -> None:
    profiler = PyTorchProfiler(dirpath=tmp_path)
    trainer = quiet_trainer(tmp_path, profiler=profiler, max_epochs=1)
    with pytest.warns(UserWarning, match="default schedule will be overridden as there is not enough steps"):
        trainer.fit(Regressor(), make_loader(8, 4), make_loader(4, 4))  # 2 training batches, 1 validation batch
    assert _recorded_steps(profiler) == {"training": 1, "validation": 1}  # from the end of the first batch on
    assert pickle.loads(pickle.dumps(profiler))._lightning_module is None  # the run's module is not kept


def test_two_loggers_in_one_folder_share_its_version(tmp_path: Path) -> None:
    loggers = [cbs.TensorBoardLogger(tmp_path), cbs.CSVLogger(tmp_path)]
    quiet_trainer(tmp_path, logger=loggers, max_epochs=1).fit(Regressor(), make_loader(8, 4))
    assert [logger.log_dir for logger in loggers] == [str(tmp_path / "lightning_logs" / "version_0")] * 2


class _Data(DataModule):
    """Two validation loaders, one test and one predict loader, and a ``prepare_data`` to profile."""

    def prepare_data(self) -> None:
        pass

    def train_dataloader(self) -> Any:
        return make_loader(8, 4)

    def val_dataloader(self) -> Any:
        return [make_loader(8, 4), make_loader(4, 4)]

    def test_dataloader(self) -> Any:
        return make_loader(12, 4)

    def predict_dataloader(self) -> Any:
        return make_loader(4, 4)


class _TwoLoaders(Regressor):
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        super().validation_step(batch, batch_idx)


def test_fetches_and_data_hooks_are_lightnings_actions_and_recorded_durations_cover_every_stage(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, max_epochs=1, profiler=SimpleProfiler())
    module, data = _TwoLoaders(), _Data()
    trainer.fit(module, datamodule=data)
    trainer.save_checkpoint(tmp_path / "data.ckpt")  # the data module's state_dict: an action too
    trainer.test(module, datamodule=data)
    trainer.predict(module, datamodule=data)
    profiler = trainer.profiler
    assert isinstance(profiler, SimpleProfiler)
    counts = {name: len(durations) for name, durations in profiler.recorded_durations.items()}
    # Lightning's names, one fetch per batch (the call that finds a loader exhausted is not one).
    assert counts[TRAIN_NEXT] == 2
    assert counts["[_EvaluationLoop].val_next"] == 2 + 1
    assert counts["[_EvaluationLoop].test_next"] == 3
    assert counts["[_PredictionLoop].predict_next"] == 1
    # Lightning's recorded_durations keep every stage's calls; the table is the last stage's.
    assert counts["[LightningDataModule]_Data.prepare_data"] == 3
    assert counts["[LightningDataModule]_Data.setup"] == 3
    assert counts["[LightningDataModule]_Data.state_dict"] == 1
    assert "[_EvaluationLoop].test_next" not in profiler.stats and profiler.summary().startswith("PREDICT")


def test_every_callbacks_every_hook_is_an_action_under_a_profiler_and_none_is_called_without(tmp_path: Path) -> None:
    stops = [cbs.EarlyStopping("val_loss"), cbs.EarlyStopping("val_loss", mode="max")]
    trainer = quiet_trainer(tmp_path, max_epochs=1, profiler="simple", callbacks=stops)
    trainer.fit(Regressor(), make_loader(8, 4), make_loader(4, 4))
    profiler = trainer.profiler
    assert isinstance(profiler, SimpleProfiler)
    for stop in stops:  # EarlyStopping keeps Callback's empty on_validation_start: timed, as Lightning's
        assert len(profiler.recorded_durations[f"[Callback]{stop.state_key}.on_validation_start"]) == 1
    plain = quiet_trainer(tmp_path, max_epochs=1, callbacks=stops)
    plain.hooks.bind(Regressor())
    assert not plain.hooks.overridden("on_validation_start")  # without a profiler: never called


def test_simple_profiler_sums_each_total_with_math_fsum(monkeypatch: pytest.MonkeyPatch) -> None:
    import trainer.profilers.simple as simple

    summed: list[list[float]] = []

    def fsum(values: Any) -> float:
        summed.append(list(values))
        return sum(summed[-1])

    monkeypatch.setattr(simple.math, "fsum", fsum)
    profiler = SimpleProfiler()
    profiler.setup("fit")
    for _ in range(3):
        with profiler.profile("load"):
            pass
    profiler.summary()
    assert summed == [profiler.recorded_durations["load"]] and len(summed[0]) == 3
