"""Exact resume, preemption and safe checkpoints, with real processes killed for real."""

from __future__ import annotations

import errno
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import trainer.checkpoint as ckpt_io
from tests.helpers import REPO_ROOT
from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule
from trainer.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

JOB = REPO_ROOT / "tests" / "helpers" / "resume_job.py"

pytestmark = pytest.mark.timeout(240)


def start(out: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, str(JOB), str(out), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def run_to_end(out: Path, *args: str) -> str:
    proc = start(out, *args)
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr[-3000:]
    assert "DONE" in stdout
    return stdout


def run_until(out: Path, line: str, *args: str, sig: int = signal.SIGKILL) -> subprocess.Popen[str]:
    """Start the job and send ``sig`` as soon as it prints ``line``; return the finished process."""
    proc = start(out, *args)
    assert proc.stdout is not None
    for text in proc.stdout:
        if text.strip() == line:
            proc.send_signal(sig)
            break
    else:
        proc.wait(timeout=60)
        pytest.fail(f"the job ended before printing {line!r}: {proc.stderr.read() if proc.stderr else ''}")
    proc.wait(timeout=60)
    return proc


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    weights: dict[str, torch.Tensor] = torch.load(out / "final.pt", weights_only=True)
    return weights


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs after resume"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, torch.Tensor]]:
    """Final weights of uninterrupted runs, by number of DataLoader workers."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for workers in ("0", "2"):
        path = tmp_path_factory.mktemp(f"whole{workers}")
        run_to_end(path, "--workers", workers, "--delay", "0")
        out[workers] = final_weights(path)
    return out


@pytest.mark.parametrize("workers", ["0", "2"])
def test_kill_9_at_five_points_then_resume_is_exact(
    tmp_path: Path, workers: str, uninterrupted: dict[str, dict[str, torch.Tensor]]
) -> None:
    # Mid-epoch, right after a mid-epoch validation, right after the end-of-epoch validation, and
    # later mid-epoch points; each at least two steps after the previous one (a kill may land a step late).
    kill_points = ["STEP 3", "VAL 8", "VAL 10", "STEP 15", "VAL 18", "STEP 24"]
    for n, point in enumerate(kill_points):
        args = ["--workers", workers, "--delay", "0.1"] + (["--resume"] if n else [])
        proc = run_until(tmp_path, point, *args)
        assert proc.returncode == -signal.SIGKILL
        state = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
        assert state["progress"]["global_step"] >= int(point.split()[1]) - 1
    run_to_end(tmp_path, "--workers", workers, "--resume")
    assert_same_weights(final_weights(tmp_path), uninterrupted[workers])


def test_sigterm_saves_exits_0_and_resumes_exactly(
    tmp_path: Path, uninterrupted: dict[str, dict[str, torch.Tensor]]
) -> None:
    proc = run_until(tmp_path, "STEP 7", sig=signal.SIGTERM)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    state = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert 7 <= state["progress"]["global_step"] < 30
    assert state["progress"]["batch_in_epoch"] == state["progress"]["global_step"]  # mid-epoch 0
    run_to_end(tmp_path, "--resume")
    assert_same_weights(final_weights(tmp_path), uninterrupted["0"])


def test_sigusr1_under_slurm_requeues(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "scontrol.args"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" > {record}\n')
    scontrol.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}
    proc = subprocess.Popen(
        [sys.executable, str(JOB), str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    for text in proc.stdout:
        if text.strip() == "STEP 2":
            proc.send_signal(signal.SIGUSR1)
            break
    proc.wait(timeout=60)
    assert proc.returncode == 0
    assert record.read_text().split() == ["requeue", "4242"]
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


def test_kill_9_during_a_checkpoint_write_keeps_the_previous_one(tmp_path: Path) -> None:
    proc = start(tmp_path, "--slow-save", "--delay", "0")
    assert proc.stdout is not None
    writes = 0
    for text in proc.stdout:
        if text.strip() == "WRITING":
            writes += 1
            if writes == 3:  # two complete checkpoints were written before this one
                proc.kill()
                break
    proc.wait(timeout=60)
    assert writes == 3
    last = tmp_path / "checkpoints" / "last.ckpt"
    state = load_checkpoint(last)  # the previous, complete file
    assert state["progress"]["global_step"] == 2
    partial = [p for p in last.parent.iterdir() if p.name != "last.ckpt"]
    assert partial, "the interrupted write should have left its temporary file"
    assert all(p.name.startswith(".last.ckpt.") and p.name.endswith(".tmp") for p in partial)
    with pytest.raises(CheckpointError):
        load_checkpoint(partial[0])


# ----------------------------------------------------------------- bad checkpoints, in process
class Small(TrainModule):
    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.layer = nn.Linear(3, width)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.fixture
def good_ckpt(tmp_path: Path) -> Path:
    module = Small()
    trainer = quiet_trainer(tmp_path, strategy="auto", num_sanity_val_steps=2, enable_checkpointing=True, max_steps=2)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 3)), batch_size=4)
    trainer.fit(module, data)
    path = tmp_path / "checkpoints" / "last.ckpt"
    assert path.is_file()
    return path


def evaluate_with(tmp_path: Path, path: Path, module: TrainModule | None = None) -> None:
    trainer = quiet_trainer(tmp_path / "eval", strategy="auto", num_sanity_val_steps=2, enable_checkpointing=True)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 3)), batch_size=4)
    trainer.fit(module or Small(), data, ckpt_path=path)


def test_truncated_checkpoint(tmp_path: Path, good_ckpt: Path) -> None:
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(good_ckpt.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        load_checkpoint(cut)


def test_random_bytes(tmp_path: Path) -> None:
    noise = tmp_path / "noise.ckpt"
    noise.write_bytes(os.urandom(4096))
    with pytest.raises(CheckpointError, match="not a readable torch file"):
        load_checkpoint(noise)


def test_not_a_geartrain_checkpoint(tmp_path: Path) -> None:
    plain = tmp_path / "plain.pt"
    torch.save({"weight": torch.zeros(2)}, plain)
    with pytest.raises(CheckpointError, match="not a geartrain checkpoint"):
        load_checkpoint(plain)


def test_newer_format_version(tmp_path: Path, good_ckpt: Path) -> None:
    state = torch.load(good_ckpt, weights_only=True)
    state["version"] = ckpt_io.FORMAT_VERSION + 1
    newer = tmp_path / "newer.ckpt"
    torch.save(state, newer)
    with pytest.raises(CheckpointError, match="newer than this geartrain reads"):
        load_checkpoint(newer)


def test_checkpoint_of_a_different_model_lists_keys_and_shapes(tmp_path: Path, good_ckpt: Path) -> None:
    with pytest.raises(CheckpointError) as info:
        evaluate_with(tmp_path, good_ckpt, Small(width=5))
    assert "shape mismatches" in str(info.value)
    assert "layer.weight: checkpoint (4, 3) vs model (5, 3)" in str(info.value)

    class Renamed(Small):
        def __init__(self) -> None:
            super().__init__()
            self.extra = nn.Linear(1, 1)

    with pytest.raises(CheckpointError) as info:
        evaluate_with(tmp_path, good_ckpt, Renamed())
    assert "missing keys (2): extra.bias, extra.weight" in str(info.value)


class Payload:
    """Creates a file when unpickled: what a malicious checkpoint would do."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.target}",))


