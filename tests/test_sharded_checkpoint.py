"""Sharded checkpoint directories in one process: resume, ModelCheckpoint, conversion, safe loading.

A single-device strategy that opts in (``state_dict_type = "sharded"``) writes the same directories
FSDP does (torch.distributed.checkpoint without a process group), so the trainer's side is tested
here fast; the multi-rank writing and resharding are in test_sharded_checkpoint_distributed.py.
"""

from __future__ import annotations

import os
import pickle
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from callbacks import ModelCheckpoint
from strategies import SingleDeviceStrategy
from tests.helpers import REPO_ROOT, jobs
from tests.helpers.command_server import start
from tests.helpers.distributed import child_env
from tests.helpers.trainers import quiet_trainer
from trainer.checkpoint.convert import main as convert
from trainer.checkpoint.files import load_checkpoint
from trainer.checkpoint.sharded import TRAINER_STATE, load_sharded, save_sharded
from trainer.common.errors import CheckpointError

pytestmark = pytest.mark.timeout(240)


class ShardedSingle(SingleDeviceStrategy):
    """One CPU process writing sharded directories."""

    state_dict_type = "sharded"


def fit(root: Path, epochs: int, ckpt_path: str | None = None, **checkpoint: Any) -> tuple[jobs.BlockNet, Any]:
    options: dict[str, Any] = {"save_last": True, "save_top_k": 0, **checkpoint}
    module = jobs.BlockNet()
    trainer = quiet_trainer(
        root,
        [ModelCheckpoint(dirpath=root / "checkpoints", **options)],
        strategy=ShardedSingle(device="cpu"),
        enable_checkpointing=True,
        max_epochs=epochs,
    )
    trainer.fit(module, DataLoader(jobs.dataset(40), batch_size=4, shuffle=True), ckpt_path=ckpt_path)
    return module, trainer


class WithTestStep(jobs.BlockNet):
    """BlockNet with a test step (its validation step)."""

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)


def assert_equal_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> jobs.BlockNet:
    """Three uninterrupted epochs."""
    return fit(tmp_path_factory.mktemp("straight"), 3)[0]


def test_resume_from_last_directory_equals_uninterrupted_run(tmp_path: Path, straight: jobs.BlockNet) -> None:
    fit(tmp_path, 2)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert last.is_dir() and (last / TRAINER_STATE).is_file() and (last / ".metadata").is_file()
    # The trainer state is a small file read with weights_only; the tensors are in the shards only.
    trainer_state = torch.load(last / TRAINER_STATE, weights_only=True)
    assert "state_dict" not in trainer_state and "optimizer_states" not in trainer_state
    assert trainer_state["progress"]["global_step"] == 20 and len(trainer_state["rng"]) == 1
    resumed, _ = fit(tmp_path, 3, ckpt_path="last")  # "last" finds last.ckpt/
    assert_equal_weights(resumed, straight)


def test_top_k_evicts_directories_and_leaves_no_partial_ones(tmp_path: Path) -> None:
    _, trainer = fit(tmp_path, 3, save_top_k=1, monitor="train/loss_epoch", mode="max")
    cb = trainer.checkpoint_callback
    names = sorted(os.listdir(tmp_path / "checkpoints"))
    assert names == sorted([Path(cb.best_model_path).name, "last.ckpt"])  # two evicted, nothing half-written
    assert Path(cb.best_model_path).is_dir() and list(cb.best_k_models) == [cb.best_model_path]
    best = jobs.BlockNet.load_from_checkpoint(cb.best_model_path)
    assert torch.load(Path(cb.best_model_path) / TRAINER_STATE, weights_only=True)["progress"]["global_step"] > 0
    assert isinstance(best, jobs.BlockNet)


def test_async_save_writes_the_same_directory(tmp_path: Path, straight: jobs.BlockNet) -> None:
    module, _ = fit(tmp_path, 3, async_save=True)
    loaded = jobs.BlockNet.load_from_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert_equal_weights(loaded, module)
    assert_equal_weights(loaded, straight)  # training went on while writing: nothing changed


@pytest.mark.parametrize("async_", [False, True])
def test_a_save_that_cannot_rename_its_directory_into_place_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, async_: bool
) -> None:
    _, trainer = fit(tmp_path, 1)

    def refused(new: Any, path: Any) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("trainer.checkpoint.sharded.swap_in", refused)
    with pytest.raises(CheckpointError, match="Permission denied"):  # the save's own call, or the wait after it
        trainer.save_checkpoint(tmp_path / "manual.ckpt", async_=async_)
        trainer.wait_for_checkpoints()
    assert not (tmp_path / "manual.ckpt").exists()


