"""The ``geartrain`` command with several processes: sweeps of DDP jobs, torchrun, two simulated nodes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO_ROOT
from tests.helpers.cli import run_dirs, run_geartrain
from tests.helpers.command_server import Started, start
from tests.helpers.distributed import free_port

pytestmark = pytest.mark.slow  # every test here starts processes

ONE_EPOCH = ["task=fit", "trainer.max_epochs=1", "trainer.enable_progress_bar=false", "trainer.num_sanity_val_steps=0"]


def event_files(run: Path) -> list[Path]:
    return sorted(run.glob("**/events.out.tfevents.*"))


def steps_in(run: Path) -> int:
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    return int(state["progress"]["global_step"])


def torchrun(*args: str, cwd: Path) -> Started:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return start(["-m", "torch.distributed.run", *args], cwd, env, merge=True)


@pytest.mark.timeout(300)
def test_sweep_of_ddp_jobs_each_trained_by_two_processes(tmp_path: Path) -> None:
    mark = "+callbacks.rank_mark._target_=tests.helpers.rank_marks.RankMark"  # each rank writes rank-R: its lr
    result = run_geartrain(
        "-m", "optim.lr=0.01,0.003", "strategy=ddp", "trainer.devices=2", *ONE_EPOCH, mark, cwd=tmp_path
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = run_dirs(tmp_path, "multirun/*/*/*")
    assert len(jobs) == 2
    for job, lr in zip(jobs, ("0.01", "0.003"), strict=True):
        # Both ranks of each job trained that job's lr, in its one folder.
        assert sorted(p.name for p in job.glob("rank-*")) == ["rank-0", "rank-1"]
        assert {p.read_text() for p in job.glob("rank-*")} == {lr}
        assert len(event_files(job)) == 1  # rank 0 alone writes TensorBoard files
        # 1,079 training images, 64 per process and step, 2 processes: 9 steps (1 process: 17).
        assert steps_in(job) == 9
    assert not list(tmp_path.glob("outputs"))  # no second Hydra start wrote a run directory


@pytest.mark.timeout(300)
def test_torchrun_two_processes_share_one_run_directory(tmp_path: Path) -> None:
    proc = torchrun("--standalone", "--nproc-per-node=2", "-m", "trainer", "strategy=ddp", *ONE_EPOCH, cwd=tmp_path)
    out, _ = proc.communicate(timeout=280)
    assert proc.returncode == 0, out[-3000:]
    (run,) = run_dirs(tmp_path)
    assert len(list(tmp_path.glob("outputs/*/*"))) == 1  # rank 1 wrote no directory of its own
    assert len(event_files(run)) == 1
    assert steps_in(run) == 9
    assert out.count("final metrics") == 1  # only rank 0 prints


@pytest.mark.timeout(360)
def test_two_torchrun_nodes_form_one_world_of_four(tmp_path: Path) -> None:
    port = free_port()
    common = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}"]
    nodes = [
        torchrun(*common, "--rdzv-id=geartrain-test", "-m", "trainer", "strategy=ddp", *ONE_EPOCH, cwd=tmp_path)
        for _ in range(2)
    ]
    outputs = []
    try:
        for node in nodes:
            outputs.append(node.communicate(timeout=330)[0])
    finally:
        for node in nodes:
            node.kill()
    assert [n.returncode for n in nodes] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    (run,) = run_dirs(tmp_path)
    assert len(event_files(run)) == 1
    # 1,079 images over 4 processes at 64 per process and step: 5 steps per epoch.
    assert steps_in(run) == 5


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_every_rank_shows_geartrains_warnings_in_one_line(tmp_path: Path, strategy: str) -> None:
    # A module with a submodule in eval mode: every rank warns as training starts (trainer/loops/fit.py).
    (tmp_path / "frozen_net.py").write_text(
        "import torch\n"
        "from trainer.examples.digits import DigitsClassifier\n\n\n"
        "class Frozen(DigitsClassifier):\n"
        "    def __init__(self, **kwargs):\n"
        "        super().__init__(**kwargs)\n"
        "        self.frozen = torch.nn.Dropout().eval()\n"
    )
    result = run_geartrain(
        *ONE_EPOCH, "trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "logger=none",
        "model._target_=frozen_net.Frozen", f"strategy={strategy}", "trainer.devices=2",
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    line = "geartrain: warning: 1 module(s) are in eval mode at the start of training (frozen)"
    assert output.count(line) == 2, output[-3000:]  # once per rank
    assert "fit.py" not in output and "PossibleUserWarning" not in output, output[-3000:]