def test_malicious_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    evil = tmp_path / "evil.ckpt"
    with evil.open("wb") as f:
        pickle.dump({"format": "geartrain", "version": 1, "state_dict": Payload(target)}, f)
    with pytest.raises(CheckpointError, match="refusing"):
        load_checkpoint(evil)
    torch.save({"format": "geartrain", "version": 1, "x": Payload(target)}, tmp_path / "evil2.ckpt")
    with pytest.raises(CheckpointError, match="refusing"):
        load_checkpoint(tmp_path / "evil2.ckpt")
    assert not target.exists()


@pytest.fixture
def disk_full(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch.save writes a little, then fails as a full disk does."""

    def failing_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        f.write(b"partial bytes")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt_io.torch, "save", failing_save)
    yield


def test_disk_full_keeps_the_previous_checkpoint(tmp_path: Path, good_ckpt: Path, disk_full: None) -> None:
    before = good_ckpt.read_bytes()
    files_before = sorted(p.name for p in good_ckpt.parent.iterdir())
    with pytest.raises(CheckpointError, match="No space left on device"):
        save_checkpoint({"format": "geartrain"}, good_ckpt)
    assert good_ckpt.read_bytes() == before
    assert sorted(p.name for p in good_ckpt.parent.iterdir()) == files_before  # no temporary file left


# ----------------------------------------------------------------- non-finite losses
class SpikyModule(Small):
    """Loss is NaN for the batches listed in ``bad``."""

    def __init__(self, bad: set[int]) -> None:
        super().__init__()
        self.bad = bad

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if batch_idx in self.bad else loss


def nan_data() -> torch.utils.data.DataLoader[Any]:
    g = torch.Generator().manual_seed(3)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(24, 3, generator=g)), batch_size=4)


def test_nonfinite_raise_names_epoch_step_and_batch() -> None:
    with pytest.raises(FloatingPointError, match=r"epoch 0, global step 2, batch 2"):
        quiet_trainer(strategy="auto", num_sanity_val_steps=2, max_epochs=1, on_nonfinite="raise").fit(
            SpikyModule({2}), nan_data()
        )


def test_nonfinite_skip_drops_exactly_that_step() -> None:
    torch.manual_seed(0)
    module = SpikyModule({2, 4})
    reference = Small()
    reference.load_state_dict(module.state_dict())
    trainer = quiet_trainer(strategy="auto", num_sanity_val_steps=2, max_epochs=1, on_nonfinite="skip")
    trainer.fit(module, nan_data())
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for i, (x,) in enumerate(nan_data()):
        if i in (2, 4):
            continue
        opt.zero_grad()
        reference.layer(x).pow(2).mean().backward()
        opt.step()
    for a, b in zip(module.parameters(), reference.parameters()):
        assert torch.equal(a, b)
    assert trainer.global_step == 4
    assert trainer.progress.nonfinite_skipped == 2
    assert float(trainer.callback_metrics["train/nonfinite_skipped"]) == 2.0


def test_nonfinite_skip_gives_up_after_too_many_in_a_row() -> None:
    with pytest.raises(FloatingPointError, match="3 optimizer steps in a row"):
        quiet_trainer(
            strategy="auto", num_sanity_val_steps=2, max_epochs=1, on_nonfinite="skip", max_nonfinite_in_a_row=3
        ).fit(SpikyModule({1, 2, 3}), nan_data())


# ----------------------------------------------------------------- DDP: 2 processes over gloo
DDP = ["--strategy", "ddp", "--devices", "2"]


def kill_group_at(out: Path, line: str, *args: str) -> None:
    """Start the job in its own process group and SIGKILL the whole group (launcher and workers)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(JOB), str(out), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        for text in proc.stdout:
            if text.strip() == line:
                break
        else:
            pytest.fail(f"the DDP job ended before printing {line!r}")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def ddp_whole(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """Final weights of an uninterrupted 2-process DDP run."""
    whole = tmp_path_factory.mktemp("ddp_whole")
    run_to_end(whole, *DDP, "--delay", "0")
    return final_weights(whole)


@pytest.mark.timeout(420)
def test_ddp_kill_9_at_five_points_then_resume_is_exact(tmp_path: Path, ddp_whole: dict[str, torch.Tensor]) -> None:
    run = tmp_path / "run"
    # Each rank sees 5 batches per epoch (15 steps): validation after batches 4 and 5 of each epoch.
    for n, point in enumerate(["STEP 2", "VAL 4", "STEP 7", "VAL 10", "STEP 13"]):
        kill_group_at(run, point, *DDP, "--delay", "0.1", *(["--resume"] if n else []))
    run_to_end(run, *DDP, "--resume")
    assert_same_weights(final_weights(run), ddp_whole)


@pytest.mark.timeout(300)
def test_ddp_sigterm_to_the_launcher_saves_on_every_rank_and_exits_0(
    tmp_path: Path, ddp_whole: dict[str, torch.Tensor]
) -> None:
    proc = run_until(tmp_path, "STEP 4", *DDP, "--delay", "0.1", sig=signal.SIGTERM)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    state = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert 4 <= state["progress"]["global_step"] < 15
    assert len(state["rng"]) == 2  # both ranks' random states
    run_to_end(tmp_path, *DDP, "--resume")
    assert_same_weights(final_weights(tmp_path), ddp_whole)


@pytest.mark.timeout(300)
def test_elastic_restart_resumes_from_the_last_checkpoint(tmp_path: Path, ddp_whole: dict[str, torch.Tensor]) -> None:
    run = tmp_path / "run"
    out = run_to_end(run, *DDP, "--max-restarts", "1", "--crash-rank-1-at", "7")
    steps = [int(line.split()[1]) for line in out.splitlines() if line.startswith("STEP")]
    assert steps.count(7) >= 1 and steps[-1] == 15
    assert "restart 1: resuming from" in out, "the group should have restarted from the last checkpoint"
    assert sorted(set(steps)) == list(range(1, 16))
    assert_same_weights(final_weights(run), ddp_whole)


@pytest.mark.timeout(240)
def test_amp_kill_9_then_resume_is_exact(tmp_path: Path) -> None:
    """bf16 autocast (AMP's CPU default) resumes bit for bit too."""
    amp = ["--strategy", "amp"]
    whole = tmp_path / "whole"
    run_to_end(whole, *amp, "--delay", "0")
    run = tmp_path / "run"
    for n, point in enumerate(["STEP 6", "VAL 18"]):
        proc = run_until(run, point, *amp, "--delay", "0.1", *(["--resume"] if n else []))
        assert proc.returncode == -signal.SIGKILL
    run_to_end(run, *amp, "--resume")
    assert_same_weights(final_weights(run), final_weights(whole))


def test_ranks_agree_on_preemption_about_every_half_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agreement collective carries [signal, proposed interval]; every rank takes the maximum of each."""
    import trainer.trainer as trainer_module
    from strategies import SingleDeviceStrategy
    from trainer.loops import PREEMPT_CHECK_MAX_STEPS, PREEMPT_CHECK_SECONDS

    other_rank = torch.tensor([0, 0])  # what the other rank puts in

    class TwoRanks(SingleDeviceStrategy):
        @property
        def world_size(self) -> int:
            return 2

        def reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
            assert op == "max"
            return torch.maximum(tensor, other_rank)

    clock = [100.0]
    monkeypatch.setattr(trainer_module.time, "monotonic", lambda: clock[0])
    trainer = quiet_trainer(strategy=TwoRanks(device="cpu"), num_sanity_val_steps=2, enable_checkpointing=True)
    trainer._install_preemption_handlers()
    trainer._restore_signal_handlers()
    try:
        assert trainer._preempt_agree
        assert not trainer._preemption_requested()
        assert trainer._next_preempt_check == 1  # the first agreement measures nothing yet: next step
        trainer.progress.global_step, clock[0] = 51, 101.0  # 50 steps in one second
        assert not trainer._preemption_requested()
        assert trainer._next_preempt_check == 51 + int(50 * PREEMPT_CHECK_SECONDS)
        other_rank[1] = 400  # the other rank measured faster steps: the larger proposal wins
        trainer.progress.global_step, clock[0] = 101, 102.0
        assert not trainer._preemption_requested()
        assert trainer._next_preempt_check == 101 + 400
        trainer.progress.global_step, clock[0] = 10**6, 102.5  # absurdly fast: capped
        other_rank[:] = torch.tensor([int(signal.SIGTERM), 0])  # and the signal reached only the other rank
        assert trainer._preemption_requested()
        assert trainer._preempt_signal == signal.SIGTERM
        assert trainer._next_preempt_check == 10**6 + PREEMPT_CHECK_MAX_STEPS
    finally:
        trainer._restore_signal_handlers()


def test_python_rng_state_is_one_tensor_and_older_list_checkpoints_still_restore() -> None:
    import random

    from trainer.checkpoint import rng_state, set_rng_state

    random.seed(3)
    state = rng_state()
    expected = [random.random() for _ in range(3)]
    assert isinstance(state["python"][1], torch.Tensor) and state["python"][1].dtype == torch.int64
    set_rng_state(state)
    assert [random.random() for _ in range(3)] == expected
    old_format = {**state, "python": [state["python"][0], state["python"][1].tolist(), state["python"][2]]}
    set_rng_state(old_format)
    assert [random.random() for _ in range(3)] == expected
