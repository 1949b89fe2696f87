"""``import trainer.lightning as pl`` gives Lightning's module tree over geartrain's own objects (issue #23).

Each Lightning 2.6.6 public name (the tables of the other Lightning walks: module and data-module
methods, callbacks, loggers, callback hooks, Trainer arguments, and the Trainer's methods and
properties listed here) resolves under ``trainer.lightning`` at Lightning's path, to the object
geartrain's own packages hold: aliases, never a second implementation.
"""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from typing import Any

import pytest

import callbacks
import strategies
import trainer.lightning as pl
from tests.test_lightning_api_walk import DATAMODULE_METHODS, MODULE_ATTRIBUTES, MODULE_METHODS
from tests.test_lightning_callbacks import LIGHTNING_CALLBACKS, LIGHTNING_HOOKS, LIGHTNING_LOGGERS
from tests.test_lightning_trainer_args import LIGHTNING_ARGS
from trainer import DataModule, Trainer, TrainModule, Tuner, seed_everything
from trainer.lightning import TREE

#: Lightning 2.6.6's public Trainer methods and properties.
TRAINER_METHODS = ["fit", "init_module", "predict", "print", "save_checkpoint", "test", "validate"]
TRAINER_PROPERTIES = [
    "accelerator",
    "callback_metrics",
    "checkpoint_callback",
    "checkpoint_callbacks",
    "ckpt_path",
    "current_epoch",
    "default_root_dir",
    "device_ids",
    "distributed_sampler_kwargs",
    "early_stopping_callback",
    "early_stopping_callbacks",
    "enable_validation",
    "estimated_stepping_batches",
    "evaluating",
    "global_rank",
    "global_step",
    "interrupted",
    "is_global_zero",
    "is_last_batch",
    "lightning_module",
    "local_rank",
    "log_dir",
    "logged_metrics",
    "logger",
    "loggers",
    "lr_scheduler_configs",
    "max_epochs",
    "max_steps",
    "min_epochs",
    "min_steps",
    "model",
    "node_rank",
    "num_devices",
    "num_nodes",
    "num_predict_batches",
    "num_sanity_val_batches",
    "num_test_batches",
    "num_training_batches",
    "num_val_batches",
    "optimizers",
    "precision",
    "precision_plugin",
    "predict_dataloaders",
    "predicting",
    "progress_bar_callback",
    "progress_bar_metrics",
    "received_sigterm",
    "sanity_checking",
    "scaler",
    "strategy",
    "test_dataloaders",
    "testing",
    "train_dataloader",
    "training",
    "val_dataloaders",
    "validating",
    "world_size",
]
#: Lightning properties refused with an ``AttributeError`` naming what to use instead.
TRAINER_REFUSED: dict[str, str] = {}


def test_top_level_names_are_geartrains_objects() -> None:
    assert pl.LightningModule is TrainModule
    assert pl.LightningDataModule is DataModule
    assert pl.Trainer is Trainer
    assert pl.Callback is callbacks.Callback
    assert pl.seed_everything is seed_everything
    assert pl.callbacks.ModelCheckpoint is callbacks.ModelCheckpoint
    assert pl.loggers.TensorBoardLogger is callbacks.TensorBoardLogger
    assert pl.strategies.DDPStrategy is strategies.DDPStrategy
    assert pl.tuner.Tuner is Tuner
    from trainer.lightning import LightningModule  # Lightning's `from lightning.pytorch import LightningModule`

    assert LightningModule is TrainModule


@pytest.mark.parametrize("path", sorted(p for p in TREE if p))
def test_every_module_of_the_tree_imports_and_every_name_resolves(path: str) -> None:
    module = importlib.import_module(f"trainer.lightning.{path}")
    for name, home in TREE[path].items():
        value = getattr(module, name)
        if home == "/":
            assert value is importlib.import_module(f"trainer.lightning.{path}.{name}")
            continue
        where, _, attr = home.partition(":")
        assert value is getattr(importlib.import_module(where), attr or name), f"{path}.{name}"
    assert set(module.__all__) == {n for n, h in TREE[path].items() if h != "/"}


def test_the_import_lines_lightning_programs_use() -> None:
    namespace: dict[str, Any] = {}
    exec(  # the import lines of real Lightning programs, with `lightning.pytorch` -> `trainer.lightning`
        "from trainer.lightning import LightningDataModule, LightningModule, Trainer\n"
        "from trainer.lightning.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint\n"
        "from trainer.lightning.callbacks.progress import TQDMProgressBar\n"
        "from trainer.lightning.callbacks.early_stopping import EarlyStoppingReason\n"
        "from trainer.lightning.loggers import CSVLogger, TensorBoardLogger\n"
        "from trainer.lightning.utilities import CombinedLoader, grad_norm, rank_zero_only\n"
        "from trainer.lightning.utilities.rank_zero import rank_zero_info, rank_zero_warn, rank_zero_debug\n"
        "from trainer.lightning.utilities.types import STEP_OUTPUT, OptimizerLRScheduler, EVAL_DATALOADERS\n"
        "from trainer.lightning.utilities.model_summary import ModelSummary, summarize\n"
        "from trainer.lightning.utilities.exceptions import MisconfigurationException\n"
        "from trainer.lightning.utilities.warnings import PossibleUserWarning\n"
        "from trainer.lightning.utilities.model_helpers import is_overridden\n"
        "from trainer.lightning.utilities.seed import isolate_rng\n"
        "from trainer.lightning.strategies import DDPStrategy, FSDPStrategy\n"
        "from trainer.lightning.profilers import SimpleProfiler\n"
        "from trainer.lightning.tuner import Tuner\n"
        "import trainer.lightning.callbacks.progress as progress\n",
        namespace,
    )
    assert namespace["TQDMProgressBar"] is callbacks.TQDMProgressBar
    assert namespace["progress"].TQDMProgressBar is callbacks.TQDMProgressBar


