"""Lightning's plugins (``Trainer(plugins=...)``, ``lightning.pytorch.plugins``) over geartrain's objects.

A precision plugin given as a plugin trains bitwise as the same ``precision=`` string; the true
precisions create tensors and ``configure_model`` layers in their dtype, as Lightning's; a checkpoint
IO of the user's writes, reads and removes the run's files (and an ``AsyncCheckpointIO`` run resumes
exactly); cluster environments answer what the launcher variables say; Lightning's checks of the
plugin list and its messages.
"""

from __future__ import annotations

import os
import pickle
import signal
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from trainer.lightning.plugins import AsyncCheckpointIO, CheckpointIO, FSDPPrecision, TorchSyncBatchNorm
from trainer.lightning.plugins.environments import (
    KubeflowEnvironment,
    LightningEnvironment,
    LSFEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)

import trainer.lightning as pl
from callbacks import ModelCheckpoint
from strategies.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule
from trainer.common.errors import MisconfigurationException


class Tiny(TrainModule):
    """A small regression net; ``seen`` records the dtype of a tensor made inside each step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.seen: list[torch.dtype] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.seen.append(torch.zeros(1).dtype)
        return nn.functional.mse_loss(self.net(x), y)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("loss", nn.functional.mse_loss(self.net(batch[0]), batch[1]))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data() -> DataLoader[Any]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def _weights(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


@pytest.mark.parametrize(
    ("name", "plugin"),
    [
        ("bf16-mixed", lambda: MixedPrecision("bf16-mixed", "cpu")),
        ("64-true", DoublePrecision),
        ("bf16-true", lambda: HalfPrecision("bf16-true")),
    ],
)
def test_a_precision_plugin_trains_as_its_precision_string(name: str, plugin: Any) -> None:
    by_name, by_plugin = Tiny(), Tiny()
    quiet_trainer(max_epochs=1, precision=name).fit(by_name, _data())
    trainer = quiet_trainer(max_epochs=1, plugins=[plugin()])
    trainer.fit(by_plugin, _data())
    assert trainer.precision == name and isinstance(trainer.precision_plugin, Precision)
    assert trainer.strategy.precision_plugin is trainer.precision_plugin
    for a, b in zip(_weights(by_name), _weights(by_plugin)):
        assert torch.equal(a, b)


class ComplexBuffers(Tiny):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("made_early", torch.complex(torch.ones(2), torch.ones(2)), persistent=False)

    def configure_model(self) -> None:
        self.late = nn.Linear(2, 2)  # made under the precision's module_init_context


def test_true_precision_makes_tensors_and_configure_model_layers_in_its_dtype() -> None:
    model = ComplexBuffers()
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2, precision="64-true")
    with trainer.init_module():
        assert nn.Linear(2, 2).weight.dtype == torch.float64  # Lightning's init_module: the precision's dtype
    trainer.fit(model, _data())
    assert model.seen == [torch.float64, torch.float64]  # torch.zeros(1) inside training_step
    assert model.late.weight.dtype == torch.float64 and model.net[0].weight.dtype == torch.float64
    assert model.made_early.dtype == torch.complex64  # module.double() keeps complex buffers whole
    assert torch.get_default_dtype() == torch.float32  # restored after the step


@pytest.mark.parametrize("plugin", [DoublePrecision(), HalfPrecision("16-true"), FSDPPrecision("bf16-true")])
def test_dtype_contexts_restore_the_default_dtype_on_errors(plugin: Precision) -> None:
    for context in (plugin.module_init_context, plugin.forward_context, plugin.tensor_init_context):
        with pytest.raises(RuntimeError, match="inside"), context():
            assert torch.get_default_dtype() != torch.float32
            raise RuntimeError("inside")
        assert torch.get_default_dtype() == torch.float32
    with plugin.module_init_context():
        layer = nn.Linear(2, 2)
    assert layer.weight.dtype == plugin.convert_module(nn.Linear(2, 2)).weight.dtype != torch.float32


def test_lightnings_constructors_and_their_checks() -> None:
    amp = MixedPrecision("bf16-mixed", "cpu")
    assert (amp.precision, amp.device, amp.scaler) == ("bf16-mixed", "cpu", None)
    assert isinstance(amp.autocast_context_manager(), torch.autocast)
    with pytest.raises(ValueError, match=r"Passed `MixedPrecision\(precision='bf16'\)`"):
        MixedPrecision("bf16", "cpu")
    with pytest.raises(ValueError, match="does not use a scaler"):
        MixedPrecision("bf16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    with pytest.raises(ValueError, match="is not supported in FSDP"):
        FSDPPrecision("64-true")
    assert FSDPPrecision("16-mixed").scaler is not None and FSDPPrecision("bf16-mixed").scaler is None
    with pytest.warns(UserWarning, match="enables computation in lower precision"):
        assert FSDPPrecision("16-true").mixed_precision_config.param_dtype == torch.float16
    assert HalfPrecision().precision == "bf16-true" and DoublePrecision().precision == "64-true"
    model, _, _ = DoublePrecision().connect(Tiny(), [], [])
    pickle.dumps(model)


def test_clip_gradients_of_a_plugin_clips_once_unscaled() -> None:
    layer = nn.Linear(2, 1)
    layer(torch.ones(1, 2)).sum().mul(100).backward()
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    Precision().clip_gradients(optimizer, clip_val=0.0)  # 0: nothing clipped
    assert layer.weight.grad is not None and layer.weight.grad.abs().max() == 100
    Precision().clip_gradients(
        optimizer, clip_val=0.5, gradient_clip_algorithm=pl.utilities.GradClipAlgorithmType.VALUE
    )
    assert layer.weight.grad.abs().max() == 0.5
    with pytest.raises(RuntimeError, match="does not allow for gradient clipping"):
        fused = torch.optim.SGD(layer.parameters(), lr=0.1)
        fused._step_supports_amp_scaling = True  # type: ignore[attr-defined]
        MixedPrecision("16-mixed", "cpu").clip_gradients(fused, clip_val=1.0)


def test_gradient_clip_val_zero_clips_nothing_as_lightning() -> None:
    unclipped, zero = Tiny(), Tiny()
    quiet_trainer(max_epochs=1, precision="bf16-mixed").fit(unclipped, _data())
    quiet_trainer(max_epochs=1, precision="bf16-mixed", gradient_clip_val=0).fit(zero, _data())
    for a, b in zip(_weights(unclipped), _weights(zero)):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("spelling", "warns"), [(16, True), ("bf16", True), (32, False), ("64", False)])
def test_legacy_precision_spellings_warn_as_lightnings(spelling: Any, warns: bool) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(accelerator="cpu", precision=spelling, logger=False)
    said = [str(w.message) for w in caught if "historical reasons" in str(w.message)]
    assert bool(said) == warns


class OwnBackward(Tiny):
    """Overrides ``backward`` (Lightning's hook): records the loss it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: list[float] = []

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self.handed.append(float(loss))
        loss.backward(*args, **kwargs)


def test_a_modules_backward_gets_the_scaled_loss_under_fp16_as_lightnings() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    model = OwnBackward()
    plugin = MixedPrecision("16-mixed", "cpu", scaler)
    quiet_trainer(max_epochs=1, limit_train_batches=1, plugins=[plugin]).fit(model, _data())
    x, y = next(iter(_data()))
    with torch.autocast("cpu", dtype=torch.float16):
        loss = nn.functional.mse_loss(Tiny().net(x), y)
    assert model.handed == [1024.0 * float(loss)]
    own, plain = OwnBackward(), Tiny()  # bf16: the override is called, the weights are those without it
    quiet_trainer(max_epochs=1, precision="bf16-mixed").fit(own, _data())
    quiet_trainer(max_epochs=1, precision="bf16-mixed").fit(plain, _data())
    assert len(own.handed) == 4 and all(torch.equal(a, b) for a, b in zip(_weights(own), _weights(plain)))


class ClipsByHalf(MixedPrecision):
    """A user's plugin that clips in its own way (halves the gradients), as a Lightning plugin may."""

    calls = 0

    def clip_gradients(self, optimizer: Any, clip_val: float = 0.0, gradient_clip_algorithm: str = "norm") -> None:
        ClipsByHalf.calls += 1
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad.mul_(0.5)


def test_a_users_precision_plugin_clips_the_gradients_itself() -> None:
    halved, plain = Tiny(), Tiny()
    trainer = quiet_trainer(max_epochs=1, plugins=[ClipsByHalf("bf16-mixed", "cpu")], gradient_clip_val=1.0)
    trainer.fit(halved, _data())
    assert ClipsByHalf.calls == 4
    quiet_trainer(max_epochs=1, precision="bf16-mixed").fit(plain, _data())
    assert not all(torch.equal(a, b) for a, b in zip(_weights(halved), _weights(plain)))


def test_the_plugin_list_is_checked_as_lightning_checks_it() -> None:
    for invalid in (1, 12, "invalid"):  # Lightning's message
        with pytest.raises(ValueError, match=f"Precision {invalid!r} is invalid"):
            Trainer(precision=invalid)
    with pytest.raises(ValueError, match="Received both `precision=16-mixed`"):
        Trainer(precision="16-mixed", plugins=[DoublePrecision()])
    with pytest.raises(MisconfigurationException, match="multiple values for Precision"):
        Trainer(plugins=[DoublePrecision(), HalfPrecision()])
    with pytest.raises(MisconfigurationException, match="Found invalid type for plugin"):
        Trainer(plugins=["not a plugin"])

    class OwnRanks(LightningEnvironment):
        def global_rank(self) -> int:
            return 3

    with pytest.raises(ValueError, match="read their ranks from the variables torchrun and srun set"):
        Trainer(plugins=[OwnRanks()])
    with pytest.raises(NotImplementedError, match="does not join LSF"):
        LSFEnvironment()
    assert Trainer(plugins=TorchSyncBatchNorm(), logger=False).sync_batchnorm is True
    strategy = Trainer(plugins=[RecordingIO()], logger=False).strategy
    with pytest.raises(MisconfigurationException, match="checkpoint_io set through both"):
        Trainer(strategy=strategy, plugins=[RecordingIO()], logger=False)


def test_slurm_environment_sets_the_requeue(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = Trainer(plugins=[SLURMEnvironment(auto_requeue=False, requeue_signal=signal.SIGUSR2)], logger=False)
    assert trainer.preemption.slurm_requeue is False and trainer.preemption.requeue_signal == signal.SIGUSR2
    env = {"SLURM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1"}
    env.update({"SLURM_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "1234", "SLURM_JOB_NAME": "train"})
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    slurm = SLURMEnvironment()
    assert SLURMEnvironment.detect() and slurm.creates_processes_externally
    assert (slurm.world_size(), slurm.global_rank(), slurm.local_rank(), slurm.node_rank()) == (4, 3, 1, 1)
    assert slurm.main_address == "gpu07" and slurm.main_port == SLURMEnvironment().main_port
    assert not TorchElasticEnvironment.detect()
    strategy = Trainer(strategy="ddp", devices=2, logger=False).strategy
    assert isinstance(strategy.cluster_environment, SLURMEnvironment)  # type: ignore[attr-defined]


def test_torchrun_and_kubeflow_environments_read_the_launcher_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29501", "WORLD_SIZE": "8", "RANK": "5", "KUBERNETES_PORT": "443"}
    for key, value in {**env, "LOCAL_RANK": "1", "GROUP_RANK": "2", "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(key, value)
    for env_cls, local_and_node in ((TorchElasticEnvironment, (1, 2)), (KubeflowEnvironment, (0, 5))):
        found = env_cls()
        assert env_cls.detect() and found.creates_processes_externally
        answers = (found.main_address, found.main_port, found.world_size(), found.global_rank())
        assert answers == ("10.0.0.7", 29501, 8, 5)
        assert (found.local_rank(), found.node_rank()) == local_and_node
    assert not isinstance(KubeflowEnvironment(), TorchElasticEnvironment)  # two kinds, as Lightning's
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert not TorchElasticEnvironment.detect() and KubeflowEnvironment.detect()


class RecordingIO(CheckpointIO):
    """A user's IO: plain torch files, every call recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        self.calls.append(("save", os.path.basename(path)))
        self.storage_options = storage_options
        torch.save(checkpoint, path)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        self.calls.append(("load", os.path.basename(path)))
        return torch.load(path, weights_only=True)

    def remove_checkpoint(self, path: Any) -> None:
        self.calls.append(("remove", os.path.basename(path)))
        os.remove(path)


def test_a_checkpoint_io_of_the_users_writes_reads_and_removes(tmp_path: Path) -> None:
    io = RecordingIO()
    ck = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = quiet_trainer(tmp_path, [ck], max_epochs=2, plugins=[io], enable_checkpointing=True)
    trainer.fit(Tiny(), _data())
    assert trainer.strategy.checkpoint_io is io
    saves = [name for kind, name in io.calls if kind == "save"]
    assert saves == ["epoch=0-step=4.ckpt", "last.ckpt", "epoch=1-step=8.ckpt", "last.ckpt"]
    assert ("remove", "epoch=0-step=4.ckpt") in io.calls
    trainer.test(ckpt_path=ck.last_model_path, dataloaders=_data(), verbose=False)
    assert io.calls[-1] == ("load", "last.ckpt")
    trainer.save_checkpoint(tmp_path / "s.ckpt", storage_options={"bucket": "b"})
    assert io.calls[-1] == ("save", "s.ckpt") and io.storage_options == {"bucket": "b"}


def test_a_run_resumed_from_an_async_checkpoint_io_equals_an_uninterrupted_one(tmp_path: Path) -> None:
    whole = Tiny()
    quiet_trainer(max_epochs=3).fit(whole, _data())
    first = Tiny()
    ck = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    quiet_trainer(tmp_path, [ck], max_epochs=2, plugins=[AsyncCheckpointIO()], enable_checkpointing=True).fit(
        first, _data()
    )
    resumed = Tiny()
    quiet_trainer(max_epochs=3, plugins=[AsyncCheckpointIO()]).fit(resumed, _data(), ckpt_path=ck.last_model_path)
    for a, b in zip(_weights(whole), _weights(resumed)):
        assert torch.equal(a, b)


class _FailingOnceIO(RecordingIO):
    """Records the values it was given; its first save fails as a full disk does."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if not self.calls:
            self.calls.append(("failed", os.path.basename(path)))
            raise OSError(28, "No space left on device")
        self.calls.append(("save", str(float(checkpoint["w"][0]))))


def test_async_checkpoint_io_writes_a_snapshot_and_raises_a_failed_write_once() -> None:
    io = AsyncCheckpointIO(_FailingOnceIO())
    w = torch.zeros(1)
    io.save_checkpoint({"w": w}, "a.ckpt")
    with pytest.raises(OSError, match="No space left"):  # the next save raises it, and writes nothing
        io.save_checkpoint({"w": w}, "b.ckpt")
    io.save_checkpoint({"w": w}, "c.ckpt")
    w.add_(1.0)  # training goes on: the write holds the values of the save
    io.teardown()  # waits for the last write; nothing failed since
    assert io.checkpoint_io.calls == [("failed", "a.ckpt"), ("save", "0.0")]
