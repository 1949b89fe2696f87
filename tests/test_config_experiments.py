"""Experiments override the primary config, an unknown one is an error, and the optim values are typed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import DictConfig, OmegaConf

from trainer.cli.app import check_config, config_dir
from trainer.errors import ConfigError

CONF = config_dir()
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


@pytest.fixture(autouse=True)
def hydra_context() -> Iterator[None]:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        yield
    GlobalHydra.instance().clear()


def make(*overrides: str) -> DictConfig:
    return compose("config", overrides=list(overrides))


def test_an_experiment_overrides_the_primary_config() -> None:
    assert make().task == "fit_test"
    assert make("experiment=charlm").task == "fit"  # _self_ comes before the experiment
    assert make("experiment=charlm", "task=validate").task == "validate"  # the command line still wins


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_and_passes_the_checks(name: str) -> None:
    cfg = make(f"experiment={name}")
    check_config(cfg)
    # The experiments state their monitors and want a typo in them to fail.
    callbacks = cfg.callbacks
    assert callbacks.model_checkpoint.monitor and callbacks.model_checkpoint.missing_monitor == "raise"
    assert callbacks.early_stopping.monitor and callbacks.early_stopping.strict is True


def test_the_default_job_passes_the_checks_and_its_callbacks_stand_aside_for_other_projects() -> None:
    cfg = make()
    check_config(cfg)
    assert cfg.callbacks.model_checkpoint.missing_monitor == "warn"
    assert cfg.callbacks.early_stopping.strict is False


def test_an_unknown_experiment_fails_listing_the_experiments() -> None:
    with pytest.raises(MissingConfigException) as info:
        make("experiment=does_not_exist")
    assert sorted(info.value.options or []) == EXPERIMENTS


@pytest.mark.parametrize("override", ["optim.lr=abc", "optim=sgd", "optim=sgd optim.momentum=abc"])
def test_optim_values_are_typed(override: str) -> None:
    overrides = override.split()
    if overrides[-1].endswith("abc"):
        with pytest.raises(ConfigCompositionException) as info:
            make(*overrides)
        assert overrides[-1].split("=")[0] in str(info.value.__cause__)
    else:
        assert OmegaConf.get_type(make(*overrides).optim).__name__ == "SGDOptimConfig"


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("optim.lr=-1", "optim.lr"),
        ("trainer.gradient_clip_algorithm=foo", "trainer.gradient_clip_algorithm"),
        ("task=fitt", "task=fitt"),
        ("seed=abc", "seed=abc"),
    ],
)
def test_values_the_schemas_refuse_are_config_errors(override: str, named: str) -> None:
    cfg = make(override)
    with pytest.raises(ConfigError, match=named):
        check_config(cfg)