def test_validate_test_and_load_from_checkpoint_read_a_directory(tmp_path: Path, straight: jobs.BlockNet) -> None:
    fit(tmp_path, 3)
    last = str(tmp_path / "checkpoints" / "last.ckpt")
    assert_equal_weights(jobs.BlockNet.load_from_checkpoint(last), straight)
    loader = DataLoader(jobs.dataset(37, seed=2), batch_size=5)
    expected = quiet_trainer(tmp_path / "e").validate(straight, loader)[0]
    assert quiet_trainer(tmp_path / "v").validate(jobs.BlockNet(seed=7), loader, ckpt_path=last)[0] == expected
    tested = quiet_trainer(tmp_path / "t").test(WithTestStep(seed=7), loader, ckpt_path=last)[0]
    assert tested["val/acc"] == expected["val/acc"]


def test_convert_to_file_and_back_keeps_every_value(tmp_path: Path, straight: jobs.BlockNet) -> None:
    module, trainer = fit(tmp_path, 3)
    last = tmp_path / "checkpoints" / "last.ckpt"
    file = tmp_path / "full.ckpt"
    assert convert(["to-file", str(last), str(file)]) == 0
    full = load_checkpoint(file)  # geartrain's file, weights_only
    assert all(torch.equal(full["state_dict"][k], v) for k, v in module.state_dict().items())
    expected = trainer.optimizers[0].state_dict()
    assert full["optimizer_states"][0]["param_groups"] == expected["param_groups"]
    for index, buffers in expected["state"].items():
        assert torch.equal(full["optimizer_states"][0]["state"][index]["momentum_buffer"], buffers["momentum_buffer"])
    # ... and back: the directory made from the file loads the same weights and optimizer state.
    again = tmp_path / "again.ckpt"
    assert convert(["to-dir", str(file), str(again)]) == 0
    fresh = jobs.BlockNet(seed=3)
    optimizer = fresh.configure_optimizers()
    load_sharded(again, fresh, [optimizer])
    assert_equal_weights(fresh, module)
    for index, buffers in expected["state"].items():
        assert torch.equal(optimizer.state_dict()["state"][index]["momentum_buffer"], buffers["momentum_buffer"])
    assert torch.load(again / TRAINER_STATE, weights_only=True)["progress"] == full["progress"]


def test_the_converted_file_resumes_exactly(tmp_path: Path, straight: jobs.BlockNet) -> None:
    fit(tmp_path, 2)
    file = tmp_path / "full.ckpt"
    assert convert(["to-file", str(tmp_path / "checkpoints" / "last.ckpt"), str(file)]) == 0
    module = jobs.BlockNet()
    trainer = quiet_trainer(tmp_path / "f", max_epochs=3)  # a plain single-device run, full files
    trainer.fit(module, DataLoader(jobs.dataset(40), batch_size=4, shuffle=True), ckpt_path=str(file))
    assert_equal_weights(module, straight)


