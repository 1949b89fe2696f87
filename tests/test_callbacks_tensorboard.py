"""TensorBoardLogger read back through a real TensorBoard server's HTTP data API."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from callbacks import Callback, LearningRateMonitor, TensorBoardLogger
from tests.helpers.callback_tools import Scripted, loaders
from tests.helpers.distributed import free_port
from tests.helpers.trainers import quiet_trainer

pytestmark = pytest.mark.slow  # every test here starts processes

SCORES = [0.3, 0.7, 0.5]


class Halving(Scripted):
    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}


class Recorder(Callback):
    """What the trainer handed to the loggers: {tag: [(step, value), ...]}."""

    def __init__(self) -> None:
        self.seen: dict[str, list[tuple[int, float]]] = {}

    def on_log_metrics(self, trainer: Any, module: Any, metrics: dict[str, torch.Tensor], step: int) -> None:
        for key, value in metrics.items():
            self.seen.setdefault(key, []).append((step, float(value)))


@pytest.fixture
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Recorder, TensorBoardLogger]]:
    root = tmp_path_factory.mktemp("tb")
    logger, recorder = TensorBoardLogger(save_dir=root, name="run", version=""), Recorder()
    config = OmegaConf.create({"model": {"lr": 0.1, "hidden": 4}, "seed": 7, "tags": ["a", "b"]})
    trainer = quiet_trainer(
        callbacks=[logger, LearningRateMonitor(), recorder], max_epochs=3, log_every_n_steps=1, config=config
    )
    train, val = loaders()
    module = Halving(SCORES)
    trainer.fit(module, train, val)
    trainer.validate(module, val)  # later stages of the run go into the same file
    yield root, recorder, logger
    logger.close()


@pytest.fixture
def server(run_dir: tuple[Path, Recorder, TensorBoardLogger]) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", str(run_dir[0]), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--load_fast=false", "--reload_interval", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _get(url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _wait_for_tags(base: str, wanted: set[str], deadline_s: float = 90.0) -> dict[str, Any]:
    end = time.monotonic() + deadline_s
    last: Any = None
    while time.monotonic() < end:
        try:
            last = _get(f"{base}/data/plugin/scalars/tags")
            if last and wanted <= set(next(iter(last.values()))):
                return dict(last)
        except OSError:
            pass  # not listening yet
        time.sleep(0.5)
    raise AssertionError(f"TensorBoard did not show {wanted} in time; last answer: {last}")


@pytest.mark.timeout(150)
def test_tensorboard_serves_what_was_logged(run_dir: tuple[Path, Recorder, TensorBoardLogger], server: str) -> None:
    _, recorder, logger = run_dir
    assert len(list(Path(logger.log_dir).glob("events.out.tfevents.*"))) == 1  # one tidy file per run
    tags = _wait_for_tags(server, {"train/loss", "val/loss", "val/score", "epoch", "lr-SGD"})
    assert list(tags) == ["run"]  # everything in one run: the logger's folder
    assert set(tags["run"]) == {"train/loss", "val/loss", "val/score", "epoch", "lr-SGD"}

    def scalars(tag: str) -> list[tuple[int, float]]:
        query = urllib.parse.urlencode({"run": "run", "tag": tag})
        return [(step, value) for _, step, value in _get(f"{server}/data/plugin/scalars/scalars?{query}")]

    # Every value the trainer handed to loggers is served back at the same step (float32 storage).
    for tag in ("train/loss", "val/loss", "val/score", "lr-SGD"):
        served = scalars(tag)
        assert [s for s, _ in served] == [s for s, _ in recorder.seen[tag]], tag
        assert [v for _, v in served] == pytest.approx([v for _, v in recorder.seen[tag]], rel=1e-6), tag
    assert [s for s, _ in scalars("train/loss")] == list(range(12))  # per optimizer step, from 0
    # Validation per epoch at the step its epoch ended; the trailing validate() at the count of
    # steps taken, as Lightning's (its ``_batches_that_stepped``).
    val_scores = [(3, 0.3), (7, 0.7), (11, 0.5), (12, 0.5)]
    assert scalars("val/score") == [(step, pytest.approx(value)) for step, value in val_scores]
    assert scalars("lr-SGD") == [(0, pytest.approx(0.1)), (4, pytest.approx(0.05)), (8, pytest.approx(0.025))]
    epochs = dict(scalars("epoch"))
    assert (epochs[3], epochs[7], epochs[11]) == (0.0, 1.0, 2.0)

    # HPARAMS: the flattened config, linked to the final validation metrics.
    experiment = _get(f"{server}/data/plugin/hparams/experiment", {"experimentName": ""})
    assert {h["name"] for h in experiment["hparamInfos"]} == {"model/lr", "model/hidden", "seed", "tags"}
    assert {m["name"]["tag"] for m in experiment["metricInfos"]} == {"val/loss", "val/score"}
    groups = _get(
        f"{server}/data/plugin/hparams/session_groups",
        {"experimentName": "", "allowedStatuses": ["STATUS_SUCCESS"], "startIndex": 0, "sliceSize": 10},
    )["sessionGroups"]
    assert len(groups) == 1
    assert groups[0]["hparams"] == {"model/lr": 0.1, "model/hidden": 4.0, "seed": 7.0, "tags": "['a', 'b']"}
    metrics = {m["name"]["tag"]: m["value"] for m in groups[0]["metricValues"]}
    assert metrics["val/score"] == pytest.approx(0.5)
    assert metrics["val/loss"] == pytest.approx(recorder.seen["val/loss"][-1][1], rel=1e-6)

    # The resolved config as text.
    text_tags = _get(f"{server}/data/plugin/text/tags")
    assert text_tags == {"run": ["config/text_summary"]}  # add_text's tag naming
    query = urllib.parse.urlencode({"run": "run", "tag": "config/text_summary"})
    (entry,) = _get(f"{server}/data/plugin/text/text?{query}")
    assert "lr: 0.1" in entry["text"] and "seed: 7" in entry["text"]
