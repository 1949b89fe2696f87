"""Lightning 2.6's ``Trainer(...)`` arguments: each one is accepted with Lightning's default, in
Lightning's order, and honoured with Lightning's meaning (a test below) or refused naming it."""

from __future__ import annotations

import inspect
import logging
import re
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import callbacks as cbs
from strategies import DDPStrategy, SingleDeviceStrategy
from strategies.precision import HalfPrecision, MixedPrecision, Precision, make_precision
from strategies.registry import build_strategy, resolve_strategy
from tests.helpers import REPO_ROOT
from tests.helpers.tiny_mlp import TinyMLP, make_batches
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule, arguments
from trainer.common.errors import MisconfigurationException

# Lightning 2.6.6's Trainer.__init__, in order, with its defaults (from lightning-2.6-api.md).
LIGHTNING_ARGS: list[tuple[str, Any]] = [
    ("accelerator", "auto"),
    ("strategy", "auto"),
    ("devices", "auto"),
    ("num_nodes", 1),
    ("precision", None),
    ("logger", None),
    ("callbacks", None),
    ("fast_dev_run", False),
    ("max_epochs", None),
    ("min_epochs", None),
    ("max_steps", -1),
    ("min_steps", None),
    ("max_time", None),
    ("limit_train_batches", None),
    ("limit_val_batches", None),
    ("limit_test_batches", None),
    ("limit_predict_batches", None),
    ("overfit_batches", 0.0),
    ("val_check_interval", None),
    ("check_val_every_n_epoch", 1),
    ("num_sanity_val_steps", None),
    ("log_every_n_steps", None),
    ("enable_checkpointing", None),
    ("enable_progress_bar", None),
    ("enable_model_summary", None),
    ("accumulate_grad_batches", 1),
    ("gradient_clip_val", None),
    ("gradient_clip_algorithm", None),
    ("deterministic", None),
    ("benchmark", None),
    ("inference_mode", True),
    ("use_distributed_sampler", True),
    ("profiler", None),
    ("detect_anomaly", False),
    ("barebones", False),
    ("plugins", None),
    ("sync_batchnorm", False),
    ("reload_dataloaders_every_n_epochs", 0),
    ("default_root_dir", None),
    ("enable_autolog_hparams", True),
    ("model_registry", None),
]

# A non-default value of each name, and where it is honoured: a test (here, or "file::test") or
# "refused" (Trainer(...) raises naming it).
NON_DEFAULTS: dict[str, tuple[Any, str]] = {
    "accelerator": ("cpu", "test_accelerator_chooses_the_device_of_named_strategies"),
    "strategy": ("ddp_spawn", "test_lightning_strategy_names_build_ours"),
    "devices": ("0,1", "test_devices_forms"),
    "num_nodes": (2, "test_num_nodes"),
    "precision": ("64-true", "test_64_true_trains_like_a_float64_hand_written_loop"),
    "logger": ([], "test_logger_instances_and_lists_join_the_callbacks"),
    "callbacks": ([], "test_a_single_callback_instance_is_accepted"),
    "fast_dev_run": (True, "tests/test_trainer_loop_control.py::test_fast_dev_run"),
    "max_epochs": (2, "tests/test_trainer_loop_control.py::test_check_val_every_n_epoch"),
    "min_epochs": (2, "test_min_epochs_defers_should_stop"),
    "max_steps": (3, "tests/test_trainer_parity.py::test_max_steps_stops_mid_epoch"),
    "min_steps": (3, "test_min_steps_defers_should_stop"),
    "max_time": ("00:00:00:00", "test_max_time_stops_training"),
    "limit_train_batches": (2, "tests/test_trainer_loop_control.py::test_limit_batches"),
    "limit_val_batches": (2, "tests/test_trainer_loop_control.py::test_limit_batches"),
    "limit_test_batches": (2, "test_limit_test_and_predict_batches"),
    "limit_predict_batches": (2, "test_limit_test_and_predict_batches"),
    "overfit_batches": (2, "test_overfit_batches_trains_and_validates_on_the_first_batches_unshuffled"),
    "val_check_interval": (2, "tests/test_trainer_loop_control.py::test_val_check_interval"),
    "check_val_every_n_epoch": (None, "test_check_val_every_n_epoch_none_counts_batches_across_epochs"),
    "num_sanity_val_steps": (0, "tests/test_trainer_loop_control.py::test_num_sanity_val_steps"),
    "log_every_n_steps": (1, "tests/test_logging.py::test_loggers_receive_step_values_every_n_steps"),
    "enable_checkpointing": (False, "test_none_means_the_default_and_false_turns_a_default_off"),
    "enable_progress_bar": (False, "test_none_means_the_default_and_false_turns_a_default_off"),
    "enable_model_summary": (False, "test_none_means_the_default_and_false_turns_a_default_off"),
    "accumulate_grad_batches": (2, "tests/test_trainer_parity.py::test_accumulation_divides_the_loss"),
    "gradient_clip_val": (0.5, "tests/test_trainer_parity.py::test_fit_matches_plain_loop"),
    "gradient_clip_algorithm": ("value", "tests/test_trainer_parity.py::test_fit_matches_plain_loop"),
    "deterministic": ("warn", "test_deterministic_and_benchmark_set_torch_flags"),
    "benchmark": (True, "test_deterministic_and_benchmark_set_torch_flags"),
    "inference_mode": (False, "test_inference_mode_chooses_the_evaluation_grad_mode"),
    "use_distributed_sampler": (False, "test_use_distributed_sampler_false_leaves_loaders_untouched"),
    "profiler": (
        "simple",
        "tests/test_profilers.py::test_simple_profiler_names_every_action_and_its_self_times_add_up_to_the_runs_wall_time",
    ),
    "detect_anomaly": (True, "test_detect_anomaly_runs_fit_under_anomaly_detection"),
    "barebones": (True, "test_barebones_turns_everything_off_and_refuses_what_it_turns_off"),
    "plugins": (
        "DoublePrecision()",
        "tests/test_lightning_plugins.py::test_a_precision_plugin_trains_as_its_precision_string",
    ),
    "sync_batchnorm": (True, "test_sync_batchnorm"),
    "reload_dataloaders_every_n_epochs": (2, "test_reload_dataloaders_every_n_epochs"),
    "default_root_dir": ("/tmp", "test_default_root_dir_none_is_the_working_directory"),
    "enable_autolog_hparams": (False, "refused"),
    "model_registry": ("my-model", "refused"),
}