class _Payload:
    """Pickles as a call to ``os.system``: what a malicious checkpoint would hold."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_malicious_metadata_pickle_is_refused_unrun(tmp_path: Path) -> None:
    fit(tmp_path, 1)
    last = tmp_path / "checkpoints" / "last.ckpt"
    marker = tmp_path / "ran"
    (last / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(CheckpointError, match=r"pickled Python objects \(posix\.system\)"):
        jobs.BlockNet.load_from_checkpoint(last)
    with pytest.raises(CheckpointError, match="refusing it"):
        quiet_trainer(tmp_path / "v").validate(
            jobs.BlockNet(), DataLoader(jobs.dataset(8), batch_size=4), ckpt_path=last
        )
    assert convert(["to-file", str(last), str(tmp_path / "x.ckpt")]) == 2
    assert not marker.exists() and not (tmp_path / "x.ckpt").exists()


def test_a_malicious_value_inside_the_shards_is_refused_unrun(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    state = {"format": "geartrain", "version": 1, "state_dict": {"w": torch.ones(2), "x": _Payload(marker)}}
    save_sharded(tmp_path / "bad.ckpt", state)  # DCP pickles non-tensor values itself
    assert convert(["to-file", str(tmp_path / "bad.ckpt"), str(tmp_path / "x.ckpt")]) == 2
    assert not marker.exists()


def test_a_malicious_trainer_state_is_refused_unrun(tmp_path: Path) -> None:
    fit(tmp_path, 1)
    last = tmp_path / "checkpoints" / "last.ckpt"
    marker = tmp_path / "ran"
    torch.save({"format": "geartrain", "version": 1, "x": _Payload(marker)}, last / TRAINER_STATE)
    with pytest.raises(CheckpointError, match="weights_only=True"):
        jobs.BlockNet.load_from_checkpoint(last)
    assert not marker.exists()


def test_kill_9_mid_save_keeps_the_previous_directory(tmp_path: Path) -> None:
    script = REPO_ROOT / "tests" / "helpers" / "sharded_kill.py"
    proc = start([str(script), str(tmp_path)], Path.cwd(), child_env())
    assert proc.stdout is not None
    lines = [proc.stdout.readline().strip(), proc.stdout.readline().strip()]
    assert lines == ["first saved", "writing"]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    last = tmp_path / "last.ckpt"
    module = torch.nn.Module()
    module.w = torch.nn.Parameter(torch.zeros(64))
    load_sharded(last, module)
    assert torch.equal(module.w.detach(), torch.full((64,), 1.0))  # the complete first save, untouched
    # The next save clears the half-written sibling and lands whole.
    save_sharded(last, {"format": "geartrain", "version": 1, "state_dict": {"w": torch.full((64,), 3.0)}})
    load_sharded(last, module)
    assert torch.equal(module.w.detach(), torch.full((64,), 3.0))
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]


def test_a_kill_between_the_two_renames_leaves_the_previous_directory_found(tmp_path: Path) -> None:
    _, first = fit(tmp_path, 2)
    last = tmp_path / "checkpoints" / "last.ckpt"
    os.replace(last, last.parent / ".last.ckpt.old")  # the state right after the first rename
    resumed, _ = fit(tmp_path / "r", 2, ckpt_path=str(last))
    assert resumed.global_step == first.global_step
    assert_equal_weights(resumed, first.lightning_module)


def test_fsdp_state_dict_type_defaults_to_sharded_and_refuses_other_values() -> None:
    from strategies import FSDPStrategy

    assert FSDPStrategy().state_dict_type == "sharded"
    assert FSDPStrategy(state_dict_type="full").state_dict_type == "full"
    with pytest.raises(ValueError, match="'sharded' or 'full', got 'distributed'"):
        FSDPStrategy(state_dict_type="distributed")


def test_a_full_run_resumes_from_a_directory_and_replaces_it_with_files(
    tmp_path: Path, straight: jobs.BlockNet
) -> None:
    """Sharded run for 2 epochs, then the same folder resumed by a plain single-device run (full files)."""
    fit(tmp_path, 2)
    module = jobs.BlockNet()
    cb = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True, save_top_k=0)
    trainer = quiet_trainer(tmp_path, [cb], enable_checkpointing=True, max_epochs=3)
    trainer.fit(module, DataLoader(jobs.dataset(40), batch_size=4, shuffle=True), ckpt_path="last")
    assert_equal_weights(module, straight)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert last.is_file() and load_checkpoint(last)["progress"]["global_step"] == 30
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["last.ckpt"]


def test_a_sharded_run_resumes_from_a_file_and_replaces_it_with_a_directory(
    tmp_path: Path, straight: jobs.BlockNet
) -> None:
    """The other way: a plain run's last.ckpt file, resumed by a sharded run in the same folder."""
    cb = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True, save_top_k=0)
    trainer = quiet_trainer(tmp_path, [cb], enable_checkpointing=True, max_epochs=2)
    trainer.fit(jobs.BlockNet(), DataLoader(jobs.dataset(40), batch_size=4, shuffle=True))
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    resumed, _ = fit(tmp_path, 3, ckpt_path="last")
    assert_equal_weights(resumed, straight)
    assert (tmp_path / "checkpoints" / "last.ckpt").is_dir()
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["last.ckpt"]


def test_save_last_link_points_at_the_newest_directory(tmp_path: Path, straight: jobs.BlockNet) -> None:
    fit(tmp_path, 2, save_last="link", save_top_k=-1)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert last.is_symlink() and last.resolve().name == "epoch=1-step=20.ckpt" and last.resolve().is_dir()
    resumed, _ = fit(tmp_path, 3, ckpt_path="last", save_last="link", save_top_k=-1)
    assert_equal_weights(resumed, straight)
    assert last.is_symlink() and last.resolve().name == "epoch=2-step=30.ckpt"
