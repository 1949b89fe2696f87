"""WandbLogger in offline mode (no account, no network), its run files read back: history rows,
config, resume after kill -9 into the same run, DDP with one writer."""

from __future__ import annotations

import json
import pickle
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import Callback, WandbLogger
from tests.helpers import tracker_job
from tests.helpers.callback_tools import Scripted, loaders
from tests.helpers.distributed import run_python, spawn
from tests.helpers.trainers import quiet_trainer

wandb = pytest.importorskip("wandb")  # in the dev extra: present wherever the tests run
from callbacks.wandb_logger import STEP_KEY, history_rows  # noqa: E402

pytestmark = pytest.mark.slow  # wandb starts a helper process per run; subprocess jobs


@pytest.fixture(autouse=True)
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """wandb offline, silent, its own folders in tmp; no run left open for the next test."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    yield
    if wandb.run is not None:
        wandb.run.finish()


class Recorder(Callback):
    """What the trainer handed to the loggers: {key: [(step, value), ...]}."""

    def __init__(self) -> None:
        self.seen: dict[str, list[tuple[int, float]]] = {}

    def on_log_metrics(self, trainer: Any, module: Any, metrics: dict[str, torch.Tensor], step: int) -> None:
        for key, value in metrics.items():
            self.seen.setdefault(key, []).append((step, float(value)))


def run_files(root: Path, run_id: str) -> list[Path]:
    """The run's ``.wandb`` files under ``root/wandb``, oldest session first, each one's session over.

    wandb's helper process writes the end of the file shortly after ``finish()`` returns: wait (a
    bounded time) for its exit record, except in a session that was killed.
    """
    files = sorted(root.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb"))
    for path in files[-1:]:
        deadline = time.monotonic() + 60
        while not any(kind == "exit" for kind in record_kinds(path)):
            assert time.monotonic() < deadline, f"{path} has no exit record"
            time.sleep(0.2)
    return files


def record_kinds(path: Path) -> list[str]:
    from wandb.proto import wandb_internal_pb2

    from callbacks._wandb_history import _log_records

    kinds = []
    for data in _log_records(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kinds.append(str(record.WhichOneof("record_type")))
    return kinds


def series(files: list[Path]) -> dict[str, list[tuple[int, float]]]:
    """{key: [(trainer/global_step, value), ...]} over every session's rows."""
    out: dict[str, list[tuple[int, float]]] = {}
    for path in files:
        for row in history_rows(path):
            for key, value in row.items():
                if not key.startswith("_") and key != STEP_KEY:
                    out.setdefault(key, []).append((row[STEP_KEY], value))
    return {key: sorted(points) for key, points in out.items()}


def test_offline_fit_writes_every_value_at_its_step_and_the_hyperparameters(tmp_path: Path) -> None:
    logger = WandbLogger(name="first", save_dir=tmp_path, project="proj", prefix="p", tags=["a"])
    assert logger.version is None and logger.name == "proj"  # nothing started yet
    recorder = Recorder()
    trainer = quiet_trainer(tmp_path, callbacks=[logger, recorder], max_epochs=2, log_every_n_steps=1)
    trainer.fit(Scripted([0.3, 0.7]), *loaders())
    run = logger.experiment
    assert isinstance(run, wandb.Run)
    assert (run.name, run.project, run.tags, logger.version) == ("first", "proj", ("a",), run.id)
    assert (logger.save_dir, logger.log_dir) == (str(tmp_path), None)
    assert dict(run.config) == {"lr": 0.1}
    run.finish()
    (path,) = run_files(tmp_path, run.id)
    expected = {f"p-{key}": seen for key, seen in recorder.seen.items() if key != "epoch"}  # epoch: below
    got = series([path])
    epochs = got.pop("p-epoch")
    assert got == expected
    assert sorted({s for s, _ in epochs}) == sorted({s for seen in recorder.seen.values() for s, _ in seen})


