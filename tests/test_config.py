"""Every config group option composes, validates and instantiates (Hydra's compose API)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException, MissingConfigException
from hydra.utils import instantiate
from omegaconf import DictConfig

from strategies import Strategy
from trainer import DataModule, TrainModule
from trainer.cli.app import config_dir
from trainer.cli.config import register_configs

CONF = config_dir()


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.fixture(autouse=True)
def hydra_context() -> Iterator[None]:
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        yield
    GlobalHydra.instance().clear()


def make(*overrides: str) -> DictConfig:
    return compose("config", overrides=list(overrides))


def test_every_group_has_options() -> None:
    for group in ("trainer", "strategy", "model", "data", "optim", "experiment"):
        assert options(group), f"conf/{group}/ has no options"


@pytest.mark.parametrize("name", options("strategy"))
def test_strategy_options_instantiate(name: str) -> None:
    cfg = make(f"strategy={name}")
    strategy = instantiate(cfg.strategy)
    assert isinstance(strategy, Strategy)
    assert strategy.name == name


@pytest.mark.parametrize("name", options("optim"))
def test_optim_options_build_optimizer_and_scheduler(name: str) -> None:
    cfg = make(f"optim={name}", "optim.lr=0.0123")
    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = instantiate(cfg.optim.optimizer)(params)
    assert isinstance(optimizer, torch.optim.Optimizer)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0123)
    scheduler = instantiate(cfg.optim.scheduler)(optimizer)
    assert isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler)


@pytest.mark.parametrize("model", options("model"))
def test_model_and_data_options_instantiate(model: str) -> None:
    data_options = options("data")
    cfg = make(f"model={model}", f"data={model if model in data_options else 'digits'}")
    module = instantiate(cfg.model)
    assert isinstance(module, TrainModule)
    data = instantiate(cfg.data)
    assert isinstance(data, DataModule)


@pytest.mark.parametrize("name", options("experiment"))
def test_experiments_compose(name: str) -> None:
    cfg = make(f"experiment={name}")
    assert isinstance(instantiate(cfg.strategy), Strategy)
    assert cfg.model._target_


def test_digits_ddp_experiment_means_two_ddp_processes() -> None:
    cfg = make("experiment=digits_ddp")
    assert type(instantiate(cfg.strategy)).__name__ == "DDPStrategy"
    assert cfg.trainer.devices == 2


@pytest.mark.parametrize("name", ["local", "slurm"])
def test_launchers_compose_to_submitit(name: str) -> None:
    cfg = compose("config", overrides=[f"hydra/launcher={name}"], return_hydra_config=True)
    assert "submitit" in cfg.hydra.launcher._target_.lower()


def test_typo_in_trainer_key_names_the_key() -> None:
    with pytest.raises(ConfigCompositionException) as info:
        make("trainer.max_epoch=3")
    assert "max_epoch" in str(info.value.__cause__)


def test_bad_trainer_value_names_the_key() -> None:
    with pytest.raises(ConfigCompositionException) as info:
        make("trainer.max_epochs=abc")
    assert "trainer.max_epochs" in str(info.value.__cause__)


def test_unknown_strategy_lists_choices() -> None:
    with pytest.raises(MissingConfigException) as info:
        make("strategy=foo")
    text = str(info.value)
    for name in options("strategy"):
        assert name in text


def test_trainer_group_covers_every_trainer_option() -> None:
    """The schema must not drift from the Trainer's signature (anything missing could not be set)."""
    import inspect

    from trainer import Trainer

    cfg = make()
    accepted = set(inspect.signature(Trainer).parameters) - {"strategy", "callbacks", "default_root_dir", "config"}
    assert set(cfg.trainer) <= accepted
    assert accepted == set(cfg.trainer), "the trainer group's schema is derived from Trainer.__init__ (trainer_schema)"


def test_help_lists_every_group(tmp_path: Path) -> None:
    """``geartrain --help`` lists every packaged group with every option (composed, so none is forgotten)."""
    from tests.helpers.cli import run_geartrain

    result = run_geartrain("--help", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    listed = {
        name: {o.strip() for o in values.split(",")}
        for name, _, values in (line.partition(": ") for line in result.stdout.splitlines())
        if values and " " not in name
    }
    for group in [p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("hydra", "__pycache__")]:
        assert group in listed, f"geartrain --help does not mention the {group} group"
        for option in options(group):
            assert option in listed[group], f"geartrain --help does not mention {group}={option}"


@pytest.mark.parametrize("name", ["ddp_spawn", "fsdp"])
def test_a_composed_config_unpickles_in_a_fresh_process(name: str) -> None:
    """``ddp_spawn`` hands the run's config to its processes: the derived schema classes must be findable by name."""
    import pickle
    import subprocess
    import sys

    payload = pickle.dumps(make(f"strategy={name}", "trainer.max_epochs=3"))
    code = (
        "import pickle, sys; cfg = pickle.loads(sys.stdin.buffer.read()); "
        "print(cfg.trainer.max_epochs, cfg.strategy.name, type(cfg.trainer._metadata.object_type).__name__)"
    )
    result = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True, check=False)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert result.stdout.decode().split()[:2] == ["3", name]
