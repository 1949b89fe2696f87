"""Lightning's callback and logger names, constructors and hooks, walked one by one against ``callbacks``.

The lists below are Lightning 2.6's (written from its API: names, parameters, defaults). Every name
must be importable from ``callbacks``; a supported class takes at least Lightning's parameters with
Lightning's defaults; a class not supported yet refuses construction, naming the alternative.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import callbacks
from callbacks import Callback
from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule

REQUIRED = object()  # Lightning has no default: ours may have one
OBJECT = object()  # a default that is an object of Lightning's (a theme, a function): ours may differ
VARARGS = object()  # **kwargs

LIGHTNING_CALLBACKS: dict[str, dict[str, Any]] = {
    "BackboneFinetuning": {
        "unfreeze_backbone_at_epoch": 10,
        "lambda_func": OBJECT,
        "backbone_initial_ratio_lr": 0.1,
        "backbone_initial_lr": None,
        "should_align": True,
        "initial_denom_lr": 10.0,
        "train_bn": True,
        "verbose": False,
        "rounding": 12,
    },
    "BaseFinetuning": {},
    "BasePredictionWriter": {"write_interval": "batch"},
    "BatchSizeFinder": {
        "mode": "power",
        "steps_per_trial": 3,
        "init_val": 2,
        "max_trials": 25,
        "batch_arg_name": "batch_size",
        "margin": 0.05,
        "max_val": 8192,
    },
    "Checkpoint": {},
    "DeviceStatsMonitor": {"cpu_stats": None},
    "EMAWeightAveraging": {
        "device": None,
        "use_buffers": True,
        "decay": 0.999,
        "update_every_n_steps": 1,
        "update_starting_at_step": None,
        "update_starting_at_epoch": None,
        "**kwargs": VARARGS,
    },
    "EarlyStopping": {
        "monitor": REQUIRED,
        "min_delta": 0.0,
        "patience": 3,
        "verbose": False,
        "mode": "min",
        "strict": True,
        "check_finite": True,
        "stopping_threshold": None,
        "divergence_threshold": None,
        "check_on_train_epoch_end": None,
        "log_rank_zero_only": False,
    },
    "GradientAccumulationScheduler": {"scheduling": REQUIRED},
    "LambdaCallback": {
        "setup": None,
        "teardown": None,
        "on_fit_start": None,
        "on_fit_end": None,
        "on_sanity_check_start": None,
        "on_sanity_check_end": None,
        "on_train_batch_start": None,
        "on_train_batch_end": None,
        "on_train_epoch_start": None,
        "on_train_epoch_end": None,
        "on_validation_epoch_start": None,
        "on_validation_epoch_end": None,
        "on_test_epoch_start": None,
        "on_test_epoch_end": None,
        "on_validation_batch_start": None,
        "on_validation_batch_end": None,
        "on_test_batch_start": None,
        "on_test_batch_end": None,
        "on_train_start": None,
        "on_train_end": None,
        "on_validation_start": None,
        "on_validation_end": None,
        "on_test_start": None,
        "on_test_end": None,
        "on_exception": None,
        "on_save_checkpoint": None,
        "on_load_checkpoint": None,
        "on_before_backward": None,
        "on_after_backward": None,
        "on_before_optimizer_step": None,
        "on_before_zero_grad": None,
        "on_predict_start": None,
        "on_predict_end": None,
        "on_predict_batch_start": None,
        "on_predict_batch_end": None,
        "on_predict_epoch_start": None,
        "on_predict_epoch_end": None,
    },
    "LearningRateFinder": {
        "min_lr": 1e-08,
        "max_lr": 1,
        "num_training_steps": 100,
        "mode": "exponential",
        "early_stop_threshold": 4.0,
        "update_attr": True,
        "attr_name": "",
    },
    "LearningRateMonitor": {"logging_interval": None, "log_momentum": False, "log_weight_decay": False},
    "ModelCheckpoint": {
        "dirpath": None,
        "filename": None,
        "monitor": None,
        "verbose": False,
        "save_last": None,
        "save_top_k": 1,
        "save_on_exception": False,
        "save_weights_only": False,
        "mode": "min",
        "auto_insert_metric_name": True,
        "every_n_train_steps": None,
        "train_time_interval": None,
        "every_n_epochs": None,
        "save_on_train_epoch_end": None,
        "enable_version_counter": True,
    },
    "ModelPruning": {
        "pruning_fn": REQUIRED,
        "parameters_to_prune": OBJECT,
        "parameter_names": None,
        "use_global_unstructured": True,
        "amount": 0.5,
        "apply_pruning": True,
        "make_pruning_permanent": True,
        "use_lottery_ticket_hypothesis": True,
        "resample_parameters": False,
        "pruning_dim": None,
        "pruning_norm": None,
        "verbose": 0,
        "prune_on_train_epoch_end": True,
    },
    "ModelSummary": {"max_depth": 1, "**summarize_kwargs": VARARGS},
    "OnExceptionCheckpoint": {"dirpath": REQUIRED, "filename": "on_exception"},
    "ProgressBar": {},
    "RichModelSummary": {"max_depth": 1, "**summarize_kwargs": VARARGS},
    "RichProgressBar": {"refresh_rate": 100, "leave": False, "theme": OBJECT, "console_kwargs": None},
    "SpikeDetection": {
        "mode": "min",
        "window": 10,
        "warmup": 1,
        "atol": None,
        "rtol": 2.0,
        "exclude_batches_path": None,
        "finite_only": True,
    },
    "StochasticWeightAveraging": {
        "swa_lrs": REQUIRED,
        "swa_epoch_start": 0.8,
        "annealing_epochs": 10,
        "annealing_strategy": "cos",
        "avg_fn": None,
        "device": OBJECT,
    },
    "TQDMProgressBar": {"refresh_rate": 1, "process_position": 0, "leave": False},
    "ThroughputMonitor": {"batch_size_fn": REQUIRED, "length_fn": None, "**kwargs": VARARGS},
    "Timer": {"duration": None, "interval": "step", "verbose": True},
    "WeightAveraging": {"device": None, "use_buffers": True, "**kwargs": VARARGS},
}

LIGHTNING_LOGGERS: dict[str, dict[str, Any]] = {
    "TensorBoardLogger": {
        "save_dir": REQUIRED,
        "name": "lightning_logs",
        "version": None,
        "log_graph": False,
        "default_hp_metric": True,
        "prefix": "",
        "sub_dir": None,
        "**kwargs": VARARGS,
    },
    "CSVLogger": {
        "save_dir": REQUIRED,
        "name": "lightning_logs",
        "version": None,
        "prefix": "",
        "flush_logs_every_n_steps": 100,
    },
}

#: Lightning's loggers of experiment trackers (their packages: geartrain's extras mlflow and wandb).
LIGHTNING_TRACKERS: dict[str, dict[str, Any]] = {
    "MLFlowLogger": {
        "experiment_name": "lightning_logs",
        "run_name": None,
        "tracking_uri": OBJECT,  # Lightning: the MLFLOW_TRACKING_URI of import time; geartrain: of build time
        "tags": None,
        "save_dir": "./mlruns",
        "log_model": False,
        "prefix": "",
        "artifact_location": None,
        "run_id": None,
        "synchronous": None,
    },
    "WandbLogger": {
        "name": None,
        "save_dir": ".",
        "version": None,
        "offline": False,
        "dir": None,
        "id": None,
        "anonymous": None,
        "project": None,
        "log_model": False,
        "experiment": None,
        "prefix": "",
        "checkpoint_name": None,
        "add_file_policy": "mutable",
        "**kwargs": VARARGS,
    },
}

LIGHTNING_HOOKS: dict[str, tuple[str, ...]] = {
    "setup": ("trainer", "pl_module", "stage"),
    "teardown": ("trainer", "pl_module", "stage"),
    "on_fit_start": ("trainer", "pl_module"),
    "on_fit_end": ("trainer", "pl_module"),
    "on_sanity_check_start": ("trainer", "pl_module"),
    "on_sanity_check_end": ("trainer", "pl_module"),
    "on_train_batch_start": ("trainer", "pl_module", "batch", "batch_idx"),
    "on_train_batch_end": ("trainer", "pl_module", "outputs", "batch", "batch_idx"),
    "on_train_epoch_start": ("trainer", "pl_module"),
    "on_train_epoch_end": ("trainer", "pl_module"),
    "on_validation_epoch_start": ("trainer", "pl_module"),
    "on_validation_epoch_end": ("trainer", "pl_module"),
    "on_test_epoch_start": ("trainer", "pl_module"),
    "on_test_epoch_end": ("trainer", "pl_module"),
    "on_predict_epoch_start": ("trainer", "pl_module"),
    "on_predict_epoch_end": ("trainer", "pl_module"),
    "on_validation_batch_start": ("trainer", "pl_module", "batch", "batch_idx", "dataloader_idx=0"),
    "on_validation_batch_end": ("trainer", "pl_module", "outputs", "batch", "batch_idx", "dataloader_idx=0"),
    "on_test_batch_start": ("trainer", "pl_module", "batch", "batch_idx", "dataloader_idx=0"),
    "on_test_batch_end": ("trainer", "pl_module", "outputs", "batch", "batch_idx", "dataloader_idx=0"),
    "on_predict_batch_start": ("trainer", "pl_module", "batch", "batch_idx", "dataloader_idx=0"),
    "on_predict_batch_end": ("trainer", "pl_module", "outputs", "batch", "batch_idx", "dataloader_idx=0"),
    "on_train_start": ("trainer", "pl_module"),
    "on_train_end": ("trainer", "pl_module"),
    "on_validation_start": ("trainer", "pl_module"),
    "on_validation_end": ("trainer", "pl_module"),
    "on_test_start": ("trainer", "pl_module"),
    "on_test_end": ("trainer", "pl_module"),
    "on_predict_start": ("trainer", "pl_module"),
    "on_predict_end": ("trainer", "pl_module"),
    "on_exception": ("trainer", "pl_module", "exception"),
    "state_dict": (),
    "load_state_dict": ("state_dict",),
    "on_save_checkpoint": ("trainer", "pl_module", "checkpoint"),
    "on_load_checkpoint": ("trainer", "pl_module", "checkpoint"),
    "on_before_backward": ("trainer", "pl_module", "loss"),
    "on_after_backward": ("trainer", "pl_module"),
    "on_before_optimizer_step": ("trainer", "pl_module", "optimizer"),
    "on_before_zero_grad": ("trainer", "pl_module", "optimizer"),
}

#: Supported here for now: built by the other issues of the port, until then refused when built.
NOT_SUPPORTED_YET: set[str] = set()


def _check_superset(name: str, cls: type, lightning: dict[str, Any]) -> None:
    ours = inspect.signature(cls).parameters
    positional = [p for p in ours.values() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    lightning_positional = [k for k in lightning if not k.startswith("*")]
    # Lightning's parameters come first and in Lightning's order, so positional calls mean the same.
    assert [p.name for p in positional[: len(lightning_positional)]] == lightning_positional, name
    for key, default in lightning.items():
        if key.startswith("**"):
            assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ours.values()), f"{name} takes no {key}"
            continue
        assert key in ours, f"{name} lacks {key}"
        if default is not REQUIRED and default is not OBJECT:
            assert ours[key].default == default, f"{name}({key}=...) defaults to {ours[key].default!r}, not {default!r}"


@pytest.mark.parametrize("name", sorted(LIGHTNING_CALLBACKS))
def test_every_lightning_callback_name_is_importable_and_takes_lightnings_arguments(name: str) -> None:
    cls = getattr(callbacks, name)
    assert name in callbacks.__all__
    assert issubclass(cls, Callback)
    if name in NOT_SUPPORTED_YET:
        with pytest.raises(NotImplementedError, match=rf"callbacks\.{name} is not supported yet: \w+"):
            cls()
        return
    _check_superset(name, cls, LIGHTNING_CALLBACKS[name])


@pytest.mark.parametrize("name", sorted(LIGHTNING_LOGGERS))
def test_every_lightning_logger_is_importable_and_takes_lightnings_arguments(name: str) -> None:
    cls = getattr(callbacks, name)
    _check_superset(name, cls, LIGHTNING_LOGGERS[name])
    logger = cls(save_dir="unused", version=3)
    for attr in ("LOGGER_JOIN_CHAR", "after_save_checkpoint", "experiment", "finalize", "group_separator",
                 "log_dir", "log_graph", "log_hyperparams", "log_metrics", "name", "root_dir", "save", "save_dir",
                 "version"):  # fmt: skip
        assert hasattr(logger, attr), f"{name}.{attr}"
    assert logger.is_logger


@pytest.mark.parametrize("name", sorted(LIGHTNING_TRACKERS))
def test_every_lightning_tracker_logger_takes_lightnings_arguments(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow" if name == "MLFlowLogger" else "wandb")  # in the dev extra
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # built, never contacted
    cls = getattr(callbacks, name)
    assert name in callbacks.__all__
    _check_superset(name, cls, LIGHTNING_TRACKERS[name])
    for attr in ("LOGGER_JOIN_CHAR", "after_save_checkpoint", "experiment", "finalize", "group_separator",
                 "log_dir", "log_graph", "log_hyperparams", "log_metrics", "name", "root_dir", "save", "save_dir",
                 "version"):  # fmt: skip
        assert hasattr(cls, attr), f"{name}.{attr}"  # on the class: reading `experiment` starts a run
    logger = cls()
    assert logger.is_logger and logger.log_dir is None  # Lightning's: the files live in the tracker


@pytest.mark.parametrize("hook", sorted(LIGHTNING_HOOKS))
def test_every_lightning_callback_hook_has_lightnings_signature(hook: str) -> None:
    params = list(inspect.signature(getattr(Callback, hook)).parameters.values())[1:]
    shown = tuple(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}" for p in params)
    assert shown == LIGHTNING_HOOKS[hook]


def test_callback_methods_are_lightnings_and_lambda_callback_takes_each(tmp_path: Any) -> None:
    # Lightning's tests list Callback's functions and build a LambdaCallback from them: the set must be Lightning's.
    methods = {name for name, _ in inspect.getmembers(Callback, inspect.isfunction) if not name.startswith("_")}
    assert methods == set(LIGHTNING_HOOKS)  # its hooks, state_dict and load_state_dict
    heard: set[str] = set()
    hooks = {name: (lambda *_, _n=name, **__: heard.add(_n)) for name in methods - {"state_dict", "load_state_dict"}}
    quiet_trainer(tmp_path, max_steps=1, callbacks=[callbacks.LambdaCallback(**hooks)]).fit(
        Tiny(), DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    )
    assert {"setup", "on_fit_start", "on_train_batch_end", "on_fit_end", "teardown"} <= heard


def test_a_removed_lightning_hook_is_refused_at_trainer_construction() -> None:
    class Old(Callback):
        def on_epoch_end(self, trainer: Any, pl_module: Any) -> None: ...

    with pytest.raises(TypeError, match=r"Old\.on_epoch_end is never called.*on_train_epoch_end"):
        quiet_trainer(callbacks=[Old()])


# ----------------------------------------------------------------- hooks called at Lightning's moments
class Tiny(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).sum()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("v", self.layer(batch[0]).sum())

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("t", self.layer(batch[0]).sum())

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class LightningStyleRecorder(Callback):
    """Overrides every hook with Lightning's exact signature (``pl_module``, ``dataloader_idx=0``)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.calls.append("setup")

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.calls.append("teardown")

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.calls.append("on_train_batch_start")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.calls.append("on_train_batch_end")

    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.calls.append("on_validation_batch_start")

    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.calls.append("on_validation_batch_end")

    def on_test_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.calls.append("on_test_batch_start")

    def on_test_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.calls.append("on_test_batch_end")

    def on_predict_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.calls.append("on_predict_batch_start")

    def on_predict_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.calls.append("on_predict_batch_end")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
        self.calls.append("on_before_backward")

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.calls.append("on_before_optimizer_step")

    def on_before_zero_grad(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.calls.append("on_before_zero_grad")


def _two_arg_hook(name: str) -> Any:
    def hook(self: LightningStyleRecorder, trainer: Any, pl_module: Any) -> None:
        self.calls.append(name)

    return hook


for _name in [h for h, params in LIGHTNING_HOOKS.items() if params == ("trainer", "pl_module")]:
    setattr(LightningStyleRecorder, _name, _two_arg_hook(_name))

_EPOCH_OF_TWO_BATCHES = ["on_train_epoch_start"] + 2 * [
    "on_train_batch_start", "on_before_zero_grad", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_train_batch_end",
]  # fmt: skip
_ONE_VALIDATION = [
    "on_validation_start", "on_validation_epoch_start", "on_validation_batch_start", "on_validation_batch_end",
    "on_validation_epoch_end", "on_validation_end",
]  # fmt: skip
#: What Lightning 2.6.6 calls, recorded with the same module, data and options.
LIGHTNING_FIT = [
    "setup",
    "on_fit_start",
    "on_sanity_check_start",
    *_ONE_VALIDATION,
    "on_sanity_check_end",
    "on_train_start",
    *_EPOCH_OF_TWO_BATCHES,
    *_ONE_VALIDATION,
    "on_train_epoch_end",
    "on_train_end",
    "on_fit_end",
    "teardown",
]


def _geartrain_step_order(calls: list[str]) -> list[str]:
    """Lightning's order with on_before_zero_grad where geartrain's step zeroes: after the optimizer step.

    Lightning zeroes gradients before each step's forward, geartrain right after each optimizer step
    (docs/lightning.md); the same number of calls, one place later in the step.
    """
    out = [c for c in calls if c != "on_before_zero_grad"]
    for i in [i for i, c in enumerate(out) if c == "on_before_optimizer_step"][::-1]:
        out.insert(i + 1, "on_before_zero_grad")
    return out


def test_a_lightning_style_callback_sees_every_hook_in_lightnings_order() -> None:
    recorder = LightningStyleRecorder()
    data = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    trainer = quiet_trainer(max_epochs=1, callbacks=[recorder], num_sanity_val_steps=1, limit_val_batches=1)
    module = Tiny()
    trainer.fit(module, data, data)
    assert recorder.calls == _geartrain_step_order(LIGHTNING_FIT)
    for stage, prefix in (("validate", "validation"), ("test", "test"), ("predict", "predict")):
        recorder.calls.clear()
        getattr(trainer, stage)(module, data)
        batches = 1 if stage == "validate" else 2  # limit_val_batches=1 applies to validate too
        expected = ["setup", f"on_{prefix}_start", f"on_{prefix}_epoch_start"]
        expected += batches * [f"on_{prefix}_batch_start", f"on_{prefix}_batch_end"]
        expected += [f"on_{prefix}_epoch_end", f"on_{prefix}_end", "teardown"]
        assert recorder.calls == expected, stage