def test_trainer_takes_every_lightning_argument_in_order_with_its_default() -> None:
    params = list(inspect.signature(Trainer.__init__).parameters.values())[1:]
    lightning = params[: len(LIGHTNING_ARGS)]
    assert [(p.name, p.default) for p in lightning] == LIGHTNING_ARGS
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in lightning)
    # geartrain's own arguments follow, keyword-only.
    ours = params[len(LIGHTNING_ARGS) :]
    assert ours and all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in ours)
    assert {p.name for p in ours} >= {"on_nonfinite", "micro_batch_size", "compile"}


@pytest.mark.parametrize("name", [name for name, _ in LIGHTNING_ARGS])
def test_every_non_default_value_is_honoured_by_a_test_or_refused_by_name(name: str) -> None:
    value, where = NON_DEFAULTS[name]
    if where == "refused":
        with pytest.raises(ValueError, match=re.escape(name)):
            Trainer(**{name: value})
        return
    path, _, test = where.rpartition("::")
    source = (REPO_ROOT / path).read_text() if path else Path(__file__).read_text()
    assert f"def {test}(" in source, f"{name}: no test {where}"


def test_lightning_positional_order_works() -> None:
    trainer = Trainer("cpu", "single", 1, 1, "bf16-mixed", False, None, False, 1)
    assert trainer.strategy.root_device.type == "cpu" and trainer.strategy.precision.name == "bf16-mixed"
    assert trainer.max_epochs == 1


# ----------------------------------------------------------------- accelerator, strategy, devices
def test_accelerator_chooses_the_device_of_named_strategies() -> None:
    for strategy in ("auto", "single", "amp"):
        assert Trainer(accelerator="cpu", strategy=strategy, logger=False).strategy.root_device.type == "cpu"
    ddp = Trainer(accelerator="cpu", strategy="ddp", devices=2, logger=False).strategy
    assert isinstance(ddp, DDPStrategy) and ddp.root_device.type == "cpu" and ddp.world_size == 2
    # An instance keeps working; one on another kind of device is refused.
    assert Trainer(accelerator="cpu", strategy=SingleDeviceStrategy(device="cpu"), logger=False)
    with pytest.raises(ValueError, match=r"accelerator='cpu'.*on 'meta'"):
        Trainer(accelerator="cpu", strategy=SingleDeviceStrategy(device="meta"), logger=False)


def test_accelerators_that_are_missing_or_unsupported_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    for name in ("gpu", "cuda"):
        with pytest.raises(RuntimeError, match=f"accelerator='{name}'.*(no GPU|CUDA is not available)"):
            Trainer(accelerator=name)
    with pytest.raises(RuntimeError, match="accelerator='mps'"):
        Trainer(accelerator="mps")
    for name in ("tpu", "hpu", "xla"):
        with pytest.raises(ValueError, match=f"accelerator='{name}' is not supported; geartrain runs on auto, cpu"):
            Trainer(accelerator=name)


