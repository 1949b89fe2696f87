"""Memory tools: DeviceStatsMonitor, activation checkpointing, micro-batching, portable weights."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import callbacks.device_stats as device_stats
from callbacks import Callback, CSVLogger, DeviceStatsMonitor
from strategies.registry import resolve_strategy, strategy_classes
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule, seed_everything
from trainer.checkpoint.files import CheckpointError
from trainer.checkpoint.files import write_checkpoint as save_checkpoint
from trainer.common.errors import MisconfigurationException
from trainer.common.state_dict import load_module_state
from trainer.data.microbatch import split_batch


class Block(nn.Module):
    """A residual MLP block: its activations (4x wide) dominate its parameters."""

    def __init__(self, dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.down(torch.tanh(self.up(x))))


class Net(TrainModule):
    def __init__(self, dim: int = 8, depth: int = 3, dropout: float = 0.0, oom_above: int | None = None) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block(dim, dropout) for _ in range(depth)])
        self.head = nn.Linear(dim, 1)
        self.oom_above = oom_above
        self.seen: list[int] = []  # micro-batch sizes that ran forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.oom_above is not None and x.shape[0] > self.oom_above:
            raise torch.OutOfMemoryError(f"simulated: {x.shape[0]} samples > {self.oom_above}")
        self.seen.append(x.shape[0])
        return self.head(self.blocks(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def data(n: int = 48, dim: int = 8, batch_size: int = 16) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, dim, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=batch_size)


def trainer(**kwargs: Any) -> Trainer:
    base: dict[str, Any] = dict(max_epochs=2, strategy="single", num_sanity_val_steps=2)
    return quiet_trainer(**{**base, **kwargs})


def fitted(net_kwargs: dict[str, Any] | None = None, loader: DataLoader | None = None, **kwargs: Any) -> Net:
    seed_everything(0)
    net = Net(**(net_kwargs or {}))
    trainer(**kwargs).fit(net, loader if loader is not None else data())
    return net


def same(a: nn.Module, b: nn.Module, exact: bool = True) -> bool:
    pairs = zip(a.state_dict().values(), b.state_dict().values())
    if exact:
        return all(torch.equal(x, y) for x, y in pairs)
    return all(torch.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in pairs)


class Recorder(Callback):
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []

    def on_log_metrics(
        self, trainer: Trainer, module: TrainModule, metrics: dict[str, torch.Tensor], step: int
    ) -> None:
        self.logged.append((step, {k: float(v) for k, v in metrics.items()}))


# ----------------------------------------------------------------- DeviceStatsMonitor
class FakePsutil:
    """Stands in for ``psutil`` (not a dependency): fixed figures, so the logged values can be checked."""

    @staticmethod
    def virtual_memory() -> Any:
        return SimpleNamespace(percent=41.5)

    @staticmethod
    def swap_memory() -> Any:
        return SimpleNamespace(percent=2.25)

    @staticmethod
    def cpu_percent() -> float:
        return 63.0


class StatsLogger(CSVLogger):
    """Keeps what ``DeviceStatsMonitor`` hands to ``log_metrics``, as Lightning's monitor calls it."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.calls: list[tuple[int | None, dict[str, float]]] = []

    def log_metrics(self, metrics: Any, step: int | None = None) -> None:
        if any(key.startswith("DeviceStatsMonitor.") for key in metrics):
            self.calls.append((step, dict(metrics)))
        super().log_metrics(metrics, step)


def test_device_stats_are_the_accelerators_figures_at_lightnings_keys_hooks_and_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "psutil", FakePsutil)
    monkeypatch.setattr(device_stats, "_PSUTIL_AVAILABLE", True)
    logger, monitor = StatsLogger(tmp_path), DeviceStatsMonitor()
    run = trainer(max_epochs=1, num_sanity_val_steps=0, log_every_n_steps=2, logger=logger, callbacks=[monitor])
    net = Net()
    net.test_step = net.validation_step  # type: ignore[method-assign]
    run.fit(net, data(64), data(32))  # 4 training batches, 2 validation batches
    run.test(net, data(32))
    figures = {"cpu_vm_percent": 41.5, "cpu_percent": 63.0, "cpu_swap_percent": 2.25}
    where = []
    for step, metrics in logger.calls:
        hook = next(iter(metrics)).split("/")[0].removeprefix("DeviceStatsMonitor.")
        assert metrics == {f"DeviceStatsMonitor.{hook}/{name}": value for name, value in figures.items()}
        where.append((step, hook))
    # Training batches 1 and 3 (every 2nd), at the steps taken before them; validation's 2nd batch at
    # the last training step; test's 2nd batch at the steps trained (Lightning's x-axis).
    assert where == [
        (1, "on_train_batch_start"),
        (1, "on_train_batch_end"),
        (3, "on_train_batch_start"),
        (3, "on_train_batch_end"),
        (3, "on_validation_batch_start"),
        (3, "on_validation_batch_end"),
        (4, "on_test_batch_start"),
        (4, "on_test_batch_end"),
    ]
    assert monitor.peaks["rank0/cpu"] > 10  # MiB: a process with torch loaded (geartrain's addition)


