"""Faults of a DDP run whose processes the strategy started itself: signals, the grace period, requeue, refusals.

The exit status tells the truth: 0 only when the run finished or a preemption checkpoint was saved;
a signal that the workers could not act on in time ends the launcher with ``Interrupted`` (the
``geartrain`` command: ``128 + signal``), naming the newest checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest
import torch

from strategies import DDPStrategy
from strategies.launch import check_slurm_launched
from tests.helpers import REPO_ROOT
from tests.helpers.command_server import Started, start
from tests.helpers.distributed import child_env, group_members
from trainer import Trainer
from trainer.common.errors import UserError

JOB = textwrap.dedent(
    '''
    """A tiny DDP job: python job.py ROOT MAX_STEPS STEP_SECONDS GRACE [resume]."""
    import sys, time
    from pathlib import Path
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from strategies import DDPStrategy
    from trainer import Trainer, TrainModule

    class Net(TrainModule):
        def __init__(self, root, seconds):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.root, self.seconds = root, seconds

        def training_step(self, batch, batch_idx):
            if self.global_step >= 2 and self.trainer.global_rank == 0:
                (Path(self.root) / "training").touch()  # the test's cue: the handlers are in place
            time.sleep(self.seconds if self.global_step >= 2 else 0.05)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def test_step(self, batch, batch_idx):
            (Path(self.root) / "testing").touch()
            time.sleep(0.5)

        def test_dataloader(self):
            return self.train_dataloader()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

        def train_dataloader(self):
            x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
            return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)

    if __name__ == "__main__":
        root, steps, seconds, grace = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
        torch.manual_seed(0)
        net = Net(root, seconds)
        trainer = Trainer(
            strategy=DDPStrategy(devices=2, device="cpu", preemption_grace_period=grace),
            max_steps=steps,
            default_root_dir=root,
            enable_progress_bar=False,
            logger=False,
            enable_model_summary=False,
            slurm_requeue=True,
            preemption_exit_code=None if "return" in sys.argv else 0,
        )
        trainer.fit(net, ckpt_path="last" if "resume" in sys.argv else None)
        if "test" in sys.argv:
            trainer.test(net, verbose=False)
        torch.save(net.state_dict(), Path(root) / "final.pt")
        print(f"fit returned: step {trainer.global_step}, preempted {trainer.preempted}, "
              f"last {trainer.checkpoint_callback.last_model_path}", flush=True)
    '''
)

STEPS = 40  # far more than a signal after step 2 lets run


def start_job(root: Path, *extra: str, seconds: float = 0.05, grace: float = 20, **env: str) -> Started:
    root.mkdir(parents=True, exist_ok=True)
    script = root / "job.py"
    script.write_text(JOB)
    # Its own process group: "signal the group" reaches the workers too.
    argv = [str(script), str(root), str(STEPS), str(seconds), str(grace), *extra]
    return start(argv, REPO_ROOT, child_env(**env), merge=True, new_session=True)


def wait_training(proc: Started, root: Path) -> None:
    deadline = time.monotonic() + 120
    while not (root / "training").exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the job did not start training"
        time.sleep(0.1)


def finish(proc: Started, timeout: float = 120) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
        deadline = time.monotonic() + 5  # multiprocessing's resource tracker may still be on its way out
        while (leftovers := group_members(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert not leftovers, f"processes outlived the run: {leftovers}\n{out}"  # no worker is left behind
    return out


def saved_step(root: Path) -> int:
    state = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)
    return int(state["progress"]["global_step"])


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sigterm_to_the_launcher_saves_and_the_resumed_run_equals_an_uninterrupted_one(tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    whole = start_job(reference)  # the uninterrupted run goes on beside the interrupted one
    try:
        interrupted = tmp_path / "interrupted"
        proc = start_job(interrupted)
        wait_training(proc, interrupted)
        os.kill(proc.pid, signal.SIGTERM)
        out = finish(proc)
        assert proc.returncode == 0, out  # preemption_exit_code=0: a complete preemption checkpoint
        step = saved_step(interrupted)
        assert 2 <= step < STEPS
        resumed = start_job(interrupted, "resume")
        out = finish(resumed)
        assert resumed.returncode == 0, out
        assert f"step {STEPS}" in out
        out = finish(whole)
        assert whole.returncode == 0, out
        a = torch.load(interrupted / "final.pt", weights_only=True)
        b = torch.load(reference / "final.pt", weights_only=True)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(whole.pid, signal.SIGKILL)  # a failure above leaves no reference run behind
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_whole_process_group_saves_on_every_rank(tmp_path: Path, sig: signal.Signals) -> None:
    proc = start_job(tmp_path, "return")
    wait_training(proc, tmp_path)
    os.killpg(proc.pid, sig)  # as a terminal's Ctrl-C or a closed terminal: launcher and workers alike
    out = finish(proc)
    assert proc.returncode == 0, out
    # preemption_exit_code=None: fit returns, and the caller's trainer holds the saved state.
    step = saved_step(tmp_path)
    assert f"fit returned: step {step}, preempted True, last {tmp_path / 'checkpoints' / 'last.ckpt'}" in out
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    final = torch.load(tmp_path / "final.pt", weights_only=True)
    assert all(torch.equal(saved[k], final[k]) for k in final)  # the caller's module holds the saved weights


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigusr1_to_the_launcher_saves_and_requeues_through_scontrol(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "scontrol.args"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" > {record}\n')
    scontrol.chmod(0o755)
    proc = start_job(tmp_path, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SLURM_JOB_ID="4242")
    wait_training(proc, tmp_path)
    os.kill(proc.pid, signal.SIGUSR1)
    out = finish(proc)
    assert proc.returncode == 0, out  # not 138: the launcher no longer dies of SIGUSR1
    assert 2 <= saved_step(tmp_path) < STEPS
    assert record.read_text().split() == ["requeue", "4242"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_step_longer_than_the_grace_period_exits_nonzero_naming_the_checkpoint(tmp_path: Path) -> None:
    # A third step of 60 s, a grace period of 0.5 s: the step in progress cannot finish; nothing saved yet.
    proc = start_job(tmp_path, seconds=60, grace=0.5)
    wait_training(proc, tmp_path)
    started = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    out = finish(proc)
    assert time.monotonic() - started < 30  # the step was abandoned, not waited for
    assert proc.returncode != 0, out
    assert "Interrupted" in out and "grace period (0.5 s" in out, out
    assert f"no checkpoint was saved in {tmp_path / 'checkpoints'}" in out


def test_slurm_variables_without_srun_are_refused_at_once(
    monkeypatch: pytest.MonkeyPatch, clean_distributed_env: None
) -> None:
    # clean_distributed_env: reading the Slurm variables sets MASTER_ADDR, RANK, WORLD_SIZE, ...; they must
    # not leak into later tests' subprocesses (which would then wait to join a group at n1).
    batch_shell = {"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_JOB_ID": "7", "SLURM_NODELIST": "n1"}
    for key in ("TORCHELASTIC_RUN_ID", "SLURM_STEP_ID", "SLURM_STEPID", "RANK", "WORLD_SIZE", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in batch_shell.items():
        monkeypatch.setenv(key, value)
    started = time.monotonic()
    with pytest.raises(UserError, match=r"not started by srun.*srun python.*SLURM_NTASKS=1"):
        DDPStrategy(device="cpu").setup_environment()
    assert time.monotonic() - started < 5
    check_slurm_launched({**batch_shell, "SLURM_STEP_ID": "0"})  # a task srun started: joins
    check_slurm_launched({**batch_shell, "SLURM_NTASKS": "1"})  # one task: nothing to join


def test_more_processes_than_the_machine_holds_are_refused_before_any_starts() -> None:
    cores = os.cpu_count() or 1
    trainer = Trainer(strategy=DDPStrategy(devices=1000, device="cpu"), max_steps=1, logger=False)
    with pytest.raises(UserError, match=rf"devices=1000: too many processes for this machine's {cores} CPU"):
        trainer.strategy.launch(lambda: None)


@pytest.mark.parametrize("bad", [-1, 0, float("nan"), float("inf")])
def test_impossible_timeouts_name_the_option_and_the_range(bad: float) -> None:
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        DDPStrategy(device="cpu", timeout=bad)
    with pytest.raises(ValueError, match="preemption_grace_period must be a number of seconds >= 0"):
        DDPStrategy(device="cpu", preemption_grace_period=-1)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_during_test_after_fit_reports_the_interrupt(tmp_path: Path) -> None:
    proc = start_job(tmp_path, "test")  # fit to STEPS, then test with slow steps
    deadline = time.monotonic() + 200
    while not (tmp_path / "testing").exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the job did not start testing"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    out = finish(proc)
    assert proc.returncode != 0
    assert "TypeError" not in out, out  # was: 'NoneType' object is not iterable
    assert "Interrupted: the launcher received SIGINT" in out, out
    assert f"the newest checkpoint is {tmp_path / 'checkpoints'}" in out, out