@pytest.mark.parametrize(
    ("name", "start_method", "find_unused"),
    [
        ("ddp_spawn", "spawn", False),
        ("ddp_fork", "fork", False),
        ("ddp_notebook", "fork", False),
        ("ddp_find_unused_parameters_true", "popen", True),  # Lightning's ddp: the script runs again
        ("ddp", "popen", False),
    ],
)
def test_lightning_strategy_names_build_ours(name: str, start_method: str, find_unused: bool) -> None:
    strategy = Trainer(strategy=name, accelerator="cpu", devices=2, logger=False).strategy
    assert isinstance(strategy, DDPStrategy) and strategy.name == name
    assert strategy.start_method == start_method
    assert strategy.ddp_kwargs["find_unused_parameters"] is find_unused
    assert type(resolve_strategy("single_device")) is SingleDeviceStrategy
    assert build_strategy("ddp_fork", device="cpu", start_method="spawn").start_method == "spawn"


@pytest.mark.parametrize("name", ["deepspeed", "deepspeed_stage_2", "xla", "single_xla"])
def test_lightning_strategies_we_lack_are_refused_naming_ours(name: str) -> None:
    with pytest.raises(ValueError, match=f"strategy='{name}' is a Lightning strategy.*valid names: auto, amp, ddp"):
        Trainer(strategy=name)


def test_devices_forms() -> None:
    def world(devices: Any) -> int:
        return Trainer(strategy="ddp", accelerator="cpu", devices=devices, logger=False).strategy.world_size

    assert world(2) == world("2") == world([0, 1]) == world("0,1") == world((0, 1)) == 2
    assert world(-1) == world("auto") == 1  # the CPU is one device
    assert isinstance(Trainer(accelerator="cpu", devices="0,1,2", logger=False).strategy, DDPStrategy)
    with pytest.raises(ValueError, match=r"devices=\[1, 3\].*indices must be 0..n-1.*CUDA_VISIBLE_DEVICES=1,3"):
        Trainer(devices=[1, 3])
    for bad in (0, "x", "1,a"):
        with pytest.raises(ValueError, match="devices="):
            Trainer(devices=bad)
    with pytest.raises(TypeError, match="devices must be"):
        Trainer(devices=1.5)


def test_num_nodes(clean_distributed_env: None) -> None:
    trainer = Trainer(strategy="ddp", accelerator="cpu", devices=2, num_nodes=2, logger=False)
    assert trainer.strategy.world_size == 4
    # Processes on other machines are not started from here: torchrun or srun start them.
    with pytest.raises(
        RuntimeError, match=re.escape("num_nodes=2: start one launcher per machine, e.g. `torchrun --nnodes=2")
    ):
        trainer.fit(TinyMLP(), make_batches(1))
    with pytest.raises(ValueError, match="strategy='single' runs on one node; got num_nodes=2"):
        Trainer(strategy="single", num_nodes=2)


# ----------------------------------------------------------------- precision
@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        (32, "32-true"),
        ("32", "32-true"),
        ("32-true", "32-true"),
        (16, "16-mixed"),
        ("16", "16-mixed"),
        ("16-mixed", "16-mixed"),
        ("bf16", "bf16-mixed"),
        ("bf16-mixed", "bf16-mixed"),
        ("16-true", "16-true"),
        ("bf16-true", "bf16-true"),
        (64, "64-true"),
        ("64", "64-true"),
        ("64-true", "64-true"),
    ],
)
def test_every_lightning_precision_spelling(spelling: Any, name: str) -> None:
    trainer = Trainer(accelerator="cpu", precision=spelling, logger=False)
    plugin = trainer.strategy.precision
    assert plugin.name == name
    expected = {"-true": (HalfPrecision, Precision), "-mixed": (MixedPrecision,)}
    assert isinstance(plugin, expected["-true" if name.endswith("-true") else "-mixed"])


@pytest.mark.parametrize("spelling", ["transformer-engine", "transformer-engine-float16", "nf4", "int8-training"])
def test_plugin_precisions_are_refused_by_name(spelling: str) -> None:
    with pytest.raises(ValueError, match=f"precision='{spelling}' is a Lightning plugin precision.*64-true"):
        Trainer(precision=spelling)


def test_16_true_casts_module_and_floating_inputs() -> None:
    plugin = make_precision("16-true", "cpu")
    module = plugin.convert_module(nn.Linear(2, 2))
    assert module.weight.dtype == torch.float16
    x, y = plugin.convert_input((torch.ones(2), torch.ones(2, dtype=torch.long)))
    assert x.dtype == torch.float16 and y.dtype == torch.long