def test_device_stats_refusals_are_lightnings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(MisconfigurationException, match="Cannot use `DeviceStatsMonitor` callback"):
        trainer(max_epochs=1, callbacks=[DeviceStatsMonitor()]).fit(Net(), data())
    monkeypatch.setattr(device_stats, "_PSUTIL_AVAILABLE", False)
    with pytest.raises(ModuleNotFoundError, match=r"psutil` is not installed.*pip install psutil"):
        trainer(max_epochs=1, logger=StatsLogger(tmp_path), callbacks=[DeviceStatsMonitor()]).fit(Net(), data())
    logger = StatsLogger(tmp_path)  # cpu_stats=False on the CPU: nothing to log, psutil not needed
    trainer(max_epochs=1, logger=logger, log_every_n_steps=1, callbacks=[DeviceStatsMonitor(cpu_stats=False)]).fit(
        Net(), data()
    )
    assert logger.calls == []


# ----------------------------------------------------------------- activation checkpointing
def test_activation_checkpointing_gives_bitwise_same_weights_and_keys() -> None:
    plain = fitted({"dropout": 0.2})
    ckpt = fitted({"dropout": 0.2}, activation_checkpointing=[Block])
    assert getattr(ckpt.blocks[0], "_geartrain_checkpointed", False)
    assert list(ckpt.state_dict()) == list(plain.state_dict())
    assert same(plain, ckpt)  # dropout masks replayed in the recompute, so bitwise equal
    by_path = fitted({"dropout": 0.2}, activation_checkpointing=[f"{__name__}.Block"])
    assert same(plain, by_path)


def test_checkpointed_blocks_replicate_and_copy_with_their_own_parameters() -> None:
    net = Net(dropout=0.0)
    resolve_strategy("single").apply_activation_checkpointing(net, (Block,))
    block, x = net.blocks[0], torch.randn(4, 8)
    assert isinstance(block, Block) and type(block).__name__ == "Block"
    # What nn.DataParallel does per GPU: a shallow replica whose parameters are then swapped.
    replica = block._replicate_for_data_parallel()
    replica._parameters = dict(block._parameters)
    replica.up = block.up._replicate_for_data_parallel()
    replica.up._parameters = {"weight": torch.zeros_like(block.up.weight), "bias": torch.zeros_like(block.up.bias)}
    down = block.down
    expected = x + down(torch.tanh(torch.zeros(4, 32)))
    assert torch.equal(replica(x), expected)  # used the replica's (zero) weights, not the original's
    twin = copy.deepcopy(net)
    with torch.no_grad():
        for p in twin.parameters():
            p.zero_()
    assert torch.equal(twin.blocks[0](x), x) and not torch.equal(net.blocks[0](x), x)


def test_activation_checkpointing_stores_fewer_activation_bytes() -> None:
    def saved_bytes(checkpointed: bool) -> int:
        seed_everything(0)
        net = Net(dim=32, depth=4)
        if checkpointed:
            resolve_strategy("single").apply_activation_checkpointing(net, (Block,))
        total = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            net(torch.randn(64, 32)).sum().backward()
        return total

    full, checkpointed = saved_bytes(False), saved_bytes(True)
    # Without: each block keeps its input, two 4x-wide activations and more; with: inputs only.
    assert checkpointed < full / 4, (checkpointed, full)


