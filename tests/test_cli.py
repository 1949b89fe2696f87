"""The ``geartrain`` command as a user runs it: errors, user projects, resume, sweeps, launchers."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import torch

from tests.helpers.cli import run_dirs, run_geartrain

pytestmark = pytest.mark.timeout(300)

QUICK = ["trainer.max_epochs=1", "trainer.enable_progress_bar=false"]


def final_metrics(stdout: str) -> dict[str, float]:
    """Parse the 'final metrics' table the command prints."""
    block = stdout.split("final metrics", 1)[1]
    return {m[1]: float(m[2]) for m in re.finditer(r"^\s+(\S+)\s+(-?[\d.]+)\s*$", block, re.MULTILINE)}


@pytest.mark.slow
def test_typo_in_a_key_fails_naming_it(tmp_path: Path) -> None:
    result = run_geartrain("trainer.max_epoch=3", cwd=tmp_path)
    assert result.returncode != 0
    assert "max_epoch" in result.stderr
    assert not list(tmp_path.glob("outputs/*/*/checkpoints"))


@pytest.mark.slow
def test_bad_value_fails_naming_the_key(tmp_path: Path) -> None:
    result = run_geartrain("trainer.max_epochs=abc", cwd=tmp_path)
    assert result.returncode != 0
    assert "trainer.max_epochs" in result.stderr
    assert "abc" in result.stderr


@pytest.mark.slow
def test_unknown_strategy_lists_the_valid_ones(tmp_path: Path) -> None:
    result = run_geartrain("strategy=foo", cwd=tmp_path)
    assert result.returncode != 0
    assert "strategy/foo" in result.stderr
    for name in ("single", "amp"):
        assert name in result.stderr


@pytest.mark.slow
def test_help_shows_groups_and_overrides(tmp_path: Path) -> None:
    result = run_geartrain("--help", cwd=tmp_path, timeout=60)
    assert result.returncode == 0
    for text in ("strategy", "optim", "experiment", "hydra/launcher", "ckpt_path=last", "--config-dir"):
        assert text in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("args", [("--help",), ("--cfg", "job"), ("task=fit", "trainer.max_epochs=1")])
def test_a_reader_that_closes_the_pipe_ends_the_command_without_a_traceback(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """``geartrain --help | head -n 12`` (the README's): the reader may leave before the page is written."""
    import os
    import subprocess
    import sys

    from tests.helpers.cli import REPO_ROOT

    read, write = os.pipe()
    os.close(read)  # the reader has left before anything is written: every write fails with EPIPE
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    try:
        result = subprocess.run(
            [sys.executable, "-m", "trainer", *args], cwd=tmp_path, env=env, stdout=write, stderr=subprocess.PIPE,
            text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(write)
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    if args[0].startswith("-"):  # printing only: the reader took what it wanted
        assert result.returncode == 0, result.stderr[-3000:]
    else:  # a job says why it stopped
        assert result.returncode == 1 and "closed it" in result.stderr, result.stderr[-3000:]


@pytest.mark.slow
def test_user_project_with_its_own_config_dir(tmp_path: Path) -> None:
    pkg = tmp_path / "my_project"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch.utils.data import DataLoader, TensorDataset
            from trainer import DataModule, TrainModule

            class Ramp(DataModule):
                def train_dataloader(self):
                    x = torch.linspace(-1, 1, 64).unsqueeze(1)
                    return DataLoader(TensorDataset(x, 3 * x), batch_size=16)

            class Line(TrainModule):
                def __init__(self, lr: float = 0.1):
                    super().__init__()
                    self.save_hyperparameters()
                    self.lr = lr
                    self.layer = torch.nn.Linear(1, 1)

                def training_step(self, batch, batch_idx):
                    x, y = batch
                    loss = torch.nn.functional.mse_loss(self.layer(x), y)
                    self.log("user/loss", loss)
                    return loss

                def configure_optimizers(self):
                    return torch.optim.SGD(self.parameters(), lr=self.lr)
            """
        )
    )
    conf = tmp_path / "my_conf"
    (conf / "model").mkdir(parents=True)
    (conf / "data").mkdir()
    (conf / "model" / "line.yaml").write_text("_target_: my_project.net.Line\nlr: 0.2\n")
    (conf / "data" / "ramp.yaml").write_text("_target_: my_project.net.Ramp\n")
    result = run_geartrain(
        "--config-dir", str(conf), "model=line", "data=ramp", "task=fit", "trainer.max_epochs=3", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["hyper_parameters"] == {"lr": 0.2}
    assert ckpt["progress"]["global_step"] == 12
    assert "user/loss" in final_metrics(result.stdout)


@pytest.mark.slow
def test_ckpt_path_last_evaluates_the_newest_run(tmp_path: Path) -> None:
    first = run_geartrain(*QUICK, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    trained = final_metrics(first.stdout)["test/acc"]
    assert trained > 0.5
    second = run_geartrain("task=test", "ckpt_path=last", "trainer.enable_progress_bar=false", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "ckpt_path=last: using" in second.stdout
    assert final_metrics(second.stdout)["test/acc"] == trained


@pytest.mark.slow
def test_sweep_gives_one_directory_per_job(tmp_path: Path) -> None:
    result = run_geartrain("-m", "optim.lr=0.01,0.003", "task=fit", *QUICK, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = run_dirs(tmp_path, "multirun/*/*/*")
    assert len(jobs) == 2
    lrs = set()
    for job in jobs:
        assert list((job / "tensorboard").glob("events.out.tfevents.*"))
        ckpt = torch.load(job / "checkpoints" / "last.ckpt", weights_only=True)
        lrs.add(ckpt["config"]["optim"]["lr"])
    assert lrs == {0.01, 0.003}


@pytest.mark.slow
def test_submitit_local_launcher_runs_a_job(tmp_path: Path) -> None:
    result = run_geartrain("-m", "hydra/launcher=local", "task=fit", *QUICK, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    # The job's output is in a file, not on the console: said in one line as the sweep starts, with where.
    (note,) = [line for line in result.stdout.splitlines() if line.startswith("hydra/launcher=local:")]
    folder = re.search(r"goes to (\S+)/<job id>/<job id>_0_log\.out", note)
    assert folder is not None, note
    (log,) = (tmp_path / folder[1]).glob("*/*_0_log.out")
    assert "final metrics" in log.read_text()
    (job,) = run_dirs(tmp_path, "multirun/*/*/*")
    assert list((job / "tensorboard").glob("events.out.tfevents.*"))
    ckpt = torch.load(job / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["progress"]["global_step"] > 0
    assert list(tmp_path.glob("multirun/*/*/.submitit"))


def test_slurm_tasks_share_a_run_directory_named_after_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.cli.app import shared_run_dir_overrides

    monkeypatch.setattr("sys.argv", ["geartrain"])
    slurm = {"SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODELIST": "gpu[03-04]", "SLURM_JOB_ID": "777"}
    rank0 = shared_run_dir_overrides({**slurm, "SLURM_PROCID": "0"})
    rank3 = shared_run_dir_overrides({**slurm, "SLURM_PROCID": "3"})
    assert rank0 == ["hydra.run.dir=outputs/slurm-777"]
    assert rank3[0] == rank0[0] and "hydra.output_subdir=null" in rank3
    assert shared_run_dir_overrides({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) == []
    assert shared_run_dir_overrides({}) == []


def test_ckpt_path_last_on_the_first_start_trains_from_scratch(tmp_path: Path) -> None:
    """A preemptible job's script passes ckpt_path=last on every start: the first one trains afresh, then resumes."""
    quick = ("trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "logger=none")
    first = run_geartrain("task=fit", "ckpt_path=last", *quick, *QUICK[1:], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "ckpt_path=last is set, but there is no last checkpoint available: training starts from scratch" in (
        first.stderr
    )
    second = run_geartrain("task=fit", "ckpt_path=last", *quick, "trainer.max_epochs=2", *QUICK[1:], cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "ckpt_path=last: resuming" in second.stdout and "no last checkpoint" not in second.stderr
