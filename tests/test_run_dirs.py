"""Every ``geartrain`` run gets a folder of its own, holds it while it runs, and ``ckpt_path=last`` stays in its line.

Before: runs started in the same second shared ``outputs/<date>/<time>/`` (mixed checkpoints, two
event files), two runs given the same ``hydra.run.dir`` interleaved without a word, and in a sweep
``ckpt_path=last`` made job 1 resume job 0's final state.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.cli import run_dirs, run_geartrain
from tests.helpers.command_server import start
from trainer.checkpoint.resolve import resolve_last_checkpoint
from trainer.cli.run_dir_guard import guarded_run_dir as locked_run_dir
from trainer.cli.run_dirs import claim_run_dir, unique_run_dir_overrides
from trainer.common.errors import ConfigError

QUICK = ("trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "task=fit")
QUIET = ("trainer.enable_progress_bar=false", "logger=none")


def _claim(base: str, barrier: multiprocessing.synchronize.Barrier, out: multiprocessing.Queue[str]) -> None:
    barrier.wait()
    out.put(str(claim_run_dir(Path(base))))


def test_processes_claiming_the_same_second_get_different_folders(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    base = str(tmp_path / "outputs" / "2026-12-01" / "10-00-00")
    procs = [ctx.Process(target=_claim, args=(base, barrier, out)) for _ in range(4)]
    for p in procs:
        p.start()
    claimed = sorted(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert claimed == sorted([base, f"{base}-2", f"{base}-3", f"{base}-4"])


def test_the_same_second_twice_in_one_process_gives_two_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    now = time.time()
    first, second = unique_run_dir_overrides([], now=now), unique_run_dir_overrides([], now=now)
    assert first != second and all(o.startswith("hydra.run.dir=outputs/") for o in first + second)
    assert unique_run_dir_overrides(["-m"], now=now)[0].startswith("hydra.sweep.dir=multirun/")
    assert unique_run_dir_overrides(["hydra.run.dir=mine"]) == []
    assert unique_run_dir_overrides(["--cfg", "job"]) == []


def test_a_live_run_holds_its_folder(tmp_path: Path) -> None:
    with (
        locked_run_dir(tmp_path),
        pytest.raises(ConfigError, match="in use by another live run"),
        locked_run_dir(tmp_path),
    ):
        pass
    with locked_run_dir(tmp_path):  # released when the run ended
        pass


def test_a_killed_run_leaves_its_folder_free(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path\n"
            "from trainer.cli.run_dir_guard import guarded_run_dir as locked_run_dir\n"
            "with locked_run_dir(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(600)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"pid {holder.pid}"), locked_run_dir(tmp_path):
            pass
    finally:
        holder.kill()  # SIGKILL: no clean-up code runs
        holder.wait()
    with locked_run_dir(tmp_path):
        pass


def test_a_run_leaves_no_lock_file_however_it_ends(tmp_path: Path) -> None:
    # A sweep: the first job trains and writes its files, the second fails on its config; the command ends in an error.
    result = run_geartrain("-m", *QUICK, *QUIET, "data.batch_size=32,0", cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]
    assert (run_dirs(tmp_path, "multirun/*/*/*")[0] / "checkpoints" / "last.ckpt").is_file()
    result = run_geartrain(*QUICK, *QUIET, cwd=tmp_path)  # one run, ending well
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(run_dirs(tmp_path)) == 1
    assert sorted(tmp_path.rglob(".geartrain.lock")) == []


def test_a_lock_file_removed_by_its_ending_holder_is_not_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    lock, flock, calls = tmp_path / ".geartrain.lock", fcntl.flock, []
    lock.write_text("pid 1 on a run now ending\n")

    def holder_ends_between_open_and_lock(fd: int, operation: int) -> None:
        if not calls:
            lock.unlink()  # the live run removes its lock file as it ends, after this process opened it
        calls.append(fd)
        flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", holder_ends_between_open_and_lock)
    with locked_run_dir(tmp_path):
        assert lock.read_text().startswith("pid ")  # the folder's lock file is the one held
        with pytest.raises(ConfigError, match="in use by another live run"), locked_run_dir(tmp_path):
            pass
    assert not lock.exists()


def _fake_run(folder: Path, overrides: list[str]) -> Path:
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (folder / "checkpoints").mkdir()
    ckpt = folder / "checkpoints" / "last.ckpt"
    torch.save({}, ckpt)
    return ckpt


def test_ckpt_path_last_in_a_sweep_takes_only_the_same_job(tmp_path: Path) -> None:
    sweep = tmp_path / "multirun" / "2026-12-01" / "10-00-00"
    job0 = _fake_run(sweep / "0", ["optim.lr=0.1", "ckpt_path=last"])
    job1_now = tmp_path / "multirun" / "2026-12-01" / "11-00-00" / "1"
    with pytest.raises(ConfigError, match=r"no last\.ckpt of a run with the same overrides"):
        resolve_last_checkpoint(tmp_path, job1_now, ["optim.lr=0.2", "ckpt_path=last"])
    again = resolve_last_checkpoint(tmp_path, job1_now, ["optim.lr=0.1", "ckpt_path=last", "trainer.max_epochs=9"])
    assert again == str(job0)


def test_ckpt_path_last_never_takes_another_experiment(tmp_path: Path) -> None:
    digits = _fake_run(tmp_path / "outputs" / "d" / "1", [])
    time.sleep(0.01)
    _fake_run(tmp_path / "outputs" / "d" / "2", ["experiment=charlm"])  # newer, another experiment
    here = tmp_path / "outputs" / "d" / "3"
    assert resolve_last_checkpoint(tmp_path, here, ["ckpt_path=last", "trainer.max_epochs=5"]) == str(digits)


@pytest.mark.slow
def test_runs_started_together_write_to_their_own_folders(tmp_path: Path) -> None:
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [start(["-m", "trainer", *QUICK, *QUIET, f"seed={seed}"], tmp_path, env, merge=True) for seed in (1, 2, 3)]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    runs = run_dirs(tmp_path)
    assert len(runs) == 3
    seeds = sorted((run / ".hydra" / "overrides.yaml").read_text().split("seed=")[1].strip() for run in runs)
    assert seeds == ["1", "2", "3"]
    assert all(len(list((run / "checkpoints").glob("*.ckpt"))) >= 1 for run in runs)


@pytest.mark.slow
def test_a_second_run_into_a_live_runs_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    with locked_run_dir(folder):
        result = run_geartrain(*QUICK, *QUIET, f"hydra.run.dir={folder}", cwd=tmp_path)
    assert result.returncode == 1
    assert "in use by another live run" in result.stderr and "Traceback" not in result.stderr
    assert not (folder / "checkpoints").exists()


@pytest.mark.slow
def test_a_resumed_sweep_resumes_each_job_from_its_own_state(tmp_path: Path) -> None:
    sweep = ("-m", "optim.lr=0.001,0.5", *QUIET, "trainer.limit_val_batches=1", "task=fit", "ckpt_path=last")
    first = run_geartrain(*sweep, "trainer.max_epochs=1", "trainer.limit_train_batches=2", cwd=tmp_path)
    # Nothing to resume yet: said, not guessed, and each job trains from scratch (Lightning's "set and forget").
    assert first.returncode == 0 and "no last checkpoint available: training starts from scratch" in first.stderr
    fresh = run_geartrain(*sweep[:-1], "trainer.max_epochs=1", "trainer.limit_train_batches=2", cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    resumed = run_geartrain(*sweep, "trainer.max_epochs=2", "trainer.limit_train_batches=2", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # Each job said which file it resumed: the earlier run of the same job (same lr), never the other job's
    # (before, job 1 found job 0's just-written last.ckpt the newest and resumed it).
    used = [
        line.split("using ", 1)[1].strip() for line in resumed.stdout.splitlines() if "ckpt_path=last: using" in line
    ]
    assert len(used) == 2
    for path, lr in zip(used, ("0.001", "0.5"), strict=True):
        overrides = (Path(path).parents[1] / ".hydra" / "overrides.yaml").read_text()
        assert f"optim.lr={lr}" in overrides
        assert torch.load(path, weights_only=True)["progress"]["global_step"] == 2
    # Each job went on from its own state to step 4 (in the folder the resume chose for it).
    for lr in ("0.001", "0.5"):
        steps = [
            torch.load(last, weights_only=True)["progress"]["global_step"]
            for last in tmp_path.glob("multirun/*/*/*/checkpoints/last.ckpt")
            if f"optim.lr={lr}" in (last.parents[1] / ".hydra" / "overrides.yaml").read_text()
        ]
        assert max(steps) == 4, (lr, steps)


def test_ckpt_path_last_never_continues_another_jobs_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-process run never takes a finished DDP run's last.ckpt (same model and data, other settings)."""
    from trainer.cli.app import resolve_ckpt_path

    ddp = _fake_run(tmp_path / "outputs" / "d" / "2", ["strategy=ddp", "trainer.devices=2", "trainer.max_epochs=3"])
    here = tmp_path / "outputs" / "d" / "3"
    with pytest.raises(ConfigError, match=rf"no last\.ckpt of a run with the same overrides.*{ddp.parent.parent}"):
        resolve_last_checkpoint(tmp_path, here, ["trainer.max_epochs=6", "ckpt_path=last"])
    monkeypatch.chdir(tmp_path)
    with pytest.warns(UserWarning, match=r"training starts from scratch.*outputs"):
        assert resolve_ckpt_path("last", here, fresh_if_no_last=True) is None
    same = _fake_run(tmp_path / "outputs" / "d" / "1", ["trainer.max_epochs=2"])  # the same job, older budget
    os.utime(ddp, (time.time() + 60, time.time() + 60))  # the other job's file is the newest
    assert resolve_last_checkpoint(tmp_path, here, ["ckpt_path=last", "trainer.max_epochs=6"]) == str(same)


def test_ckpt_path_naming_a_run_folder_takes_that_runs_last(tmp_path: Path) -> None:
    from trainer.cli.app import resolve_ckpt_path

    last = _fake_run(tmp_path / "outputs" / "d" / "1", ["strategy=ddp"])
    assert resolve_ckpt_path(str(last.parent.parent), tmp_path / "outputs" / "d" / "2") == str(last)