def test_resume_after_kill_continues_the_same_run_without_repeating_or_losing_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = tracker_job.fit("wandb", tmp_path / "reference", str(tmp_path / "ref-files"), name="reference")
    # The jobs start their own wandb helper (which dies with the killed job), not this process's.
    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    job = [str(Path("tests/helpers/tracker_job.py")), "wandb", str(tmp_path / "job"), str(tmp_path / "files")]
    killed = run_python([*job, "--kill-at", "8"], 600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = run_python([*job, "--resume"], 600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (run_id,) = {p.name.rsplit("-", 1)[1] for p in (tmp_path / "files" / "wandb").glob("offline-run-*")}
    assert f"RUN {run_id}" in resumed.stdout
    files = run_files(tmp_path / "files", run_id)
    assert len(files) == 2  # one run, two sessions
    assert series(files) == series(run_files(tmp_path / "ref-files", reference["run_id"]))


def test_only_rank_zero_writes_under_ddp(tmp_path: Path) -> None:
    results = spawn(tracker_job.ddp_fit, "wandb", str(tmp_path / "out"), str(tmp_path / "files"), world_size=2)
    assert [r["experiment"] for r in results] == ["Run", "NoOpExperiment"]
    (folder,) = (tmp_path / "files" / "wandb").glob("offline-run-*")
    assert folder.name.endswith(results[0]["run_id"])
    steps = [s for s, _ in series(run_files(tmp_path / "files", results[0]["run_id"]))["train/loss"]]
    assert steps == list(range(results[0]["steps"]))


def test_pickles_after_use_and_the_copy_writes_to_the_same_run(tmp_path: Path) -> None:
    logger = WandbLogger(save_dir=tmp_path, project="pickle")
    logger.log_metrics({"a": 1.0}, step=0)
    run_id = logger.version
    logger.experiment.finish()
    copy = pickle.loads(pickle.dumps(logger))
    assert copy.version == run_id
    # wandb names an offline session's folder by the second it starts in: a second session of the run in
    # the same second shares the first one's folder and file (wandb's), so this one starts in the next.
    time.sleep(1.05 - time.time() % 1)
    copy.log_metrics({"a": 2.0}, step=1)
    copy.experiment.finish()
    assert series(run_files(tmp_path, run_id)) == {"a": [(0, 1.0), (1, 2.0)]}


def test_offline_with_log_model_is_refused_and_a_missing_package_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(
        ValueError, match="checkpoints cannot be uploaded in offline mode"
    ):  # and a MisconfigurationException
        WandbLogger(offline=True, log_model=True)
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'geartrain\[wandb\]'"):
        WandbLogger()


def test_cli_records_run_directory_and_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import subprocess

    from wandb.proto import wandb_internal_pb2

    from callbacks._wandb_history import _log_records
    from tests.helpers.distributed import child_env

    monkeypatch.delenv("WANDB_SERVICE", raising=False)  # the command starts its own wandb helper
    run_dir = tmp_path / "outputs" / "run"
    cmd = [sys.executable, "-m", "trainer", "task=fit", "trainer.max_epochs=1", "trainer.limit_train_batches=3"]
    cmd += ["trainer.limit_val_batches=2", "trainer.log_every_n_steps=1", "logger=wandb", "~callbacks.progress_bar"]
    cmd += [f"hydra.run.dir={run_dir}"]
    out = subprocess.run(cmd, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (folder,) = (run_dir / "wandb").glob("offline-run-*")  # wandb's files inside the run directory
    (path,) = run_files(run_dir, folder.name.rsplit("-", 1)[1])
    config: dict[str, Any] = {}
    names = []
    for data in _log_records(path.read_bytes()):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "run":
            names.append(record.run.display_name)
    assert names[0] == "outputs/run"  # the run is named after its run directory
    assert config["geartrain.run_dir"] == str(run_dir)
    assert config["geartrain.checkpoint_dir"] == str(run_dir / "checkpoints")
    assert config["trainer"]["max_epochs"] == 1 and config["logger"]["wandb"]["project"] == "geartrain"
    assert "train/loss" in series([path]) and "val/acc" in series([path])


@pytest.mark.parametrize("log_model", ["all", True])
def test_log_model_uploads_checkpoints_as_model_artifacts(tmp_path: Path, log_model: bool | str) -> None:
    """Offline, an artifact is recorded in the run's file as it would be uploaded (WANDB_MODE=offline)."""
    import base64
    import hashlib

    from wandb.proto import wandb_internal_pb2

    from callbacks import ModelCheckpoint
    from callbacks._wandb_history import _log_records

    logger = WandbLogger(save_dir=tmp_path, project="models", log_model=log_model, checkpoint_name="net")
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/score", mode="max", save_top_k=1)
    quiet_trainer(tmp_path, callbacks=[logger, checkpoint], max_epochs=2).fit(Scripted([0.7, 0.3]), *loaders())
    run_id = logger.version
    logger.experiment.finish()
    (path,) = run_files(tmp_path, run_id)
    uploads = []
    for data in _log_records(path.read_bytes()):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "artifact":
            art = record.artifact
            uploads.append(
                (art.name, art.type, sorted(art.aliases), [(e.path, e.digest) for e in art.manifest.contents])
            )
    best = Path(checkpoint.best_model_path)  # epoch 0's file, kept: val/score fell after it
    digest = base64.b64encode(hashlib.md5(best.read_bytes()).digest()).decode()
    # "all": after each save (epoch 0's file once; epoch 1 wrote no new file); True: once, when fitting ended.
    assert uploads == [("net", "model", ["best", "latest"], [("model.ckpt", digest)])]


def test_a_run_opened_before_fit_under_ddp_spawn_gets_the_workers_rows(tmp_path: Path) -> None:
    """The spawned rank 0 attaches to the caller's run (Lightning's way); resuming it failed "run ID is in use"."""
    logger = WandbLogger(save_dir=tmp_path, project="spawn")
    logger.experiment.config.update({"before": 1})  # the run is open in this process
    run_id = logger.version
    trainer = quiet_trainer(
        tmp_path, callbacks=[logger], strategy="ddp_spawn", devices=2, accelerator="cpu", max_epochs=2,
        log_every_n_steps=1,
    )  # fmt: skip
    trainer.fit(Scripted(), *loaders())
    assert logger.version == run_id
    logger.experiment.finish()
    (path,) = run_files(tmp_path, run_id)  # one run, one session: the workers wrote into the caller's
    steps = [s for s, _ in series([path])["train/loss"]]
    assert steps == list(range(trainer.global_step)) and trainer.global_step == 4


def test_a_save_dir_wandb_cannot_write_falls_back_as_wandb_does_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """wandb writes to the temporary folder instead (with a warning); the logger's journal of rows follows it."""
    import tempfile

    blocker = tmp_path / "a-file"
    blocker.write_text("")  # no folder can be made below a file (a read-only folder, for any user)
    fallback = tmp_path / "temporary"
    fallback.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(fallback))
    logger = WandbLogger(save_dir=blocker / "logs", project="fallback")
    trainer = quiet_trainer(tmp_path, callbacks=[logger], max_epochs=1, log_every_n_steps=1)
    trainer.fit(Scripted(), *loaders())
    run_id = logger.version
    logger.experiment.finish()
    (path,) = run_files(fallback, run_id)
    steps = [s for s, _ in series([path])["train/loss"]]
    assert steps == list(range(trainer.global_step)) and trainer.global_step == 4
    journal = fallback / "wandb" / f"geartrain-rows-{run_id}.jsonl"
    assert [row[0] for row in map(json.loads, journal.read_text().splitlines())][:4] == [0, 1, 2, 3]
    assert logger.state_dict() == {"run_id": run_id, "dir": str(fallback)}  # a resume looks there