def test_activation_checkpointing_rejects_what_is_not_a_module_class() -> None:
    with pytest.raises(ValueError, match="cannot import"):
        trainer(activation_checkpointing=["no.such.Block"])
    with pytest.raises(TypeError, match=r"nn\.Module classes"):
        trainer(activation_checkpointing=[int])


# ----------------------------------------------------------------- micro-batching
def test_split_batch_slices_every_batch_tensor_and_keeps_the_rest() -> None:
    batch = {"x": torch.arange(10).view(5, 2), "y": torch.arange(5), "scale": torch.tensor(2.0), "name": "b"}
    pieces = list(split_batch(batch, 2))
    assert [n for _, n in pieces] == [2, 2, 1]
    assert torch.equal(torch.cat([p["x"] for p, _ in pieces]), batch["x"])
    assert all(p["scale"] is batch["scale"] and p["name"] == "b" for p, _ in pieces)


def test_micro_batches_give_the_whole_batch_step() -> None:
    whole = fitted()
    # 16 = 6 + 6 + 4: uneven pieces, each loss weighted by its share; equal up to float rounding.
    assert same(whole, fitted(micro_batch_size=6), exact=False)
    assert same(whole, fitted(micro_batch_size=16))  # one piece: bitwise the plain step
    assert same(whole, fitted(micro_batch_size=6, accumulate_grad_batches=2, loader=data(batch_size=8)), exact=False)


def test_auto_micro_batch_halves_on_oom_and_retries_the_same_batch(capsys: pytest.CaptureFixture[str]) -> None:
    recorder = Recorder()
    auto = fitted({"oom_above": 5}, micro_batch_size="auto", callbacks=[recorder])
    # Tried 16, then 8 (both out of memory), settled on 4, and stayed there.
    assert auto.seen[:4] == [4, 4, 4, 4] and set(auto.seen) == {4}
    assert len(auto.seen) == 2 * 48 // 4  # every sample exactly once per epoch: none lost, none repeated
    settled = fitted(micro_batch_size=4)
    assert same(auto, settled)
    assert same(auto, fitted(), exact=False)
    assert capsys.readouterr().out.count("settled on 4") == 1
    assert [m["micro_batch_size"] for _, m in recorder.logged if "micro_batch_size" in m] == [4.0]


class FlakyNet(Net):
    """Runs out of memory once: on the 2nd micro-batch of the 2nd batch of an accumulation window."""

    def __init__(self) -> None:
        super().__init__()
        self.calls, self.failed = 0, False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.global_step == 1 and x.shape[0] == 4 and self.calls % 4 == 0 and not self.failed:
            self.failed = True
            raise torch.OutOfMemoryError("simulated, transient")
        return super().forward(x)


def test_auto_oom_after_a_partial_backward_keeps_earlier_gradients_of_the_window() -> None:
    seed_everything(0)
    flaky = FlakyNet()
    # Batches of 8 samples, two batches per optimizer step; micro-batches start at 4 after an OOM.
    t = trainer(micro_batch_size="auto", accumulate_grad_batches=2)
    t.micro_batcher.size = 4  # type: ignore[union-attr]
    t.fit(flaky, data(batch_size=8))
    assert flaky.failed and 2 in flaky.seen
    seed_everything(0)
    reference = Net()
    trainer(accumulate_grad_batches=2).fit(reference, data(batch_size=8))
    assert same(flaky, reference, exact=False)


def test_micro_batch_size_is_validated() -> None:
    with pytest.raises(ValueError, match="micro_batch_size"):
        trainer(micro_batch_size=0)

    class Manual(Net):
        automatic_optimization = False

    with pytest.raises(ValueError, match="automatic optimisation"):
        trainer(micro_batch_size=4).fit(Manual(), data())


# ----------------------------------------------------------------- portable weights
def test_plain_dataparallel_state_dict_loads_for_evaluation_and_initialisation(tmp_path: Path) -> None:
    source = fitted()
    path = tmp_path / "plain.pt"
    torch.save({f"module.{k}": v for k, v in source.state_dict().items()}, path)  # plain DP code's file
    target = Net()
    result = trainer().validate(target, data(), ckpt_path=path)[0]
    assert same(source, target) and result["val/loss"] > 0
    start = Net()
    trainer(max_steps=0).fit(start, data(), ckpt_path=path)  # initialise from plain weights
    assert same(source, start)


