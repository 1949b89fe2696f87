"""``save_hyperparameters``, ``hparams`` and ``load_from_checkpoint`` with Lightning's meaning (issue #13)."""

from __future__ import annotations

import functools
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers.regression import Small
from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule
from trainer.datamodule import DataModule
from trainer.hparams import AttributeDict, plain_hparams


def ones(features: int, n: int = 2) -> DataLoader[Any]:
    """One batch of ``n`` rows of ones."""
    return DataLoader(TensorDataset(torch.ones(n, features)), batch_size=n)


class Net(TrainModule):
    def __init__(self, width: int = 4, lr: float = 0.1, act: Any = None, *, tag: str = "x", **extra: Any) -> None:
        super().__init__()
        self.save_hyperparameters(ignore="act")
        self.layer = nn.Linear(4, width)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class WithLayer(TrainModule):
    """Takes an ``nn.Module`` argument: a checkpoint cannot hold it, so loading must ask for it."""

    def __init__(self, encoder: nn.Module, scale: float = 1.0, fn: Any = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder = encoder

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.encoder(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_attribute_dict_has_attribute_and_item_access() -> None:
    hp = AttributeDict(a=1)
    hp.b = 2
    assert (hp.a, hp["b"], dict(hp)) == (1, 2, {"a": 1, "b": 2})
    with pytest.raises(AttributeError, match="has no 'c'"):
        _ = hp.c


def test_save_hyperparameters_records_init_args_with_ignore_and_kwargs() -> None:
    net = Net(8, act=nn.ReLU(), tag="y", depth=3)
    assert isinstance(net.hparams, AttributeDict)
    assert dict(net.hparams) == {"width": 8, "lr": 0.1, "tag": "y", "depth": 3}
    assert net.hparams.width == 8


def test_save_hyperparameters_names_dict_and_namespace() -> None:
    class Named(TrainModule):
        def __init__(self, a: int = 1, b: int = 2) -> None:
            super().__init__()
            self.save_hyperparameters("a")

    assert dict(Named().hparams) == {"a": 1}
    m = TrainModule()
    m.save_hyperparameters({"x": 1})
    m.save_hyperparameters(Namespace(y=2))
    assert dict(m.hparams) == {"x": 1, "y": 2}
    with pytest.raises(ValueError, match="'c' is not __init__ arguments"):
        Named().save_hyperparameters("c")


def test_hparams_initial_is_unchanged_by_later_edits() -> None:
    net = Net()
    net.hparams.lr = 5.0
    assert net.hparams_initial.lr == 0.1 and net.hparams.lr == 5.0


def test_subclass_args_are_collected_through_super_init() -> None:
    class Base(TrainModule):
        def __init__(self, a: int = 1) -> None:
            super().__init__()
            self.save_hyperparameters()

    class Child(Base):
        def __init__(self, b: int = 2) -> None:
            super().__init__(a=5)

    assert dict(Child().hparams) == {"a": 5, "b": 2}


def test_plain_hparams_keep_safe_values_and_describe_others() -> None:
    kept, unsaved = plain_hparams(
        {
            "n": 1,
            "t": (1, "a"),
            "l": [1.5, None],
            "d": {"x": True},
            "m": nn.Linear(1, 1),
            "f": functools.partial(max, 1),
            "c": nn.Linear,
        }
    )
    assert kept["n"] == 1 and kept["t"] == (1, "a") and kept["l"] == [1.5, None] and kept["d"] == {"x": True}
    assert sorted(unsaved) == ["c", "f", "m"]
    assert kept["c"] == "<class torch.nn.modules.linear.Linear>" and kept["m"].startswith(
        "<torch.nn.modules.linear.Linear:"
    )


def test_load_from_checkpoint_rebuilds_the_module(tmp_path: Path) -> None:
    net = Net(6, lr=0.2, tag="z", depth=2)
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(net, ones(4))
    trainer.save_checkpoint(tmp_path / "net.ckpt")
    ckpt = torch.load(tmp_path / "net.ckpt", weights_only=True)  # nothing pickled
    assert ckpt["hyper_parameters"] == {"width": 6, "lr": 0.2, "tag": "z", "depth": 2}
    loaded = Net.load_from_checkpoint(tmp_path / "net.ckpt", lr=0.3)
    assert dict(loaded.hparams) == {"width": 6, "lr": 0.3, "tag": "z", "depth": 2}
    assert torch.equal(loaded.layer.weight, net.layer.weight)


def test_load_from_checkpoint_asks_for_a_module_argument(tmp_path: Path) -> None:
    net = WithLayer(nn.Linear(4, 2), scale=2.0, fn=functools.partial(max, 1))
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(net, ones(4))
    trainer.save_checkpoint(tmp_path / "w.ckpt")
    ckpt = torch.load(tmp_path / "w.ckpt", weights_only=True)
    assert sorted(ckpt["hparams_unsaved"]) == ["encoder", "fn"] and isinstance(ckpt["hyper_parameters"]["encoder"], str)
    with pytest.raises(TypeError, match=r"encoder, fn could not be saved.*load_from_checkpoint\(path, encoder=..."):
        WithLayer.load_from_checkpoint(tmp_path / "w.ckpt")
    loaded = WithLayer.load_from_checkpoint(tmp_path / "w.ckpt", encoder=nn.Linear(4, 2), fn=None)
    assert loaded.hparams.scale == 2.0
    assert torch.equal(loaded.encoder.weight, net.encoder.weight)


def test_load_from_checkpoint_names_a_missing_required_argument(tmp_path: Path) -> None:
    class NoSave(TrainModule):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.layer = nn.Linear(3, width)

    m = Small()
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(m, ones(3))
    trainer.save_checkpoint(tmp_path / "s.ckpt")
    with pytest.raises(TypeError, match="width are not among the checkpoint's hyperparameters"):
        NoSave.load_from_checkpoint(tmp_path / "s.ckpt")


def test_strict_loading_and_strict_argument(tmp_path: Path) -> None:
    m = Small()
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(m, ones(3))
    trainer.save_checkpoint(tmp_path / "s.ckpt")

    class Bigger(Small):
        def __init__(self, width: int = 4) -> None:
            super().__init__(width)
            self.extra = nn.Linear(1, 1)

    from trainer.common.errors import CheckpointError

    with pytest.raises(CheckpointError, match="missing keys"):
        Bigger.load_from_checkpoint(tmp_path / "s.ckpt")
    loaded = Bigger.load_from_checkpoint(tmp_path / "s.ckpt", strict=False)
    assert torch.equal(loaded.layer.weight, m.layer.weight)

    class Lenient(Bigger):
        strict_loading = False

    assert torch.equal(Lenient.load_from_checkpoint(tmp_path / "s.ckpt").layer.weight, m.layer.weight)


def test_strict_in_conflict_with_strict_loading_and_an_empty_state_dict(tmp_path: Path) -> None:
    """As Lightning: ``strict=`` against the module's own ``self.strict_loading`` is refused naming both; a
    checkpoint without weights loads with a warning, the module keeping its initial weights."""

    class Chooses(Small):
        def __init__(self, width: int = 4) -> None:
            super().__init__(width)
            self.strict_loading = False

    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(Chooses(), ones(3))
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    with pytest.raises(ValueError, match=r"strict=True\)` which is in conflict with `Chooses.strict_loading=False"):
        Chooses.load_from_checkpoint(tmp_path / "c.ckpt", strict=True)
    assert Chooses.load_from_checkpoint(tmp_path / "c.ckpt", strict=False).strict_loading is False
    state = torch.load(tmp_path / "c.ckpt", weights_only=True)
    state["state_dict"] = {}
    torch.save(state, tmp_path / "empty.ckpt")
    with pytest.warns(UserWarning, match="contains no parameters"):
        Small.load_from_checkpoint(tmp_path / "empty.ckpt")


def test_datamodule_hparams_and_load_from_checkpoint(tmp_path: Path) -> None:
    class Data(DataModule):
        def __init__(self, batch_size: int = 2) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.cursor = 0

        def train_dataloader(self) -> Any:
            return ones(3, self.hparams.batch_size)

        def state_dict(self) -> dict[str, Any]:
            return {"cursor": 7}

        def load_state_dict(self, state_dict: Any) -> None:
            self.cursor = state_dict["cursor"]

    dm = Data(batch_size=3)
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(Small(), datamodule=dm)
    assert dm.trainer is trainer
    trainer.save_checkpoint(tmp_path / "d.ckpt")
    loaded = Data.load_from_checkpoint(tmp_path / "d.ckpt")
    assert (loaded.hparams.batch_size, loaded.cursor) == (3, 7)


def test_hparams_file_overrides_the_checkpoints(tmp_path: Path) -> None:
    net = Net(6)
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(net, ones(4))
    trainer.save_checkpoint(tmp_path / "net.ckpt")
    (tmp_path / "hparams.yaml").write_text("lr: 0.7\ntag: from-file\n")
    loaded = Net.load_from_checkpoint(tmp_path / "net.ckpt", hparams_file=tmp_path / "hparams.yaml")
    assert (loaded.hparams.width, loaded.hparams.lr, loaded.hparams.tag) == (6, 0.7, "from-file")


def test_save_hyperparameters_logger_false_keeps_them_out_of_tensorboard(tmp_path: Path) -> None:
    from callbacks import TensorBoardLogger

    class Hidden(Net):
        def __init__(self, width: int = 4) -> None:
            super().__init__(width)
            self.save_hyperparameters(logger=False)

    shown, hidden = TensorBoardLogger(tmp_path / "a"), TensorBoardLogger(tmp_path / "b")
    quiet_trainer(tmp_path, max_epochs=1, callbacks=[shown]).fit(Net(), ones(4))
    quiet_trainer(tmp_path, max_epochs=1, callbacks=[hidden]).fit(Hidden(), ones(4))
    assert shown._session and not hidden._session


class FromOneObject(TrainModule):
    """Lightning's ``__init__(self, hparams)`` pattern: one dict, Namespace or DictConfig is the hyperparameters."""

    def __init__(self, hparams: Any) -> None:
        super().__init__()
        self.save_hyperparameters(hparams)
        self.layer = nn.Linear(4, int(self.hparams.width))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class DataFromOneObject(DataModule):
    def __init__(self, hparams: Any) -> None:
        super().__init__()
        self.save_hyperparameters(hparams)

    def train_dataloader(self) -> Any:
        return ones(4, self.hparams.batch_size)


@pytest.mark.parametrize("kind", ["namespace", "dict", "dictconfig"])
def test_hparams_given_as_one_argument_come_back_as_that_argument(tmp_path: Path, kind: str) -> None:
    """The checkpoint names the argument (``hparams_name``); loading passes the values back under it, a
    DictConfig as a DictConfig, and the file still loads with ``weights_only=True``."""
    from omegaconf import DictConfig, OmegaConf

    make = {"namespace": lambda d: Namespace(**d), "dict": dict, "dictconfig": OmegaConf.create}[kind]
    net, dm = FromOneObject(make({"width": 3})), DataFromOneObject(make({"batch_size": 2}))
    assert isinstance(net.hparams, DictConfig if kind == "dictconfig" else AttributeDict)
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(net, datamodule=dm)
    trainer.save_checkpoint(tmp_path / "o.ckpt")
    ckpt = torch.load(tmp_path / "o.ckpt", weights_only=True)
    assert (ckpt["hparams_name"], ckpt["datamodule_hparams_name"]) == ("hparams", "hparams")
    assert ckpt.get("hparams_type") == ("DictConfig" if kind == "dictconfig" else None)
    assert DataFromOneObject.CHECKPOINT_HYPER_PARAMS_KEY == "datamodule_hyper_parameters"
    loaded = FromOneObject.load_from_checkpoint(tmp_path / "o.ckpt")
    assert type(loaded.hparams) is type(net.hparams) and loaded.hparams.width == 3
    assert torch.equal(loaded.layer.weight, net.layer.weight)
    assert DataFromOneObject.load_from_checkpoint(tmp_path / "o.ckpt").hparams.batch_size == 2


def test_save_hyperparameters_refuses_a_primitive_and_warns_about_a_module() -> None:
    class One(TrainModule):
        def __init__(self, value: Any, name: str = "n") -> None:
            super().__init__()
            self.save_hyperparameters(value, "name")

    with pytest.raises(ValueError, match=r"Primitives \(<class 'bool'>, <class 'int'>"):
        One(42)
    with pytest.warns(UserWarning, match=r"'encoder' is an instance of `nn.Module`.*ignore=\['encoder'\]"):
        WithLayer(nn.Linear(4, 2))


def test_ignore_in_a_subclass_drops_what_the_base_saved() -> None:
    class Base(TrainModule):
        def __init__(self, a: int, b: int) -> None:
            super().__init__()
            self.save_hyperparameters(ignore="a")

    class Sub(Base):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(a, b)
            self.save_hyperparameters(ignore="b")

    assert dict(Sub(1, 2).hparams) == {"a": 1}


def test_dataclass_module_and_unconventional_self_name(tmp_path: Path) -> None:
    """A dataclass module's init fields, and an ``__init__`` whose first argument is not called ``self``."""
    import dataclasses

    @dataclasses.dataclass(eq=False)
    class Fields(TrainModule):
        width: int
        tag: str = "t"
        hidden: int = dataclasses.field(default=0, init=False)

        def __post_init__(self) -> None:
            super().__init__()
            self.save_hyperparameters()

    assert dict(Fields(3, tag="u").hparams) == {"width": 3, "tag": "u"}

    class Odd(Net):
        def __init__(obj, width: int = 4, **kwargs: Any) -> None:
            super().__init__(width, **kwargs)
            obj.save_hyperparameters()

    net = Odd(5, tag="q")
    assert dict(net.hparams) == {"width": 5, "lr": 0.1, "tag": "q"}
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(net, ones(4))
    trainer.save_checkpoint(tmp_path / "odd.ckpt")
    assert dict(Odd.load_from_checkpoint(tmp_path / "odd.ckpt").hparams) == dict(net.hparams)


def test_hparams_yaml_round_trip(tmp_path: Path) -> None:
    """Lightning's core.saving functions: Namespace in, DictConfig (or dict) out, an Enum by name, an
    unwritable value skipped with a warning, a missing file or folder named."""
    import enum

    from omegaconf import DictConfig

    from trainer.hparams_yaml import load_hparams_from_yaml, save_hparams_to_yaml

    class Mode(str, enum.Enum):
        fast = "f"

    path = tmp_path / "h.yaml"
    save_hparams_to_yaml(path, Namespace(lr=0.1, nested={"a": 1}, mode=Mode.fast))
    loaded = load_hparams_from_yaml(path)
    assert isinstance(loaded, DictConfig) and loaded.nested.a == 1
    assert load_hparams_from_yaml(path, use_omegaconf=False) == {"lr": 0.1, "nested": {"a": 1}, "mode": "fast"}
    with pytest.warns(UserWarning, match="Skipping 'dtype' parameter"):
        save_hparams_to_yaml(path, {"dtype": torch.float32, "b": 2})
    assert load_hparams_from_yaml(path, use_omegaconf=False) == {"b": 2}
    with pytest.warns(RuntimeWarning, match="Missing Tags"):
        assert load_hparams_from_yaml(tmp_path / "none.yaml") == {}
    with pytest.raises(RuntimeError, match="Missing folder"):
        save_hparams_to_yaml(tmp_path / "no" / "h.yaml", {})
