"""``strategy="ddp"`` as Lightning's: the caller is rank 0, the other ranks run the script again.

Nothing is pickled, so what ``ddp_spawn`` cannot carry (lambdas, a logger already used, open files)
trains; the result equals one process; the caller holds rank 0's own state after ``fit``; where no
script can run again the strategy refuses before any process starts; under Hydra every rank of a
job writes into the job's one run directory, also in a sweep.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import REPO_ROOT, command_server
from tests.helpers.cli import run_dirs, run_geartrain
from tests.helpers.distributed import Finished, child_env, run_in_session, run_python

pytestmark = pytest.mark.slow  # every test here starts processes

SCRIPT = str(REPO_ROOT / "tests" / "helpers" / "relaunch_script.py")


def _weights(root: Path) -> dict[str, torch.Tensor]:
    return torch.load(root / "weights.pt", weights_only=True)


def _assert_equal(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:  # the DDP-equals-one-process pattern of test_strategies_distributed
        torch.testing.assert_close(actual[key], expected[key], atol=1e-6, rtol=0, msg=key)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    root = tmp_path_factory.mktemp("one")
    result = run_python([SCRIPT, "--root", str(root), "--devices", "1", "--batch", "8"], timeout=120)
    assert result.returncode == 0, result.stderr
    return _weights(root)


@pytest.mark.timeout(180)
def test_ddp_reruns_the_script_with_lambdas_and_a_used_logger_and_equals_one_process(
    tmp_path: Path, one_process: dict[str, torch.Tensor]
) -> None:
    # A new interpreter, not a fork of the command server: how the caller's process ends is under test too.
    command = [sys.executable, SCRIPT, "--root", str(tmp_path), "--devices", "2", "--batch", "4"]
    result = run_in_session(command, REPO_ROOT, child_env(), timeout=150, fresh=True)
    assert result.returncode == 0, result.stderr
    assert result.leftovers == []
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["world_size"] == 2 and report["global_step"] == 16
    # The caller trained as rank 0 itself: its module, not a copy adopted from another process.
    assert report["trained_here"] and report["module_matches_last_ckpt"]
    assert (tmp_path / "rank-0").read_text() != (tmp_path / "rank-1").read_text()  # two processes ran the script
    for rank in (0, 1):
        # Files left open in reference cycles are finalized at each rank's exit, as in one process: a plain
        # file is flushed, a callback's gzip file and zip archive are written whole (their ends included).
        assert (tmp_path / f"unclosed-{rank}.txt").read_text() == "line\n" * 50
        steps = [f"step {step}" for step in range(1, 17)]
        with gzip.open(tmp_path / f"steps-{rank}.gz", "rt") as archive:
            assert archive.read().split("\n")[:-1] == steps
        with zipfile.ZipFile(tmp_path / f"steps-{rank}.zip") as archive:
            assert archive.namelist() == [f"step-{step}.txt" for step in range(1, 17)]
    # Nothing of ours speaks at the end (a deprecation warning from an exit hook, say).
    assert "Warning" not in result.stderr, result.stderr[-3000:]
    _assert_equal(_weights(tmp_path), one_process)
    assert not torch.equal(one_process["net.0.weight"], torch.zeros_like(one_process["net.0.weight"]))


@pytest.mark.timeout(120)
def test_python_c_is_refused_before_any_process_starts() -> None:
    code = textwrap.dedent(
        """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        from tests.helpers.relaunch_script import LambdaNet
        from trainer import Trainer
        x = torch.randn(8, 6)
        Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=1, logger=False).fit(
            LambdaNet(), DataLoader(TensorDataset(x, x[:, :1]), batch_size=4))
        """
    )
    started = time.monotonic()
    result = run_python(["-c", code], timeout=100)
    assert result.returncode != 0
    assert "strategy='ddp' runs the script again for every other rank, and python -c has no script" in result.stderr
    assert "strategy='ddp_notebook'" in result.stderr
    assert result.leftovers == []
    assert time.monotonic() - started < 60


def test_under_pytest_ddp_is_refused_naming_ddp_spawn() -> None:
    from strategies.relaunch import check_rerunnable
    from trainer.common.errors import UserError

    with pytest.raises(UserError, match=r"this process runs pytest.*strategy='ddp_spawn'"):
        check_rerunnable("ddp")


def test_a_sweeps_job_reruns_as_that_one_job_even_where_the_config_sets_multirun(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from strategies.rerun_command import rerun_command
    from trainer.cli.app import config_dir

    task = ["hparams_search=digits_optuna", "optim.lr=0.01"]
    with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
        cfg = compose("config", overrides=task, return_hydra_config=True)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"  # the search config asks for a sweep itself
    with open_dict(cfg):  # what Hydra's launcher sets for trial 3 of the study
        cfg.hydra.job.num, cfg.hydra.job.id, cfg.hydra.job.chdir = 3, "3", True
        cfg.hydra.runtime.output_dir, cfg.hydra.runtime.cwd = str(tmp_path / "multirun" / "3"), str(tmp_path)
        cfg.hydra.overrides.task = task
    monkeypatch.setattr(sys, "argv", ["geartrain", "-m", "hparams_search=digits_optuna", "hydra.sweeper.n_trials=9"])
    HydraConfig.instance().set_config(cfg)
    try:
        command, cwd = rerun_command(1)
    finally:
        HydraConfig.instance().cfg = None
    args = command[command.index(task[0]) :]  # after the interpreter and the program (here: python -m pytest)
    assert "-m" not in args and not any(a.startswith("hydra.sweeper") for a in args)  # never the whole study
    assert args[:2] == task and cwd == str(tmp_path)
    for pinned in ("hydra.mode=RUN", "hydra.job.num=3", 'hydra.job.id="3"', "hydra.job.chdir=true"):
        assert pinned in args
    assert f'hydra.run.dir="{tmp_path / "multirun" / "3"}"' in args


HYDRA_APP = textwrap.dedent(
    """
    import os
    from pathlib import Path
    import hydra
    from hydra.core.hydra_config import HydraConfig
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from tests.helpers.relaunch_script import LambdaNet
    from trainer import Trainer

    @hydra.main(version_base=None, config_path=None, config_name=None)
    def main(cfg):
        out = Path(HydraConfig.get().runtime.output_dir)
        x = torch.randn(16, 6, generator=torch.Generator().manual_seed(0))
        trainer = Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=1, logger=False,
                          enable_progress_bar=False, default_root_dir=out)
        trainer.fit(LambdaNet(), DataLoader(TensorDataset(x, x[:, :1]), batch_size=4))
        (out / f"rank-{trainer.global_rank}").write_text(str(cfg.get("tag", "")))

    if __name__ == "__main__":
        main()
    """
)


def _run_app(app: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    cwd.mkdir(parents=True, exist_ok=True)
    env = child_env(HYDRA_FULL_ERROR="1")
    return command_server.run([str(app), *args], cwd, env, 200)  # ``python app.py ARGS``, served


@pytest.mark.timeout(300)
def test_a_users_hydra_script_keeps_one_run_directory_and_a_sweep_one_per_job(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(HYDRA_APP)
    with ThreadPoolExecutor(2) as pool:  # a single run and a sweep, side by side
        running = pool.submit(_run_app, app, "+tag=one", cwd=tmp_path / "run")
        sweeping = pool.submit(_run_app, app, "-m", "+tag=a,b", cwd=tmp_path / "sweep")
        single, sweep = running.result(), sweeping.result()
    assert single.returncode == 0, single.stderr
    runs = [p for p in (tmp_path / "run" / "outputs").glob("*/*") if p.is_dir()]
    assert len(runs) == 1, runs  # the re-run rank wrote into the caller's run directory
    assert (runs[0] / "rank-0").read_text() == "one" and (runs[0] / "rank-1").read_text() == "one"
    assert sweep.returncode == 0, sweep.stderr
    jobs = sorted(p for p in (tmp_path / "sweep" / "multirun").glob("*/*/*") if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1"]  # no stray run directory of a re-run sweep
    for job, tag in zip(jobs, "ab", strict=True):  # each job's two ranks ran that job, with its override
        assert (job / "rank-0").read_text() == tag and (job / "rank-1").read_text() == tag
    assert not (tmp_path / "sweep" / "outputs").exists()


@pytest.mark.timeout(300)
def test_a_geartrain_ddp_run_keeps_one_folder_with_both_ranks(tmp_path: Path) -> None:
    # A sweep of such runs (one folder per job, both ranks in it): tests/test_cli_distributed.py.
    mark = ["+callbacks.rank_mark._target_=tests.helpers.rank_marks.RankMark"]
    mark += ["+callbacks.archives._target_=tests.helpers.rank_marks.Archives"]  # files left to the collector
    one = ["task=fit", "trainer.max_steps=2", "trainer.enable_progress_bar=false", "trainer.num_sanity_val_steps=0"]
    # A new interpreter: how the command's process ends is under test too.
    result = run_geartrain("strategy=ddp", "trainer.devices=2", *one, *mark, cwd=tmp_path, fresh=True)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = run_dirs(tmp_path)
    assert len(runs) == 1 and sorted(p.name for p in runs[0].glob("rank-*")) == ["rank-0", "rank-1"]
    assert not (tmp_path / "multirun").exists()
    for rank in (0, 1):  # each rank's gzip file and zip archive, left in a reference cycle, were written whole
        with gzip.open(runs[0] / f"steps-{rank}.gz", "rt") as archive:
            assert archive.read() == "step 1\nstep 2\n"
        with zipfile.ZipFile(runs[0] / f"steps-{rank}.zip") as archive:
            assert archive.namelist() == ["step-1.txt", "step-2.txt"]


STUDY_APP = textwrap.dedent(
    """
    from pathlib import Path
    import hydra
    from hydra.core.hydra_config import HydraConfig
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from tests.helpers.relaunch_script import LambdaNet
    from trainer import Trainer

    class FailsInTrialZero(LambdaNet):
        def training_step(self, batch, batch_idx):
            if batch_idx == 1 and HydraConfig.get().job.num == 0:
                raise RuntimeError("planned failure in trial 0")
            return super().training_step(batch, batch_idx)

    @hydra.main(version_base=None, config_path="conf", config_name="study")
    def main(cfg):
        out = Path(HydraConfig.get().runtime.output_dir)
        x = torch.randn(16, 6, generator=torch.Generator().manual_seed(0))
        y = x[:, :1] * cfg.scale
        module = FailsInTrialZero()
        trainer = Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=1, logger=False,
                          enable_progress_bar=False, enable_checkpointing=False, default_root_dir=out)
        trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=4))
        with torch.no_grad():
            loss = float(((module(x) - y) ** 2).mean())
        (out / f"rank-{trainer.global_rank}").write_text(f"{cfg.scale} {loss!r}")
        return loss

    if __name__ == "__main__":
        main()
    """
)

#: The user's study: the config sets MULTIRUN itself (no -m on the command line), as search configs do.
STUDY_CONFIG = textwrap.dedent(
    """
    defaults:
      - override hydra/sweeper: optuna
      - _self_
    scale: 1.0
    hydra:
      mode: MULTIRUN
      sweeper:
        n_trials: 3
        direction: minimize
        max_failure_rate: 1.0
        sampler:
          _target_: optuna.samplers.TPESampler
          seed: 0
        params:
          scale: choice(1.0, 2.0, 3.0)
    """
)


@pytest.mark.timeout(200)  # on a defect the study hangs: the script's own limit below ends it first
def test_a_users_optuna_study_under_ddp_runs_each_trial_on_both_ranks_and_goes_on_past_a_failed_one(
    tmp_path: Path,
) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "study.yaml").write_text(STUDY_CONFIG)
    (tmp_path / "app.py").write_text(STUDY_APP)
    result = run_in_session([sys.executable, "app.py"], cwd=tmp_path, env=child_env(), timeout=150)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    assert result.leftovers == []  # no rank of any trial, the failed one's included, is left running
    jobs = sorted(p for p in (tmp_path / "multirun").glob("*/*/*") if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1", "2"]  # one folder per trial, nothing else
    assert not list(jobs[0].glob("rank-*"))  # trial 0 failed on both ranks
    losses = []
    for job in jobs[1:]:  # both ranks trained the trial's value, in its folder, to the same weights
        scale = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())[0].split("=")[1]
        marks = {p.name: p.read_text().split() for p in job.glob("rank-*")}
        assert marks.keys() == {"rank-0", "rank-1"} and marks["rank-0"] == marks["rank-1"]
        assert float(marks["rank-0"][0]) == float(scale)
        losses.append(float(marks["rank-0"][1]))
    best = yaml.safe_load(next((tmp_path / "multirun").glob("*/*/optimization_results.yaml")).read_text())
    assert best["best_value"] == min(losses)  # each trial returned rank 0's value to the study
    assert "Best parameters" in result.stdout + result.stderr
    assert not (tmp_path / "outputs").exists()


ENDS_ABORTED = textwrap.dedent(
    """
    import atexit, os, signal, sys

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from trainer import Trainer, TrainModule


    class Line(TrainModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return ((self.net(x) - y) ** 2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)


    x = torch.randn(16, 2)
    trainer = Trainer(strategy="ddp", devices=2, accelerator="cpu", max_epochs=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Line(), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4))
    if trainer.global_rank == 1:
        # What gloo's threads sometimes do to a finished rank as the interpreter is torn down.
        atexit.register(lambda: os.kill(os.getpid(), signal.SIGABRT))
    sys.exit(int(sys.argv[1]))
    """
)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("status", [0, 3])
def test_a_rank_aborted_after_its_script_ended_ends_with_the_scripts_status(tmp_path: Path, status: int) -> None:
    """A finished rank that the interpreter's finalization aborts is no failure: its script's own status counts."""
    script = tmp_path / "ends_aborted.py"
    script.write_text(ENDS_ABORTED)
    result = run_python([str(script), str(status)], timeout=150)
    assert "SIGABRT" not in result.stderr, result.stderr[-3000:]
    if status == 0:
        assert result.returncode == 0, result.stderr[-3000:]
    else:  # rank 0 ends with its own sys.exit(3); rank 1's 3 is no abort either
        assert result.returncode == 3 and "WorkerFailedError" in result.stderr, result.stderr[-3000:]
        assert "exit code 3" in result.stderr, result.stderr[-3000:]


DDP_SCRIPT = str(REPO_ROOT / "tests" / "helpers" / "ddp_script.py")


def _hang(root: Path, rank: int, timeout: int) -> tuple[Finished, float]:
    """ddp_script with rank ``rank`` hanging at step 3; the finished run and when it ended."""
    args = ["--root", str(root), "--fail-rank", str(rank), "--fail-at-step", "3", "--hang", "--timeout", str(timeout)]
    result = run_python([DDP_SCRIPT, *args], timeout=150)
    return result, time.time()


@pytest.mark.timeout(200)
def test_a_hanging_rank_ends_the_run_within_the_documented_bound(tmp_path: Path) -> None:
    # docs/strategies.md: a rank that hangs ends the run within about strategy.timeout + 10 s. A hanging rank 0
    # and a hanging rank 1, run side by side: most of each run is waiting for the timeout.
    timeout = 5
    with ThreadPoolExecutor(2) as pool:
        runs = {rank: pool.submit(_hang, tmp_path / f"rank-{rank}", rank, timeout) for rank in (0, 1)}
    for rank, run in runs.items():
        result, ended = run.result()
        assert result.returncode != 0, rank
        hung_at = float((tmp_path / f"rank-{rank}" / "failed_at").read_text())
        assert ended - hung_at < timeout + 10, f"rank {rank} hung: the run took {ended - hung_at:.1f}s to end"
        assert result.leftovers == []
        assert not (tmp_path / f"rank-{rank}" / "report.json").exists()


@pytest.mark.timeout(400)
def test_lazy_layers_train_under_ddp_and_fsdp_and_equal_one_process(tmp_path: Path) -> None:
    one = tmp_path / "one"
    runs = {"one": [SCRIPT, "--root", str(one), "--devices", "1", "--batch", "8", "--lazy"]}
    for strategy in ("ddp", "fsdp"):
        runs[strategy] = [SCRIPT, "--root", str(tmp_path / strategy), "--devices", "2", "--batch", "4", "--lazy"]
        runs[strategy] += ["--strategy", strategy]
    with ThreadPoolExecutor(3) as pool:  # all at once: much of each run is starting processes
        results = {name: pool.submit(run_python, args, timeout=150) for name, args in runs.items()}
    result = results["one"].result()
    assert result.returncode == 0, result.stderr
    expected = _weights(one)
    assert expected["net.0.weight"].shape == (16, 6)  # materialised from the first batch
    for strategy in ("ddp", "fsdp"):
        root = tmp_path / strategy
        result = results[strategy].result()
        assert result.returncode == 0, result.stderr  # plain DDP: "Modules with uninitialized parameters"
        assert json.loads((root / "report.json").read_text())["global_step"] == 16
        _assert_equal(_weights(root), expected)


SWEEP_APP = textwrap.dedent(
    """
    from pathlib import Path
    import hydra
    from hydra.core.hydra_config import HydraConfig
    import torch
    import torchmetrics
    from torch.utils.data import DataLoader, TensorDataset
    from tests.helpers.relaunch_script import LambdaNet
    from trainer import Trainer

    class Logging(LambdaNet):
        def __init__(self):
            super().__init__()
            self.mean = torchmetrics.MeanMetric()  # synced by torchmetrics wherever a process group exists

        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.mean(loss.detach())
            self.log("mean_loss", self.mean, on_step=False, on_epoch=True)
            return loss

    @hydra.main(version_base=None, config_path=None, config_name=None)
    def main(cfg):
        out = Path(HydraConfig.get().runtime.output_dir)
        x = torch.randn(16, 6, generator=torch.Generator().manual_seed(0))
        trainer = Trainer(strategy=cfg.s, accelerator="cpu", devices=2 if cfg.s == "ddp" else 1, max_epochs=1,
                          logger=False, enable_progress_bar=False, enable_checkpointing=False, default_root_dir=out)
        trainer.fit(Logging(), DataLoader(TensorDataset(x, x[:, :1]), batch_size=4))
        (out / f"rank-{trainer.global_rank}").write_text(str(float(trainer.callback_metrics["mean_loss"])))

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.timeout(300)
def test_a_sweep_of_ddp_then_one_process_with_chdir_runs_each_job_in_its_own_group(tmp_path: Path) -> None:
    # `python app.py` (a relative path) with hydra.job.chdir=True: the re-run rank must find the script from
    # the folder the sweep started in, not from the job's folder. Job 1 (one process) must not sync its
    # metric over job 0's process group, whose other rank has gone.
    (tmp_path / "app.py").write_text(SWEEP_APP)
    env = child_env(HYDRA_FULL_ERROR="1")
    result = command_server.run(["app.py", "-m", "+s=ddp,single", "hydra.job.chdir=True"], tmp_path, env, 200)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    jobs = sorted(p for p in (tmp_path / "multirun").glob("*/*/*") if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1"]
    assert sorted(p.name for p in jobs[0].glob("rank-*")) == ["rank-0", "rank-1"]
    assert sorted(p.name for p in jobs[1].glob("rank-*")) == ["rank-0"]
    assert float((jobs[1] / "rank-0").read_text()) > 0
