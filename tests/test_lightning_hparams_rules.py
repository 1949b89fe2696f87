"""Lightning's rules around hyperparameters: which ``__init__`` arguments are collected, what loggers get,
what a run drops, the checkpoint keys of old versions and ``utilities.parsing``'s helpers (issue #33)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from trainer.lightning.utilities.parsing import (
    clean_namespace,
    collect_init_args,
    lightning_getattr,
    lightning_hasattr,
    lightning_setattr,
    parse_class_init_keys,
)

from callbacks import CSVLogger
from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule
from trainer.datamodule import DataModule
from trainer.hparams import HyperparametersMixin


def ones() -> DataLoader[Any]:
    return DataLoader(TensorDataset(torch.ones(2, 4)), batch_size=2)


class Net(TrainModule):
    def __init__(self, width: int = 4, **extra: Any) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(4, width)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Heard(CSVLogger):
    """Records what the trainer hands ``log_hyperparams``."""

    def log_hyperparams(self, params: Any, metrics: Any = None) -> None:
        self.heard = [*getattr(self, "heard", []), dict(params)]
        super().log_hyperparams(params, metrics)


def test_a_module_built_in_another_modules_init_collects_that_ones_arguments_too() -> None:
    class Child(HyperparametersMixin):
        def __init__(self, dropout: float, init: str) -> None:
            super().__init__()
            self.save_hyperparameters(ignore=["dropout"])

    class Parent(HyperparametersMixin):
        def __init__(self, batch_size: int) -> None:
            super().__init__()
            self.child = Child(dropout=0.1, init="xavier")

    class Plain:  # not one with hyperparameters: the walk ends here
        def __init__(self, seed: int = 1) -> None:
            self.parent = Parent(batch_size=64)

    assert Plain().parent.child.hparams == {"init": "xavier", "batch_size": 64}  # Lightning's walk


def test_loggers_get_the_initial_hyperparameters_without_the_clis_class_path(tmp_path: Path) -> None:
    net = Net(width=3, _class_path="somewhere.Net")
    net.hparams.width = 99  # a change after save_hyperparameters is not what the run was started with
    logger = Heard(save_dir=tmp_path)
    quiet_trainer(tmp_path, callbacks=[logger], max_steps=1, enable_checkpointing=False).fit(net, ones())
    assert logger.heard[0] == {"width": 3}


def test_a_run_drops_hyperparameters_pickle_cannot_write_with_a_warning(tmp_path: Path) -> None:
    net = Net(fn=lambda x: x)
    with pytest.warns(UserWarning, match="Attribute 'fn' removed from hparams because it cannot be pickled"):
        quiet_trainer(tmp_path, max_steps=1, logger=False, enable_checkpointing=False).fit(net, ones())
    assert dict(net.hparams) == {"width": 4}


def test_hyperparameters_under_lightnings_keys_before_0_8_are_read(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, max_steps=1, logger=False, enable_checkpointing=False)
    trainer.fit(Net(width=3), ones())
    path = tmp_path / "net.ckpt"
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=True)
    state["module_arguments"] = state.pop("hyper_parameters")
    torch.save(state, path)
    assert Net.load_from_checkpoint(path).hparams.width == 3


def test_lightnings_attribute_helpers_look_in_the_module_its_hparams_and_its_data_module() -> None:
    class Data(DataModule):
        def __init__(self) -> None:
            super().__init__()
            self.batch_size = 8

    net, other = Net(width=2), Net()
    trainer = quiet_trainer(logger=False)
    net.trainer = trainer
    trainer.datamodule = Data()
    assert lightning_hasattr(net, "width") and lightning_getattr(net, "width") == 2  # in hparams
    assert lightning_getattr(net, "batch_size") == 8  # the data module's
    lightning_setattr(net, "batch_size", 16)
    assert trainer.datamodule.batch_size == 16
    assert not lightning_hasattr(other, "batch_size")
    with pytest.raises(AttributeError, match="neither stored in the model namespace"):
        lightning_setattr(other, "batch_size", 1)


def test_lightnings_parsing_helpers() -> None:
    class Base:
        def __init__(self, a: int, **kw: Any) -> None:
            super().__init__()
            self.seen = collect_init_args(inspect.currentframe(), [])  # type: ignore[arg-type]

    class Sub(Base):
        def __init__(obj, a: int, *more: Any, b: int = 2, **rest: Any) -> None:
            super().__init__(a, **rest)

    assert Sub(1, c=3).seen == [{"a": 1, "c": 3}, {"a": 1, "b": 2, "c": 3}]  # innermost first
    assert parse_class_init_keys(Sub) == ("obj", "more", "rest")
    hparams = {"n": 1, "fn": lambda: None}
    with pytest.warns(UserWarning, match="'fn' removed"):
        clean_namespace(hparams)
    assert hparams == {"n": 1}


def test_a_logger_that_is_not_a_geartrain_one_is_driven_through_lightnings_logger_api(tmp_path: Path) -> None:
    from unittest import mock

    class Data(DataModule):
        def __init__(self, root: str = "data") -> None:
            super().__init__()
            self.save_hyperparameters()

        def train_dataloader(self) -> DataLoader[Any]:
            return ones()

    logger = mock.MagicMock(name="logger")
    logger.name, logger.save_dir, logger.version = "mock", str(tmp_path), "0"
    del logger.__iter__  # not taken for a list of loggers
    trainer = quiet_trainer(tmp_path, logger=logger, max_steps=2, log_every_n_steps=1, enable_checkpointing=True)

    class Logged(Net):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = super().training_step(batch, batch_idx)
            self.log("loss", loss)
            return loss

    trainer.fit(Logged(width=3), datamodule=Data())  # its checkpoint keeps no state of the mock
    logger.log_hyperparams.assert_called_once_with({"width": 3, "root": "data"})
    assert [c.kwargs["step"] for c in logger.log_metrics.call_args_list] == [0, 1]
    logger.finalize.assert_called_with("success")


def test_omegaconf_configs_among_the_hyperparameters_come_back_as_configs(tmp_path: Path) -> None:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    class Configured(Net):
        def __init__(self, cfg: Any, nested: Any, width: int = 4) -> None:
            super().__init__(width=width)
            assert cfg.layer.width == 2 and nested["all"][0].name == "a"  # attribute access needs the config

    cfg = OmegaConf.create({"layer": {"width": 2}})
    nested = {"all": [OmegaConf.create({"name": "a"})], "list": OmegaConf.create([1, 2])}
    trainer = quiet_trainer(tmp_path, max_steps=1, logger=False, enable_checkpointing=False)
    trainer.fit(Configured(cfg, nested), ones())
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    loaded = Configured.load_from_checkpoint(tmp_path / "c.ckpt")
    assert isinstance(loaded.hparams.cfg, DictConfig) and isinstance(loaded.hparams.nested["list"], ListConfig)
    assert loaded.hparams.cfg == cfg and isinstance(loaded.hparams.nested["all"][0], DictConfig)


def test_hparams_with_keys_that_are_not_strings_copy_and_answer_missing_attributes() -> None:
    # Lightning's tests save {1: 1, "2": 2, ...}; deepcopy and hasattr ask for attributes that are not keys.
    import copy

    from trainer.hparams import AttributeDict

    hparams = AttributeDict({1: 1, "two": 2})
    assert copy.deepcopy(hparams) == hparams and not hasattr(hparams, "three")
    with pytest.raises(AttributeError, match="hparams has no 'three' \\(it has: 1, two\\)"):
        _ = hparams.three