def test_unknown_names_fail_as_python_does() -> None:
    with pytest.raises(AttributeError, match=r"'trainer\.lightning\.callbacks' has no attribute 'Nope'"):
        _ = pl.callbacks.Nope
    with pytest.raises(ModuleNotFoundError, match=r"trainer\.lightning\.callbacks\.nope"):
        importlib.import_module("trainer.lightning.callbacks.nope")


@pytest.mark.parametrize(
    ("owner", "names"),
    [
        ("LightningModule", [*MODULE_METHODS, *MODULE_ATTRIBUTES]),  # the loaders and evaluation steps too
        ("LightningDataModule", list(DATAMODULE_METHODS)),
        ("Callback", list(LIGHTNING_HOOKS)),
        ("Trainer", TRAINER_METHODS),
    ],
)
def test_lightnings_method_names_resolve_under_the_tree(owner: str, names: list[str]) -> None:
    cls = getattr(pl, owner)
    missing = [n for n in names if not hasattr(cls, n) and n not in inspect.signature(cls.__init__).parameters]
    # Attributes set in __init__ (hparams, trainer, ...) are checked on an instance below.
    if owner == "LightningModule":
        instance = cls()
        missing = [n for n in missing if not hasattr(instance, n)]
    assert missing == []


def test_lightnings_trainer_arguments_and_properties_resolve_under_the_tree() -> None:
    params = inspect.signature(pl.Trainer.__init__).parameters
    assert [name for name, _ in LIGHTNING_ARGS if name not in params] == []
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert [n for n in TRAINER_PROPERTIES if not hasattr(trainer, n)] == list(TRAINER_REFUSED)
    for name, instead in TRAINER_REFUSED.items():
        with pytest.raises(AttributeError, match=rf"Trainer.{name}: .*{instead}"):
            getattr(trainer, name)
    assert trainer.precision_plugin is trainer.strategy.precision
    assert isinstance(trainer.accelerator, pl.accelerators.Accelerator)
    assert trainer.accelerator.name() == trainer.strategy.root_device.type
    assert trainer.scaler is None and trainer.distributed_sampler_kwargs is None
    assert hasattr(pl.tuner.Tuner, "lr_find") and hasattr(pl.tuner.Tuner, "scale_batch_size")


@pytest.mark.parametrize("name", sorted(LIGHTNING_CALLBACKS))
def test_lightnings_callbacks_resolve_under_the_tree(name: str) -> None:
    assert getattr(pl.callbacks, name) is getattr(callbacks, name)


@pytest.mark.parametrize("name", sorted({*LIGHTNING_LOGGERS, "Logger", "WandbLogger", "MLFlowLogger", "CometLogger"}))
def test_lightnings_loggers_resolve_under_the_tree(name: str) -> None:
    assert getattr(pl.loggers, name) is getattr(callbacks, name)


def test_lightnings_retired_neptune_logger_raises_as_lightnings() -> None:
    with pytest.raises(RuntimeError, match=r"NeptuneLogger is no longer supported"):
        pl.loggers.neptune.NeptuneLogger(project="x")


def test_the_trackers_geartrain_has_are_its_own_classes() -> None:
    import callbacks

    assert pl.loggers.WandbLogger is callbacks.WandbLogger and pl.loggers.MLFlowLogger is callbacks.MLFlowLogger


def test_importing_the_tree_does_not_import_the_trainer() -> None:
    code = (
        "import sys, trainer.lightning as pl\n"
        "from trainer.lightning.utilities.rank_zero import rank_zero_only\n"
        "heavy = [m for m in ('trainer.trainer', 'strategies.ddp', 'callbacks.tensorboard') if m in sys.modules]\n"
        "assert heavy == [], heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_patching_a_name_through_lightnings_path_reaches_the_code_that_uses_it() -> None:
    """``mock.patch("lightning.pytorch.<module>.<name>")`` reaches geartrain's code, as it reaches Lightning's."""
    from unittest import mock

    from trainer.lightning.callbacks.progress import tqdm_progress

    import callbacks.tqdm_progress as home

    original = home.Tqdm

    class Fake(original):  # type: ignore[misc, valid-type]
        pass

    for _ in range(2):  # the first patch resolves the name, the second finds it resolved
        with mock.patch("trainer.lightning.callbacks.progress.tqdm_progress.Tqdm", Fake):
            assert home.TQDMProgressBar().init_train_tqdm().__class__ is Fake
        assert home.Tqdm is original and tqdm_progress.Tqdm is original
