"""Exact resume and preemption, with real processes killed for real (kill -9, SIGTERM, SIGUSR1, DDP).

Bad checkpoint files are in test_checkpoint_errors.py, non-finite losses in test_trainer_nonfinite.py.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO_ROOT, resume_job
from tests.helpers.command_server import Started
from tests.helpers.command_server import start as served
from tests.helpers.forked import ForkedJob, start_forked
from tests.helpers.trainers import quiet_trainer
from trainer.checkpoint.files import CheckpointError, load_checkpoint

JOB = REPO_ROOT / "tests" / "helpers" / "resume_job.py"

pytestmark = pytest.mark.timeout(240)


def start(out: Path, *args: str) -> Started | ForkedJob:
    """The job in a process of its own: forked from this one (imports paid once), or under DDP from the
    command server (its launcher re-runs the script, which a fork of pytest cannot)."""
    if "ddp" not in args:
        return start_forked(resume_job.main, [str(out), *args])
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    return served([str(JOB), str(out), *args], Path.cwd(), env)


def run_to_end(out: Path, *args: str) -> str:
    return finish(start(out, *args))


def finish(proc: Started | ForkedJob) -> str:
    """Wait for a job started by :func:`start` to end well; its output."""
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr[-3000:]
    assert "DONE" in stdout
    return stdout


def run_until(out: Path, line: str, *args: str, sig: int = signal.SIGKILL) -> Started | ForkedJob:
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
    paths = {workers: tmp_path_factory.mktemp(f"whole{workers}") for workers in ("0", "2")}
    running = {workers: start(path, "--workers", workers, "--delay", "0") for workers, path in paths.items()}
    for proc in running.values():  # both at once
        finish(proc)
    return {workers: final_weights(path) for workers, path in paths.items()}


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "2"])
def test_kill_9_at_five_points_then_resume_is_exact(
    tmp_path: Path, workers: str, uninterrupted: dict[str, dict[str, torch.Tensor]]
) -> None:
    # Mid-epoch, right after a mid-epoch validation, at the epoch's last batch, right after the first
    # validation of an epoch, and later points; each at least two steps after the previous one (a
    # kill may land a step late). Validation draws random numbers, which the run goes on from (as
    # Lightning's), and every kill lands before or after one: the resumed run must draw the same.
    kill_points = ["STEP 3", "VAL 8", "STEP 10", "VAL 14", "VAL 18", "STEP 24"]
    for n, point in enumerate(kill_points):
        args = ["--workers", workers, "--delay", "0.1"] + (["--resume"] if n else [])
        proc = run_until(tmp_path, point, *args)
        assert proc.returncode == -signal.SIGKILL
        state = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
        assert state["progress"]["global_step"] >= int(point.split()[1]) - 1
    run_to_end(tmp_path, "--workers", workers, "--resume")
    assert_same_weights(final_weights(tmp_path), uninterrupted[workers])


@pytest.mark.slow
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


@pytest.mark.slow
def test_sigusr1_under_slurm_requeues(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "scontrol.args"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" > {record}\n')
    scontrol.chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}
    proc = start_forked(resume_job.main, [str(tmp_path / "run")], env=env)
    assert proc.stdout is not None
    for text in proc.stdout:
        if text.strip() == "STEP 2":
            proc.send_signal(signal.SIGUSR1)
            break
    proc.wait(timeout=60)
    assert proc.returncode == 0
    assert record.read_text().split() == ["requeue", "4242"]
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
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


# ----------------------------------------------------------------- DDP: 2 processes over gloo
DDP = ["--strategy", "ddp", "--devices", "2"]


def kill_group_at(out: Path, line: str, *args: str) -> None:
    """Start the job in its own process group and SIGKILL the whole group (launcher and workers)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    proc = served([str(JOB), str(out), *args], Path.cwd(), env, new_session=True)
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


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_ddp_kill_9_at_five_points_then_resume_is_exact(tmp_path: Path, ddp_whole: dict[str, torch.Tensor]) -> None:
    run = tmp_path / "run"
    # Each rank sees 5 batches per epoch (15 steps): validation after batch 4 of each epoch (steps 4, 9, 14).
    for n, point in enumerate(["STEP 2", "VAL 4", "STEP 7", "VAL 9", "STEP 13"]):
        kill_group_at(run, point, *DDP, "--delay", "0.1", *(["--resume"] if n else []))
    run_to_end(run, *DDP, "--resume")
    assert_same_weights(final_weights(run), ddp_whole)


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_elastic_restart_resumes_from_the_last_checkpoint(tmp_path: Path, ddp_whole: dict[str, torch.Tensor]) -> None:
    run = tmp_path / "run"
    out = run_to_end(run, *DDP, "--max-restarts", "1", "--crash-rank-1-at", "7")
    steps = [int(line.split()[1]) for line in out.splitlines() if line.startswith("STEP")]
    assert steps.count(7) >= 1 and steps[-1] == 15
    assert "restart 1: resuming from" in out, "the group should have restarted from the last checkpoint"
    assert sorted(set(steps)) == list(range(1, 16))
    assert_same_weights(final_weights(run), ddp_whole)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_amp_kill_9_then_resume_is_exact(tmp_path: Path) -> None:
    """bf16 autocast (AMP's CPU default) resumes bit for bit too."""
    amp = ["--strategy", "amp"]
    whole = tmp_path / "whole"
    reference = start(whole, *amp, "--delay", "0")  # beside the interrupted runs
    run = tmp_path / "run"
    for n, point in enumerate(["STEP 6", "VAL 18"]):
        proc = run_until(run, point, *amp, "--delay", "0.1", *(["--resume"] if n else []))
        assert proc.returncode == -signal.SIGKILL
    run_to_end(run, *amp, "--resume")
    finish(reference)
    assert_same_weights(final_weights(run), final_weights(whole))