def test_mismatched_weights_name_the_missing_and_unexpected_keys(tmp_path: Path) -> None:
    path = tmp_path / "other.pt"
    state = Net().state_dict()
    state["extra.weight"] = state.pop("head.weight")
    torch.save(state, path)
    with pytest.raises(CheckpointError) as err:
        trainer().validate(Net(), data(), ckpt_path=path)
    text = str(err.value)
    assert str(path) in text and "missing keys (1): head.weight" in text and "unexpected keys (1): extra.weight" in text


def test_wrapped_and_compiled_state_dicts_load_into_a_plain_module() -> None:
    source = Net()
    for wrapped in (nn.DataParallel(source), torch.compile(source), nn.DataParallel(torch.compile(source))):
        state = wrapped.state_dict()
        assert any(k.startswith(("module.", "_orig_mod.")) for k in state)
        target = Net()
        load_module_state(target, state)
        assert same(source, target)

    class HasModuleAttr(nn.Module):  # its own key starts with "module.": used as it is, not stripped
        def __init__(self) -> None:
            super().__init__()
            self.module = nn.Linear(2, 2)

    own = HasModuleAttr()
    load_module_state(own, HasModuleAttr().state_dict())
    load_module_state(own, nn.DataParallel(HasModuleAttr()).state_dict())


def _constructible(name: str) -> bool:
    try:
        resolve_strategy(name, devices=1)
    except Exception:  # its module is not on this branch, or it cannot run on this machine
        return False
    return True


# model_parallel trains only a module whose configure_model applies a plan; its checkpoints move
# between meshes and to one process in tests/test_model_parallel.py.
PORTABLE = [name for name in strategy_classes() if _constructible(name) and name != "model_parallel"]


def test_cross_strategy_matrix_covers_the_basic_strategies() -> None:
    assert {"single", "amp"} <= set(PORTABLE)


def _full(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor from a possibly sharded (DTensor) one."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


@pytest.mark.timeout(120)
def test_checkpoints_move_between_strategies(tmp_path: Path) -> None:
    saved = {}
    for name in PORTABLE:
        seed_everything(0)
        net = Net()
        strategy = resolve_strategy(name, devices=1)
        if getattr(strategy, "state_dict_type", "full") == "sharded":
            # The portable one-file form; directories move between strategies in test_sharded_checkpoint*.py.
            strategy.state_dict_type = "full"  # type: ignore[attr-defined]
        t = trainer(strategy=strategy, max_epochs=1)
        t.fit(net, data())
        path = tmp_path / f"{name}.ckpt"
        t.save_checkpoint(path)
        state = torch.load(path, weights_only=True)["state_dict"]
        assert list(state) == list(Net().state_dict()), f"{name} saved wrapper prefixes"
        # The checkpoint's full weights are the reference (FSDP leaves the live module sharded).
        saved[name] = (path, {k: v.float() for k, v in state.items()})
    for saver, (path, weights) in saved.items():
        for loader_name in PORTABLE:
            net = Net()
            trainer(strategy=resolve_strategy(loader_name, devices=1)).validate(net, data(), ckpt_path=path)
            got = {k: _full(v).float() for k, v in net.state_dict().items()}
            assert all(torch.equal(got[k], weights[k]) for k in weights), f"{saver} -> {loader_name}"


def test_weights_only_geartrain_checkpoint_is_not_taken_for_plain_weights(tmp_path: Path) -> None:
    path = tmp_path / "weights.ckpt"
    source = Net()
    save_checkpoint({"format": "geartrain", "version": 1, "state_dict": source.state_dict()}, path)
    target = Net()
    with pytest.raises(CheckpointError, match="weights only"):
        trainer().fit(target, data(), ckpt_path=path)


def test_hydra_trainer_config_carries_the_memory_options() -> None:
    from omegaconf import OmegaConf

    from trainer.cli.config import trainer_schema

    cfg = OmegaConf.merge(
        OmegaConf.structured(trainer_schema()),
        OmegaConf.from_dotlist([f"activation_checkpointing=[{__name__}.Block]", "micro_batch_size=auto"]),
    )
    kwargs = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(kwargs, dict)
    t = Trainer(**{str(k): v for k, v in kwargs.items()}, strategy="single")
    assert t.activation_checkpointing == (Block,)
    assert t.micro_batcher is not None and t.micro_batcher.auto
