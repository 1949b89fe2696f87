"""MLFlowLogger against a real MLflow tracking server (SQLite backend, local artifact root), read back
through MLflow's own client: params, metric histories, checkpoint artifacts, resume after kill -9, DDP."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from callbacks import Callback, CSVLogger, MLFlowLogger, ModelCheckpoint, TensorBoardLogger
from tests.helpers import tracker_job
from tests.helpers.callback_tools import Scripted, loaders
from tests.helpers.distributed import child_env, free_port, run_python, spawn
from tests.helpers.trainers import quiet_trainer

mlflow = pytest.importorskip("mlflow")  # in the dev extra: present wherever the tests run
from mlflow.tracking import MlflowClient  # noqa: E402

pytestmark = pytest.mark.slow  # a server process, and subprocess jobs


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One ``mlflow server`` for the module on a free port of 127.0.0.1; stopped at the end."""
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    cmd += [
        "--backend-store-uri",
        f"sqlite:///{root / 'db.sqlite'}",
        "--artifacts-destination",
        str(root / "artifacts"),
    ]
    # The server's job runner (a pool of huey consumers for GenAI jobs) serves nothing logged here: off, it
    # costs neither the start nor the stop of seven more interpreters.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = (root / "server.log").open("w")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240  # database migrations on a loaded machine take a while
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not come up:\n{(root / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
        log.close()


class Recorder(Callback):
    """What the trainer handed to the loggers: {key: [(step, value), ...]}."""

    def __init__(self) -> None:
        self.seen: dict[str, list[tuple[int, float]]] = {}

    def on_log_metrics(self, trainer: Any, module: Any, metrics: dict[str, torch.Tensor], step: int) -> None:
        for key, value in metrics.items():
            self.seen.setdefault(key, []).append((step, float(value)))


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return [
        (m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    ]


def test_fit_writes_params_metric_histories_and_checkpoints_as_artifacts(server: str, tmp_path: Path) -> None:
    logger = MLFlowLogger(
        experiment_name="fit", run_name="first", tracking_uri=server, tags={"team": "a"}, log_model="all", prefix="p"
    )
    recorder = Recorder()
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", monitor="val/score", mode="max", save_top_k=1, save_last=True
    )
    trainer = quiet_trainer(tmp_path, callbacks=[logger, recorder, checkpoint], max_epochs=3, log_every_n_steps=1)
    train, val = loaders()
    trainer.fit(Scripted([0.3, 0.7, 0.5]), train, val)

    client = MlflowClient(server)
    assert isinstance(logger.experiment, MlflowClient)
    run = client.get_run(logger.run_id)
    assert (logger.version, logger.name) == (run.info.run_id, run.info.experiment_id)
    assert client.get_experiment(logger.name).name == "fit"
    assert (logger.save_dir, logger.log_dir) == (None, None)  # a server: no local folder (Lightning's answer)
    assert run.info.status == "FINISHED" and run.info.run_name == "first" and run.data.tags["team"] == "a"
    assert run.data.params == {"lr": "0.1"}
    # Every value the trainer handed over, at its step, once; the prefix as Lightning joins it.
    assert set(run.data.metrics) == {f"p-{k}" for k in recorder.seen} | {"p-epoch"}
    for key, seen in recorder.seen.items():
        if key != "epoch":  # every row carries it, also two rows at one step: checked below
            assert history(client, logger.run_id, f"p-{key}") == seen
    steps = [s for s, _ in history(client, logger.run_id, "p-epoch")]
    assert steps == sorted(
        steps
    )  # a step row and an epoch row may share a step, each with its epoch (Lightning's rows)
    # log_model="all": every file saved (the first best too, evicted later), byte for byte, with metadata.
    folders = {a.path for a in client.list_artifacts(logger.run_id)}
    assert folders == {"epoch=0-step=4", "epoch=1-step=8", "last"}
    best = Path(checkpoint.best_model_path)
    got = Path(client.download_artifacts(logger.run_id, f"{best.stem}/{best.name}", str(tmp_path / "dl")))
    assert got.read_bytes() == best.read_bytes()
    meta = Path(client.download_artifacts(logger.run_id, f"{best.stem}/metadata.yaml", str(tmp_path / "dl")))
    assert yaml.safe_load(meta.read_text())["score"] == pytest.approx(0.7)


@pytest.mark.parametrize("log_model", [True, False])
def test_log_model_true_uploads_when_fitting_ends_and_false_never(server: str, tmp_path: Path, log_model: bool) -> None:
    logger = MLFlowLogger(experiment_name=f"log_model_{log_model}", tracking_uri=server, log_model=log_model)
    uploaded: list[int] = []

    class Count(Callback):
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            uploaded.append(len(MlflowClient(server).list_artifacts(logger.run_id)))

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer = quiet_trainer(tmp_path, callbacks=[logger, checkpoint, Count()], max_epochs=2)
    trainer.fit(Scripted(), *loaders())
    artifacts = {a.path for a in MlflowClient(server).list_artifacts(logger.run_id)}
    assert uploaded == [0, 0]
    assert artifacts == ({Path(checkpoint.best_model_path).stem, "last"} if log_model else set())


def test_resume_after_kill_continues_the_same_run_without_repeating_or_losing_steps(
    server: str, tmp_path: Path
) -> None:
    reference = tracker_job.fit("mlflow", tmp_path / "reference", server, name="reference")
    killed = run_python(
        [str(Path("tests/helpers/tracker_job.py")), "mlflow", str(tmp_path / "job"), server, "--kill-at", "8"], 600
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    client = MlflowClient(server)
    (first,) = client.search_runs([client.get_experiment_by_name("job").experiment_id])
    before = [s for s, _ in history(client, first.info.run_id, "train/loss")]
    ckpt = torch.load(tmp_path / "job" / "checkpoints" / "last.ckpt", weights_only=True)
    assert before[-1] >= ckpt["progress"]["global_step"]  # steps after the checkpoint were already logged
    assert ckpt["callbacks"]["MLFlowLogger"] == {"run_id": first.info.run_id}
    resumed = run_python(
        [str(Path("tests/helpers/tracker_job.py")), "mlflow", str(tmp_path / "job"), server, "--resume"], 600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (run,) = client.search_runs([client.get_experiment_by_name("job").experiment_id])
    assert run.info.run_id == first.info.run_id and run.info.status == "FINISHED"
    assert f"RUN {run.info.run_id}" in resumed.stdout
    for key in ("train/loss", "val/loss", "epoch"):
        assert history(client, run.info.run_id, key) == history(client, reference["run_id"], key), key


def test_only_rank_zero_writes_under_ddp(server: str, tmp_path: Path) -> None:
    results = spawn(tracker_job.ddp_fit, "mlflow", str(tmp_path), server, world_size=2)
    assert [r["experiment"] for r in results] == ["MlflowClient", "NoOpExperiment"]
    client = MlflowClient(server)
    (run,) = client.search_runs([client.get_experiment_by_name("ddp").experiment_id])
    assert run.info.run_id == results[0]["run_id"]
    assert [s for s, _ in history(client, run.info.run_id, "train/loss")] == list(range(results[0]["steps"]))


def test_cli_records_run_directory_config_and_checkpoints(server: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "outputs" / "run"
    cmd = [sys.executable, "-m", "trainer", "task=fit", "trainer.max_epochs=1", "trainer.limit_train_batches=3"]
    cmd += [
        "trainer.limit_val_batches=2",
        "trainer.log_every_n_steps=1",
        "logger=[tensorboard,mlflow]",
        "~callbacks.progress_bar",
        f"hydra.run.dir={run_dir}",
    ]
    out = subprocess.run(
        cmd, cwd=tmp_path, env=child_env(MLFLOW_TRACKING_URI=server), capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (run_dir / "tensorboard").is_dir()
    client = MlflowClient(server)
    (run,) = client.search_runs([client.get_experiment_by_name("geartrain").experiment_id])
    assert run.info.run_name == "outputs/run"
    assert run.data.tags["geartrain.run_dir"] == str(run_dir)
    assert run.data.tags["geartrain.checkpoint_dir"] == str(run_dir / "checkpoints")
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert (
        run.data.params["trainer/max_epochs"] == "1" and run.data.params["logger/mlflow/experiment_name"] == "geartrain"
    )
    config = Path(client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path / "dl"))).read_text()
    assert "limit_train_batches: 3" in config
    assert "train/loss" in run.data.metrics and "val/acc" in run.data.metrics


def test_every_logger_pickles_after_use_for_ddp_spawn(server: str, tmp_path: Path) -> None:
    """A logger used before ``fit`` (its writer or client open) still crosses to ``ddp_spawn``'s workers."""
    tensorboard, csv = TensorBoardLogger(tmp_path, name="tb"), CSVLogger(tmp_path, name="csv")
    tracker = MLFlowLogger(experiment_name="pickle", tracking_uri=server)
    for logger in (tensorboard, csv, tracker):
        logger.log_metrics({"a": 1.0}, step=0)
        copy = pickle.loads(pickle.dumps(logger))
        copy.log_metrics({"a": 2.0}, step=1)
        assert copy.log_dir == logger.log_dir
    assert copy.run_id == tracker.run_id
    assert history(MlflowClient(server), tracker.run_id, "a") == [(0, 1.0), (1, 2.0)]


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what a fresh interpreter without mlflow sees
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'geartrain\[mlflow\]'"):
        MLFlowLogger()


def test_synchronous_is_refused_by_an_mlflow_older_than_2_8(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import callbacks.mlflow_logger as mlflow_logger

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a local store: no server needed to build one
    monkeypatch.setattr(mlflow_logger, "_mlflow_version", lambda: "2.7.1")
    with pytest.raises(ModuleNotFoundError, match=r"`synchronous` requires mlflow>=2.8.0 \(installed: 2.7.1\)"):
        MLFlowLogger(tracking_uri=tmp_path.as_uri(), synchronous=False)
    MLFlowLogger(tracking_uri=tmp_path.as_uri())  # without synchronous: any version, as Lightning
    monkeypatch.setattr(mlflow_logger, "_mlflow_version", lambda: "2.8.0")
    MLFlowLogger(tracking_uri=tmp_path.as_uri(), synchronous=False)


def test_metric_names_mlflow_accepts_are_kept_and_a_changed_name_never_joins_another_metric(server: str) -> None:
    """``val/Δloss`` used to be written into ``val/loss`` (characters outside ASCII dropped without a word)."""
    logger = MLFlowLogger(experiment_name="names", tracking_uri=server)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # names MLflow accepts go through as they are, without a word
        logger.log_metrics({"val/loss": 1.0, "val/Δloss": -0.5, "acc5": 0.9}, step=0)
    with pytest.warns(RuntimeWarning) as said:
        logger.log_metrics({"acc@5": 0.8, "a//b": 0.1}, step=0)
    logger.log_metrics({"val/loss": 0.5, "val/Δloss": -0.25, "acc@5": 0.7}, step=1)
    client = MlflowClient(server)
    run = client.get_run(logger.run_id)
    assert set(run.data.metrics) == {"val/loss", "val/Δloss", "acc5", "acc5-2", "a/b"}
    assert history(client, logger.run_id, "val/loss") == [(0, 1.0), (1, 0.5)]
    assert history(client, logger.run_id, "val/Δloss") == [(0, -0.5), (1, -0.25)]
    assert history(client, logger.run_id, "acc5") == [(0, 0.9)]
    assert history(client, logger.run_id, "acc5-2") == [(0, 0.8), (1, 0.7)]
    messages = sorted(str(w.message) for w in said)
    assert messages == [
        "MLFlowLogger: the metric 'a//b' is written as 'a/b': MLflow does not accept it",
        "MLFlowLogger: the metric 'acc@5' is written as 'acc5-2': MLflow does not accept it, and 'acc5' is the "
        "name of the metric 'acc5'",
    ]