def test_64_true_trains_like_a_float64_hand_written_loop() -> None:
    torch.manual_seed(0)
    model = TinyMLP(log_loss=False)
    reference = TinyMLP(log_loss=False)
    reference.load_state_dict(model.state_dict())
    reference.double()
    batches = make_batches(3)
    quiet_trainer(max_epochs=1, precision="64-true").fit(model, batches)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    for x, y in batches:
        loss = nn.functional.cross_entropy(reference(x.double()), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    for (name, got), want in zip(model.state_dict().items(), reference.state_dict().values()):
        assert got.dtype == torch.float64, name
        assert torch.equal(got, want), name


# ----------------------------------------------------------------- switches and loggers
def test_none_means_the_default_and_false_turns_a_default_off(tmp_path: Path) -> None:
    trainer = Trainer(default_root_dir=tmp_path)
    kinds = [type(cb) for cb in trainer.callbacks]
    assert kinds == [cbs.ProgressBar, cbs.ModelSummary, cbs.TensorBoardLogger, cbs.ModelCheckpoint]
    assert trainer.num_sanity_val_steps == 2 and trainer.log_every_n_steps == 50
    assert trainer.gradient_clip_algorithm is None and trainer.deterministic is None  # Lightning's: clipping uses norm
    off = Trainer(
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
    )
    assert off.callbacks == []


def test_model_summary_is_printed_at_fit_start_by_default(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    quiet_trainer(tmp_path, max_epochs=1, enable_model_summary=None).fit(TinyMLP(), make_batches(1))
    assert "Trainable params" in capsys.readouterr().out


def test_logger_instances_and_lists_join_the_callbacks(tmp_path: Path) -> None:
    tb, csv = cbs.TensorBoardLogger(save_dir=tmp_path), cbs.CSVLogger(save_dir=tmp_path)
    one = Trainer(logger=tb, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    assert one.callbacks == [tb]
    both = quiet_trainer(tmp_path, logger=[tb, csv], max_epochs=1, log_every_n_steps=1)
    assert both.callbacks == [tb, csv]
    both.fit(TinyMLP(), make_batches(2))
    assert list(tmp_path.rglob("*.csv"))  # the CSV logger wrote what it got
    with pytest.raises(TypeError, match=r"logger= takes True/False or geartrain loggers.*got ProgressBar"):
        Trainer(logger=cbs.ProgressBar())


def test_a_single_callback_instance_is_accepted() -> None:
    timer = cbs.Timer()
    assert quiet_trainer(callbacks=[]).callbacks == []
    assert Trainer(callbacks=timer, logger=False, enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=False).callbacks == [timer]  # fmt: skip


def test_barebones_turns_everything_off_and_refuses_what_it_turns_off(tmp_path: Path) -> None:
    trainer = Trainer(barebones=True, default_root_dir=tmp_path, max_epochs=1)
    assert trainer.callbacks == [] and trainer.num_sanity_val_steps == 0 and trainer.log_every_n_steps == 0
    trainer.fit(TinyMLP(), make_batches(2))
    assert trainer.global_step == 2 and not list(tmp_path.iterdir())  # nothing written
    for name, value in (
        ("enable_checkpointing", True),
        ("logger", True),
        ("enable_progress_bar", True),
        ("enable_model_summary", True),
        ("log_every_n_steps", 5),
        ("num_sanity_val_steps", 2),
        ("fast_dev_run", True),
        ("detect_anomaly", True),
        ("profiler", "simple"),
    ):
        with pytest.raises(ValueError, match=f"barebones=True.*turns {name} off"):
            Trainer(barebones=True, **{name: value})
        with pytest.raises(ValueError, match=re.escape(f"`Trainer(barebones=True, {name}={value!r})` was passed")):
            Trainer(barebones=True, **{name: value})  # Lightning's words


def test_barebones_says_so_once_at_info_level(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    with caplog.at_level(logging.INFO):
        Trainer(default_root_dir=tmp_path)
        assert "barebones" not in caplog.text
        Trainer(barebones=True, default_root_dir=tmp_path)
    (line,) = [r.getMessage() for r in caplog.records if "barebones" in r.getMessage()]
    assert line.startswith("You are running in `Trainer(barebones=True)` mode.")  # Lightning's words
    assert "enable_checkpointing" in line and "profiler" in line  # and what it turned off


def test_default_root_dir_none_is_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert Trainer(logger=False).default_root_dir == str(tmp_path)  # a string, as Lightning's


@pytest.mark.parametrize(
    ("name", "value", "alternative"),
    [
        ("model_registry", "name", "save_checkpoint"),
        ("enable_autolog_hparams", False, "logger=False"),
    ],
)
def test_unsupported_arguments_are_refused_naming_the_alternative(name: str, value: Any, alternative: str) -> None:
    with pytest.raises(ValueError, match=rf"Trainer\({name}=.*not supported.*{re.escape(alternative)}"):
        Trainer(**{name: value})


# ----------------------------------------------------------------- loop control
class StopAtOnce(cbs.Callback):
    """Asks to stop after every training batch (as early stopping would)."""

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, i: int) -> None:
        trainer.should_stop = True


def test_min_epochs_defers_should_stop() -> None:
    trainer = quiet_trainer(callbacks=[StopAtOnce()], max_epochs=10, min_epochs=3)
    trainer.fit(TinyMLP(), make_batches(2))
    assert trainer.global_step == 6  # 3 whole epochs, then the stop is obeyed
    plain = quiet_trainer(callbacks=[StopAtOnce()], max_epochs=10)
    plain.fit(TinyMLP(), make_batches(2))
    assert plain.global_step == 1


def test_min_steps_defers_should_stop() -> None:
    trainer = quiet_trainer(callbacks=[StopAtOnce()], max_epochs=10, min_steps=5)
    trainer.fit(TinyMLP(), make_batches(2))
    assert trainer.global_step == 5


@pytest.mark.parametrize("max_time", ["00:00:00:00", {"seconds": 0}, timedelta(0)])
def test_max_time_stops_training(max_time: Any) -> None:
    trainer = quiet_trainer(max_time=max_time)  # max_epochs=None with max_time: no epoch limit
    assert trainer.max_epochs is None
    timers = [cb for cb in trainer.callbacks if isinstance(cb, cbs.Timer)]
    assert len(timers) == 1 and timers[0].max_time == timedelta(0)
    trainer.fit(TinyMLP(log_loss=False), make_batches(3))
    assert trainer.global_step == 0  # as Lightning: a spent budget is seen at fit start, before any step
    assert quiet_trainer(max_time={"days": 1, "hours": 5}).callbacks[0].max_time == timedelta(days=1, hours=5)


class Recorder(TinyMLP):
    """Records the first input value of every training/validation batch and the grad mode of evaluation."""

    def __init__(self) -> None:
        super().__init__(log_loss=False)
        self.seen: dict[str, list[float]] = {"train": [], "val": []}
        self.modes: list[tuple[bool, bool]] = []
        self.anomaly: list[bool] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen["train"].append(float(batch[0][0, 0]))
        self.anomaly.append(torch.is_anomaly_enabled())
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.seen["val"].append(float(batch[0][0, 0]))
        self.modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))


def _dataset(n: int = 16) -> TensorDataset:
    return TensorDataset(torch.arange(n * 32, dtype=torch.float32).reshape(n, 32), torch.zeros(n, dtype=torch.long))


@pytest.mark.parametrize(("overfit", "batches"), [(2, 2), (0.5, 2)])
def test_overfit_batches_trains_and_validates_on_the_first_batches_unshuffled(overfit: Any, batches: int) -> None:
    module = Recorder()
    train = DataLoader(_dataset(), batch_size=4, shuffle=True)
    val = DataLoader(_dataset(), batch_size=4)
    with pytest.warns(UserWarning, match="You requested to overfit but enabled train dataloader shuffling"):
        quiet_trainer(max_epochs=3, overfit_batches=overfit).fit(module, train, val)
    first = [i * 4 * 32.0 for i in range(batches)]  # the first input value of batches 0, 1 in order
    assert module.seen["train"] == first * 3
    assert module.seen["val"] == first * 3


def test_check_val_every_n_epoch_none_counts_batches_across_epochs() -> None:
    steps: list[int] = []

    class At(cbs.Callback):
        def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
            steps.append(trainer.global_step)

    trainer = quiet_trainer(callbacks=[At()], max_epochs=3, val_check_interval=2, check_val_every_n_epoch=None)
    trainer.fit(TinyMLP(), make_batches(3), make_batches(1))
    assert steps == [2, 4, 6, 8]  # every 2 batches of 9, across epoch ends, and no epoch-end runs
    with pytest.raises(ValueError, match=r"check_val_every_n_epoch=None.*val_check_interval must be an int"):
        Trainer(check_val_every_n_epoch=None, val_check_interval=0.5)


def test_limit_test_and_predict_batches() -> None:
    seen: list[str] = []

    class Module(TinyMLP):
        def test_step(self, batch: Any, batch_idx: int) -> None:
            seen.append("test")

        def predict_step(self, batch: Any, batch_idx: int) -> Any:
            seen.append("predict")

    trainer = quiet_trainer(limit_test_batches=2, limit_predict_batches=1)
    trainer.test(Module(), make_batches(5))
    trainer.predict(Module(), make_batches(5))
    assert seen == ["test", "test", "predict"]


def test_reload_dataloaders_every_n_epochs() -> None:
    class Module(TinyMLP):
        calls = 0
        val_calls = 0

        def train_dataloader(self) -> Any:
            type(self).calls += 1
            return make_batches(2, seed=self.calls)

        def val_dataloader(self) -> Any:
            type(self).val_calls += 1
            return make_batches(1)

    quiet_trainer(max_epochs=5, reload_dataloaders_every_n_epochs=2).fit(Module())
    assert (Module.calls, Module.val_calls) == (3, 3)  # epochs 0, 2, 4
    Module.calls = Module.val_calls = 0
    quiet_trainer(max_epochs=5).fit(Module())
    assert (Module.calls, Module.val_calls) == (1, 1)
    with pytest.raises(MisconfigurationException, match="`reload_dataloaders_every_n_epochs` should be an int >= 0"):
        Trainer(reload_dataloaders_every_n_epochs=-1)


@pytest.mark.parametrize(
    ("sanity", "every_val", "every_reload", "train_at", "val_at", "validated_at"),
    [
        (1, 1, 1, list(range(6)), [("sanity", 0), 1, 2, 3, 4, 5], list(range(6))),
        (0, 3, 4, [0, 4], [2], [2, 5]),
        (1, 3, 4, [0, 4], [("sanity", 0), 2], [2, 5]),
        (0, 2, 1, list(range(6)), [1, 3, 5], [1, 3, 5]),
    ],
)
def test_loaders_are_requested_at_lightnings_moments(
    sanity: int, every_val: int, every_reload: int, train_at: list[int], val_at: list[Any], validated_at: list[int]
) -> None:
    """val_dataloader() inside the sanity check, then train_dataloader(); later val requests at validations only."""
    calls: list[Any] = []

    class Module(TinyMLP):
        def on_fit_start(self) -> None:
            calls.append("on_fit_start")

        def train_dataloader(self) -> Any:
            calls.append(("train", self.current_epoch))
            return make_batches(2)

        def val_dataloader(self) -> Any:
            calls.append(("sanity" if self.trainer.sanity_checking else "val", self.current_epoch))
            return make_batches(1)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            if not self.trainer.sanity_checking:
                calls.append(("step", self.current_epoch))

    trainer = quiet_trainer(
        max_epochs=6,
        num_sanity_val_steps=sanity,
        check_val_every_n_epoch=every_val,
        reload_dataloaders_every_n_epochs=every_reload,
        limit_train_batches=1,
    )
    trainer.fit(Module())
    assert calls[0] == "on_fit_start"
    assert [epoch for kind, epoch in calls[1:] if kind == "train"] == train_at
    assert [c if c[0] == "sanity" else c[1] for c in calls[1:] if c[0] in ("val", "sanity")] == val_at
    assert [epoch for kind, epoch in calls[1:] if kind == "step"] == validated_at
    if sanity:  # the sanity check asks first, as Lightning
        assert calls[1:3] == [("sanity", 0), ("train", 0)]


def test_val_dataloader_draws_in_the_sanity_check_leave_the_training_data_as_lightning() -> None:
    """Both loader methods draw their data from torch's generator: the sanity check's draws are undone before
    train_dataloader() runs (Lightning's isolate_rng), so with overfit_batches=1 both see the same batch."""
    seen: dict[str, list[torch.Tensor]] = {"train": [], "val": []}

    class Random(TinyMLP):
        def train_dataloader(self) -> Any:
            return DataLoader(TensorDataset(torch.randn(8, 32), torch.zeros(8, dtype=torch.long)), batch_size=4)

        val_dataloader = train_dataloader

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            seen["train"].append(batch[0])
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            seen["val"].append(batch[0])

    quiet_trainer(max_epochs=1, overfit_batches=1, num_sanity_val_steps=1).fit(Random())
    assert torch.equal(seen["train"][0], seen["val"][0])


def test_an_epoch_shorter_than_the_logging_interval_is_said_as_lightning(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match=r"The number of training batches \(3\) is smaller than the logging interval"):
        quiet_trainer(max_epochs=1, log_every_n_steps=5, logger=cbs.CSVLogger(tmp_path)).fit(TinyMLP(), make_batches(3))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_trainer(max_epochs=1, log_every_n_steps=5).fit(TinyMLP(), make_batches(3))  # no logger: nothing lost
        quiet_trainer(log_every_n_steps=5, logger=cbs.CSVLogger(tmp_path), fast_dev_run=2).fit(
            TinyMLP(), make_batches(3)
        )
    assert not [w for w in seen if "logging interval" in str(w.message)]


# ----------------------------------------------------------------- torch switches
@pytest.fixture
def restore_torch_flags() -> Any:
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    benchmark = torch.backends.cudnn.benchmark
    yield
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    torch.backends.cudnn.benchmark = benchmark


def test_deterministic_and_benchmark_set_torch_flags(restore_torch_flags: None) -> None:
    Trainer(deterministic="warn", logger=False)
    assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.benchmark is False  # deterministic turns benchmark off unless asked
    Trainer(benchmark=True, logger=False)
    assert torch.backends.cudnn.benchmark is True
    Trainer(benchmark=None, logger=False)
    assert torch.backends.cudnn.benchmark is True  # None leaves it
    Trainer(benchmark=False, logger=False)
    assert torch.backends.cudnn.benchmark is False
    with pytest.raises(ValueError, match="deterministic must be True, False, 'warn' or None"):
        Trainer(deterministic="yes")


@pytest.mark.parametrize(("inference_mode", "mode"), [(True, (True, False)), (False, (False, False))])
def test_inference_mode_chooses_the_evaluation_grad_mode(inference_mode: bool, mode: tuple[bool, bool]) -> None:
    module = Recorder()
    trainer = quiet_trainer(inference_mode=inference_mode, max_epochs=1)
    trainer.fit(module, make_batches(1), make_batches(1))
    trainer.validate(module, make_batches(1))
    # As Lightning: validation inside fit runs under no_grad whatever the flag (its tensors feed training).
    assert module.modes == [(False, False), mode]


def test_detect_anomaly_runs_fit_under_anomaly_detection() -> None:
    module = Recorder()
    quiet_trainer(detect_anomaly=True, max_epochs=1).fit(module, make_batches(2))
    assert module.anomaly == [True, True] and not torch.is_anomaly_enabled()
    quiet_trainer(max_epochs=1).fit(module, make_batches(1))
    assert module.anomaly[-1] is False


def test_use_distributed_sampler_false_leaves_loaders_untouched() -> None:
    class Sharding(SingleDeviceStrategy):
        def process_dataloader(self, dataloader: Any, *, train: bool) -> Any:
            return make_batches(1, seed=99)  # what a sampler replacement would hand back

    for flag, expected in ((True, 1), (False, 3)):
        trainer = quiet_trainer(strategy=Sharding(device="cpu"), use_distributed_sampler=flag, max_epochs=1)
        assert trainer.use_distributed_sampler is flag
        trainer.fit(TinyMLP(), make_batches(3))
        assert trainer.global_step == expected


class BatchNormNet(TinyMLP):
    def __init__(self) -> None:
        super().__init__(log_loss=False)
        self.net = nn.Sequential(nn.Linear(32, 8), nn.BatchNorm1d(8), nn.Linear(8, 10))


def test_sync_batchnorm() -> None:
    # Several processes on CPU: torch cannot sync there, refused at Trainer(...).
    with pytest.raises(ValueError, match="sync_batchnorm=True: torch's SyncBatchNorm synchronises only on CUDA"):
        Trainer(strategy="ddp", accelerator="cpu", devices=2, sync_batchnorm=True)
    # One process: nothing to sync, the module keeps its BatchNorm and trains.
    module = BatchNormNet()
    quiet_trainer(sync_batchnorm=True, max_epochs=1).fit(module, make_batches(1))
    assert type(module.net[1]) is nn.BatchNorm1d
    # Several processes: BatchNorm layers become SyncBatchNorm, in place, once.
    arguments.convert_sync_batchnorm(module, True, world_size=2)
    synced = module.net[1]
    assert type(synced) is nn.SyncBatchNorm
    arguments.convert_sync_batchnorm(module, True, world_size=2)
    assert module.net[1] is synced


# ----------------------------------------------------------------- ddp_fork
def test_fork_after_cuda_is_initialised_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from strategies.launch import start_processes

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="Cannot fork training processes: CUDA is already initialised"):
        start_processes(print, (), 2, start_method="fork")


