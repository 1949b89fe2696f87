"""Strategy names, how instances learn the Trainer's devices, Slurm/torchrun detection, data sharding,
and DataParallel on CPU (one process, no spawning)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

import strategies
from strategies import (
    AMPStrategy,
    DataParallelStrategy,
    DDPStrategy,
    FSDPStrategy,
    SingleDeviceStrategy,
)
from strategies.launch import first_host, joined_environment, slurm_environment
from strategies.parallel import EvalShardSampler
from strategies.registry import resolve_strategy
from tests.helpers import jobs
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, seed_everything


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("single", SingleDeviceStrategy),
        ("dp", DataParallelStrategy),
        ("ddp", DDPStrategy),
        ("amp", AMPStrategy),
        ("fsdp", FSDPStrategy),
        ("auto", SingleDeviceStrategy),
    ],
)
def test_every_name_builds_its_strategy(name: str, cls: type) -> None:
    assert type(resolve_strategy(name)) is cls


def test_auto_with_several_devices_is_ddp_and_unknown_names_list_the_valid_ones() -> None:
    strategy = resolve_strategy("auto", devices=2)
    assert isinstance(strategy, DDPStrategy) and strategy.world_size == 2
    with pytest.raises(ValueError, match="valid names: auto, amp, ddp, dp, fsdp, model_parallel, single"):
        resolve_strategy("horovod")


def test_hydra_built_instance_learns_trainer_devices(clean_distributed_env: None) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from trainer.cli.app import config_dir

    def composed(name: str) -> object:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
            return compose("config", overrides=[f"strategy={name}"]).strategy

    # dp takes as many devices as there are GPUs (more are refused: test_data_parallel_refuses_alike_...).
    dp_devices = 2 if torch.cuda.device_count() >= 2 else 1
    for name, cls in (("ddp", DDPStrategy), ("fsdp", FSDPStrategy), ("dp", DataParallelStrategy)):
        strategy = instantiate(composed(name))
        assert type(strategy) is cls
        devices = dp_devices if name == "dp" else 2
        trainer = Trainer(strategy=strategy, devices=devices, precision="bf16-mixed", logger=False)
        assert trainer.strategy is strategy and strategy.precision.name == "bf16-mixed"
        if name != "dp":
            assert strategy.world_size == 2 and strategy.is_global_zero
    # An explicit instance setting survives the Trainer's defaults.
    assert Trainer(strategy=DDPStrategy(devices=3, device="cpu"), logger=False).world_size == 3
    with pytest.raises(ValueError, match="one device"):
        Trainer(strategy=SingleDeviceStrategy(), devices=2)


def test_fsdp_refuses_old_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.8.1+cpu")
    with pytest.raises(RuntimeError, match=r"torch >= 2\.9"):
        FSDPStrategy()


def test_slurm_and_torchrun_environments(monkeypatch: pytest.MonkeyPatch, clean_distributed_env: None) -> None:
    for key in ("TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "SLURM_PROCID", "MASTER_ADDR", "MASTER_PORT", "RANK"):
        monkeypatch.delenv(key, raising=False)
    assert not joined_environment()
    assert first_host("gpu[07-08,11],cpu01") == "gpu07" and first_host("a1") == "a1"
    slurm = {"SLURM_NTASKS": "8", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODELIST": "n[3-6]"}
    assert slurm_environment({**slurm, "SLURM_NTASKS": "1"}) is None  # one task: nothing to join
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    assert joined_environment()
    strategy = DDPStrategy(device="cpu")
    assert (strategy.world_size, strategy.global_rank, strategy.local_rank) == (8, 5, 1)
    assert os.environ["MASTER_ADDR"] == "n3" and os.environ["RANK"] == "5"


def test_eval_shards_cover_every_sample_once() -> None:
    for size in (0, 1, 7, 37):
        shards = [list(EvalShardSampler(range(size), rank, 3)) for rank in range(3)]
        assert sorted(i for shard in shards for i in shard) == list(range(size))
        assert [len(EvalShardSampler(range(size), rank, 3)) for rank in range(3)] == [len(s) for s in shards]


def test_ddp_rebuilds_loaders_with_a_sampler(clean_distributed_env: None) -> None:
    strategy = DDPStrategy(devices=2, device="cpu")  # planned world of 2, this process is rank 0
    data = jobs.dataset(37)
    collate = torch.utils.data.default_collate
    train = strategy.process_dataloader(DataLoader(data, batch_size=4, shuffle=True, collate_fn=collate), train=True)
    assert isinstance(train, DataLoader) and isinstance(train.sampler, DistributedSampler)
    assert train.sampler.shuffle and train.batch_size == 4 and train.collate_fn is collate
    assert len(train.sampler) == 19  # padded to equal shards: every rank steps the same number of times
    val = strategy.process_dataloader(DataLoader(data, batch_size=4), train=False)
    assert isinstance(val, DataLoader) and list(val.sampler) == list(range(0, 37, 2))


def test_data_parallel_on_cpu_is_bitwise_single_device(tmp_path: Path) -> None:
    def run(strategy: str) -> tuple[dict[str, torch.Tensor], Trainer]:
        seed_everything(3)
        module = jobs.BlockNet()
        trainer = quiet_trainer(
            tmp_path / strategy,
            strategy=strategy,
            num_sanity_val_steps=2,
            enable_checkpointing=True,
            max_epochs=2,
            gradient_clip_val=0.5,
            accumulate_grad_batches=2,
        )
        data = jobs.dataset(64)
        trainer.fit(module, DataLoader(data, batch_size=8, shuffle=True), DataLoader(data, batch_size=16))
        return jobs.weights(module), trainer

    expected, _ = run("single")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, trainer = run("dp")
    assert isinstance(trainer.strategy.model, nn.DataParallel)  # the steps really ran through it
    said = [w for w in caught if "DataParallelStrategy" in str(w.message)]
    assert len(said) == 1 and "one device" in str(said[0].message)  # once, not per step
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert trainer.global_step == 8


def test_strategies_package_exports() -> None:
    assert strategies.DDPStrategy is DDPStrategy and strategies.FSDPStrategy is FSDPStrategy


def test_data_parallel_replica_logs_are_averaged_and_logged_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """What two GPU replicas would do, run by hand on CPU: each logs, the strategy logs the mean once."""
    from strategies.dp import _ReplicaRunner

    class Recorder:
        def __init__(self) -> None:
            self.calls: list[tuple[str, float, dict[str, object]]] = []
            self._plain_log: dict[str, object] = {}  # no shortcut: every call reaches _log
            self.barebones = False

        def _log(self, name: str, value: torch.Tensor, *args: object) -> None:  # TrainModule.log passes these
            keys = ("on_step", "on_epoch", "prog_bar", "sync_dist", "reduce_fx", "batch_size")
            self.calls.append((name, float(value), dict(zip(keys, args))))

    strategy = DataParallelStrategy()
    monkeypatch.setattr(DataParallelStrategy, "device_ids", property(lambda self: [0, 1]))
    module = jobs.BlockNet()
    trainer = Recorder()
    module._trainer = trainer  # type: ignore[assignment]
    strategy.module = module
    runner = _ReplicaRunner(module, strategy)
    data = jobs.dataset(6)
    chunks = [(data.tensors[0][:4], data.tensors[1][:4]), (data.tensors[0][4:], data.tensors[1][4:])]
    losses = [float(runner("training_step", chunk, 0).detach()) for chunk in chunks]  # one call per replica
    assert trainer.calls == [] and module._trainer is trainer  # nothing logged yet, trainer restored
    strategy._log_replica_values()
    assert len(trainer.calls) == 1
    name, value, options = trainer.calls[0]
    assert name == "train/loss" and options["sync_dist"] is True and options["on_epoch"] is True
    assert value == pytest.approx((4 * losses[0] + 2 * losses[1]) / 6)  # weighted by each replica's share


def test_a_strategy_is_one_file_named_after_it_with_one_yaml_per_name() -> None:
    """Every strategy registers its names in its own module; each yaml of conf/strategy is one of them."""
    from strategies.registry import find_strategy, own_aliases, strategy_classes
    from tests.helpers import REPO_ROOT

    classes = strategy_classes()
    for name, cls in classes.items():
        assert cls.__module__ == f"strategies.{name}", f"{cls.__name__} should live in strategies/{name}.py"
        for alias, implied in own_aliases(cls).items():
            assert find_strategy(alias) == (cls, implied)
    yamls = {p.stem for p in (REPO_ROOT / "conf" / "strategy").glob("*.yaml")}
    names = {n for cls in classes.values() for n in (cls.name, *own_aliases(cls))}
    assert set(classes) <= yamls, f"add conf/strategy/<name>.yaml for {sorted(set(classes) - yamls)}"
    assert yamls <= names, f"conf/strategy/ has yamls for names no strategy registers: {sorted(yamls - names)}"
    table = (REPO_ROOT / "docs" / "strategies.md").read_text()
    undocumented = [name for name in classes if f"| `{name}` |" not in table]
    assert undocumented == [], f"add a row to docs/strategies.md's table for {undocumented}"


def test_the_schema_of_a_strategy_is_derived_from_its_constructor() -> None:
    """strategy.<argument>=... takes exactly the constructor's arguments, with its defaults."""
    import dataclasses
    import inspect
    from datetime import timedelta

    from strategies.registry import own_aliases, strategy_classes
    from trainer.cli.config import strategy_schema

    for name, cls in strategy_classes().items():
        schema = {f.name: f.default for f in dataclasses.fields(strategy_schema(cls, name))}
        assert schema.pop("_target_") == "strategies.registry.build_strategy" and schema.pop("name") == name
        parameters = {
            arg: param
            for arg, param in inspect.signature(cls).parameters.items()
            if param.kind is not param.VAR_KEYWORD  # DDP's **kwargs for torch's DDP: a config names each one
        }
        assert list(schema) == list(parameters)
        for arg, param in parameters.items():
            expected = param.default.total_seconds() if isinstance(param.default, timedelta) else param.default
            if isinstance(expected, (bool, int, float, str, type(None))):
                assert schema[arg] == expected, f"{name}.{arg}"
        implied = next(iter(own_aliases(cls).items()), None)
        if implied is not None:  # a name's implied arguments are left to the name
            alias_schema = {f.name: f.default for f in dataclasses.fields(strategy_schema(cls, *implied))}
            assert all(alias_schema[key] is None for key in implied[1])


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="with two GPUs, devices=2 is what dp runs on")
@pytest.mark.parametrize("given", [{"devices": 2}, {"accelerator": "cpu"}], ids=["devices=2", "accelerator=cpu"])
def test_data_parallel_refuses_alike_by_name_and_as_the_commands_instance(given: dict[str, object]) -> None:
    """``Trainer(strategy="dp")`` and ``geartrain strategy=dp`` (an instance built by Hydra): one rule, one message."""
    with pytest.raises(ValueError, match="strategy='dp'") as by_name:
        Trainer(strategy="dp", logger=False, **given)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="strategy='dp'") as as_instance:
        Trainer(strategy=DataParallelStrategy(), logger=False, **given)  # type: ignore[arg-type]
    assert str(by_name.value) == str(as_instance.value)
    assert "strategy='ddp'" in str(by_name.value) or "'single'" in str(by_name.value)