def test_ranks_agree_on_preemption_about_every_half_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agreement collective carries [signal, proposed interval]; every rank takes the maximum of each."""
    import trainer.preemption as preemption_module
    from strategies import SingleDeviceStrategy
    from trainer.preemption import PREEMPT_CHECK_MAX_STEPS, PREEMPT_CHECK_SECONDS

    other_rank = torch.tensor([0, 0])  # what the other rank puts in

    class TwoRanks(SingleDeviceStrategy):
        @property
        def world_size(self) -> int:
            return 2

        def reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
            assert op == "max"
            return torch.maximum(tensor, other_rank)

    clock = [100.0]
    monkeypatch.setattr(preemption_module.time, "monotonic", lambda: clock[0])
    trainer = quiet_trainer(strategy=TwoRanks(device="cpu"), num_sanity_val_steps=2, enable_checkpointing=True)
    preemption = trainer.preemption
    preemption.install(trainer.strategy)
    preemption.restore()
    try:
        assert preemption.agree
        assert not preemption.requested(trainer.global_step)
        assert preemption.next_check == 1  # the first agreement measures nothing yet: next step
        trainer.progress.global_step, clock[0] = 51, 101.0  # 50 steps in one second
        assert not preemption.requested(trainer.global_step)
        assert preemption.next_check == 51 + int(50 * PREEMPT_CHECK_SECONDS)
        other_rank[1] = 400  # the other rank measured faster steps: the larger proposal wins
        trainer.progress.global_step, clock[0] = 101, 102.0
        assert not preemption.requested(trainer.global_step)
        assert preemption.next_check == 101 + 400
        trainer.progress.global_step, clock[0] = 10**6, 102.5  # absurdly fast: capped
        other_rank[:] = torch.tensor([int(signal.SIGTERM), 0])  # and the signal reached only the other rank
        assert preemption.requested(trainer.global_step)
        assert preemption.signal == signal.SIGTERM
        assert preemption.next_check == 10**6 + PREEMPT_CHECK_MAX_STEPS
    finally:
        preemption.restore()