FORK_SCRIPT = """
import json, sys, torch
from torch import nn
from trainer import Trainer, TrainModule

class Defined(TrainModule):  # lives in __main__ of `python -c`: spawned workers could not import it
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=2)
trainer = Trainer(strategy="ddp_fork", accelerator="cpu", devices=2, max_epochs=1, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                  num_sanity_val_steps=0)
trainer.fit(Defined(), data)
print(json.dumps({"step": trainer.global_step}))
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ddp_fork_trains_a_class_defined_in_main() -> None:
    from tests.helpers.distributed import run_python

    result = run_python(["-c", FORK_SCRIPT], timeout=110)
    assert result.returncode == 0, result.stderr
    assert '{"step": 2}' in result.stdout  # 8 samples, 2 ranks, batches of 2
    assert result.leftovers == []


# ----------------------------------------------------------------- Hydra
def test_hydra_config_takes_the_new_arguments_and_lightning_strategy_names() -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from trainer.cli.app import config_dir
    from trainer.cli.config import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    overrides = [
        "strategy=ddp_fork",
        "trainer.accelerator=cpu",
        "trainer.min_epochs=2",
        "trainer.min_steps=3",
        "trainer.max_time=00:01:00:00",
        "trainer.precision=64",
        "trainer.overfit_batches=2",
        "trainer.check_val_every_n_epoch=null",
        "trainer.val_check_interval=5",
        "trainer.inference_mode=false",
        "trainer.reload_dataloaders_every_n_epochs=1",
        "trainer.deterministic=warn",
        "trainer.logger=false",
    ]
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
            cfg = compose("config", overrides=overrides)
    finally:
        GlobalHydra.instance().clear()
    strategy = instantiate(cfg.strategy)
    assert strategy.name == "ddp_fork" and strategy.start_method == "fork"
    kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert isinstance(kwargs, dict)
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        trainer = Trainer(**{str(k): v for k, v in kwargs.items()}, strategy=strategy)
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert (trainer.min_epochs, trainer.min_steps, trainer.overfit_batches) == (2, 3, 2)
    assert trainer.strategy.precision.name == "64-true" and trainer.check_val_every_n_epoch is None
    assert not trainer.inference_mode and trainer.reload_dataloaders_every_n_epochs == 1
    assert [cb.max_time for cb in trainer.callbacks if isinstance(cb, cbs.Timer)] == [timedelta(hours=1)]


def test_gradient_clip_val_zero_clips_nothing_as_in_lightning() -> None:
    # Lightning reads 0 as "no clipping"; clip_grad_norm_(params, 0) would zero every gradient instead.
    from trainer.lightning.demos.boring_classes import BoringModel

    weights = []
    for clip in (None, 0, 0.0):
        torch.manual_seed(0)
        module = BoringModel()
        quiet_trainer(max_steps=3, gradient_clip_val=clip).fit(module)
        weights.append([p.detach().clone() for p in module.parameters()])
    torch.manual_seed(0)
    fresh = [p.detach().clone() for p in BoringModel().parameters()]
    assert not all(torch.equal(a, b) for a, b in zip(weights[0], fresh))  # it trained
    for other in weights[1:]:
        assert all(torch.equal(a, b) for a, b in zip(weights[0], other))


def test_pl_trainer_environment_variables_are_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PL_TRAINER_LOGGER", "False")
    monkeypatch.setenv("PL_TRAINER_MAX_STEPS", "7")
    monkeypatch.setenv("PL_TRAINER_GRADIENT_CLIP_ALGORITHM", "value")  # not a literal: the string
    monkeypatch.setenv("PL_TRAINER_ACCUMULATE_GRAD_BATCHES", "")  # empty: not set
    trainer = Trainer()
    assert trainer.logger is None and trainer.max_steps == 7
    assert trainer.gradient_clip_algorithm == "value" and trainer.accumulate_grad_batches == 1
    # What the code says wins, by keyword or by position (logger is Lightning's sixth argument).
    assert Trainer(max_steps=3).max_steps == 3
    assert Trainer("auto", "auto", "auto", 1, None, True).logger is not None


def test_loggers_can_be_assigned_and_callbacks_appended_later(tmp_path: Path) -> None:
    class Counting(cbs.Callback):
        def __init__(self) -> None:
            self.batches = 0

        def on_train_batch_end(self, *args: Any) -> None:
            self.batches += 1

    trainer = quiet_trainer(tmp_path, logger=True, max_steps=2, log_every_n_steps=1)
    first = trainer.logger
    assert isinstance(first, cbs.TensorBoardLogger)
    csv = cbs.CSVLogger(tmp_path)
    trainer.logger = csv
    assert trainer.loggers == [csv] and first not in trainer.callbacks
    trainer.loggers = None
    assert trainer.logger is None and trainer.loggers == []
    trainer.loggers = [csv]
    with pytest.raises(TypeError, match=r"trainer\.loggers takes loggers"):
        trainer.loggers = [Counting()]
    counting = Counting()
    trainer.callbacks.append(counting)  # after Trainer(...): its hooks were never called
    trainer.fit(TinyMLP(log_loss=True), make_batches(4))
    assert counting.batches == 2
    assert "train/loss" in (Path(csv.log_dir) / "metrics.csv").read_text()  # the assigned logger took part


def test_two_stateful_callbacks_under_one_state_key_are_refused() -> None:
    # A checkpoint keeps callback states by state_key: the second would overwrite the first's, and a
    # resume would give both the same state.
    class Counter(cbs.Callback):
        def state_dict(self) -> dict[str, Any]:
            return {"n": 1}

    with pytest.raises(RuntimeError, match="more than one stateful callback of type `Counter`"):
        Trainer(callbacks=[Counter(), Counter()], logger=False)
    trainer = Trainer(callbacks=[Counter()], logger=False)
    trainer.callbacks.append(Counter())
    with pytest.raises(RuntimeError, match="unique among all callbacks"):
        trainer.fit(TinyMLP(), make_batches(2))
    Trainer(callbacks=[cbs.EarlyStopping("a"), cbs.EarlyStopping("b")], logger=False)  # distinct keys: fine
