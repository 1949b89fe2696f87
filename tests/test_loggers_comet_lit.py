"""CometLogger and LitLogger against fakes of their client packages (``comet_ml``, ``litlogger``):
what a fit hands them equals what the trainer logged; rank 0 only; pickling; the missing package.
WandbLogger's media methods against a fake ``wandb`` (its tracker tests use the real one, offline)."""

from __future__ import annotations

import pickle
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import CometLogger, LitLogger, ModelCheckpoint, NeptuneLogger
from tests.helpers.callback_tools import Recorder, Scripted, loaders
from tests.helpers.trainers import quiet_trainer


class Series:
    def __init__(self) -> None:
        self.points: list[tuple[Any, int]] = []

    def append(self, value: Any, step: int) -> None:
        self.points.append((value, step))


class LitExperiment:
    """``litlogger.Experiment``: a mapping of series (metrics) and values (metadata, files, models)."""

    made: list[LitExperiment] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.name = kwargs["name"]
        self.url = "https://lightning.ai/x"
        self.series: dict[str, Series] = {}
        self.items: list[tuple[str, Any]] = []
        self.finalized: list[str | None] = []
        self.urls_printed = 0
        LitExperiment.made.append(self)

    def __getitem__(self, key: str) -> Series:
        return self.series.setdefault(key, Series())

    def __setitem__(self, key: str, value: Any) -> None:
        self.items.append((key, value))

    def print_url(self) -> None:
        self.urls_printed += 1

    def finalize(self, status: str | None) -> None:
        self.finalized.append(status)


class LitModel:
    def __init__(self, obj: Any, version: str | None = None, **kwargs: Any) -> None:
        self.obj, self.version, self.kwargs = obj, version, kwargs


class CometExperiment:
    """What ``comet_ml.start`` returns, with the integration methods Lightning's logger calls."""

    def __init__(self, **kwargs: Any) -> None:
        self.start_kwargs = kwargs
        self.project_name = kwargs.get("project") or "Uncategorized"
        self.metrics: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.parameters: list[dict[str, Any]] = []
        self.graphs: list[Any] = []
        self.others: dict[str, Any] = {}
        self.flushed = 0

    def get_key(self) -> str:
        return "k" * 32

    def log_other(self, key: str, value: Any) -> None:
        self.others[key] = value

    def __internal_api__log_metrics__(self, metrics: dict[str, Any], **kwargs: Any) -> None:
        self.metrics.append((dict(metrics), kwargs))

    def __internal_api__log_parameters__(self, **kwargs: Any) -> None:
        self.parameters.append(kwargs)

    def __internal_api__set_model_graph__(self, **kwargs: Any) -> None:
        self.graphs.append(kwargs)

    def flush(self) -> None:
        self.flushed += 1


class ExperimentConfig:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.offline_directory = kwargs.get("offline_directory")


@pytest.fixture
def litlogger(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    module = types.ModuleType("litlogger")
    module.Experiment = LitExperiment  # type: ignore[attr-defined]
    module.Model = LitModel  # type: ignore[attr-defined]
    module.File = lambda path: ("file", path)  # type: ignore[attr-defined]
    generator = types.ModuleType("litlogger.generator")
    generator._create_name = lambda: "brave-otter"  # type: ignore[attr-defined]
    module.generator = generator  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "litlogger", module)
    monkeypatch.setitem(sys.modules, "litlogger.generator", generator)
    LitExperiment.made = []
    yield module


@pytest.fixture
def comet_ml(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType("comet_ml")
    module.started = []  # type: ignore[attr-defined]

    def start(**kwargs: Any) -> CometExperiment:
        module.started.append(CometExperiment(**kwargs))  # type: ignore[attr-defined]
        return module.started[-1]  # type: ignore[attr-defined,no-any-return]

    module.start = start  # type: ignore[attr-defined]
    module.ExperimentConfig = ExperimentConfig  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "comet_ml", module)
    return module


def _fit(logger: Any, root: Path, *extra: Any) -> Recorder:
    recorder = Recorder()
    train, val = loaders()
    trainer = quiet_trainer(root, callbacks=[logger, recorder, *extra], max_epochs=2, log_every_n_steps=1)
    trainer.fit(Scripted(lr=0.05), train, val)
    return recorder


def test_litlogger_gets_every_value_the_trainer_logged_and_uploads_the_checkpoints(
    litlogger: types.ModuleType, tmp_path: Path
) -> None:
    logger = LitLogger(root_dir=tmp_path / "logs", teamspace="team", metadata={"seed": 1}, log_model=True)
    assert logger.name == "brave-otter" and logger.version is None  # no experiment yet
    assert logger.log_dir == logger.save_dir == str(tmp_path / "logs" / "brave-otter")
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/loss", save_top_k=1)
    recorder = _fit(logger, tmp_path, checkpoint)

    (experiment,) = LitExperiment.made
    assert ":" not in str(logger.version) and experiment.name == f"brave-otter-{logger.version}"
    assert experiment.kwargs["teamspace"] == "team" and experiment.kwargs["metadata"] == {"seed": "1"}
    assert experiment.kwargs["log_dir"] == logger.log_dir and experiment.urls_printed == 1
    logged = {k: [(s, pytest.approx(v)) for v, s in series.points] for k, series in experiment.series.items()}
    assert logged == {k: recorder.of(k) for k, _, _ in recorder.rows}
    assert ("lr", "0.05") in experiment.items  # hyperparameters as text
    models = [v for k, v in experiment.items if isinstance(v, LitModel)]
    assert [m.obj for m in models] == [checkpoint.best_model_path]  # uploaded once, when finalized
    assert experiment.finalized == ["success"]


def test_litlogger_on_another_rank_starts_nothing(
    litlogger: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    logger = LitLogger(name="x", root_dir=tmp_path)
    logger.log_metrics({"a": torch.tensor(1.0)}, step=0)
    logger.experiment["a"].append(1.0, step=0)
    logger.finalize("success")
    assert LitExperiment.made == [] and list(tmp_path.iterdir()) == []


def test_litlogger_pickles_without_its_experiment(litlogger: types.ModuleType, tmp_path: Path) -> None:
    logger = LitLogger(name="x", root_dir=tmp_path)
    logger.log_metrics({"a": 1.0})
    copy = pickle.loads(pickle.dumps(logger))
    assert copy._experiment is None and copy.version == logger.version and copy.name == "x"


def test_neptune_logger_is_retired_as_in_lightning() -> None:
    with pytest.raises(RuntimeError, match=r"(?s)NeptuneLogger is no longer supported.*LitLogger"):
        NeptuneLogger(project="x")


def test_comet_logger_gets_every_value_the_trainer_logged(comet_ml: types.ModuleType, tmp_path: Path) -> None:
    logger = CometLogger(project="p", workspace="w", experiment_name="run", online=False)
    (experiment,) = comet_ml.started
    assert experiment.start_kwargs["project"] == "p" and experiment.start_kwargs["online"] is False
    assert experiment.start_kwargs["experiment_config"].kwargs == {"name": "run", "disabled": True}
    assert experiment.others == {"Created from": "pytorch-lightning"}
    recorder = _fit(logger, tmp_path)

    assert comet_ml.started == [experiment]  # started once, when built
    seen: dict[str, list[tuple[int, float]]] = {}
    for metrics, kwargs in experiment.metrics:
        assert kwargs["framework"] == "pytorch-lightning" and "epoch" not in metrics
        for key, value in metrics.items():
            seen.setdefault(key, []).append((kwargs["step"], pytest.approx(value)))
    assert seen == {k: recorder.of(k) for k, _, _ in recorder.rows if k != "epoch"}
    assert experiment.parameters[0]["parameters"] == {"lr": 0.05}
    assert experiment.flushed >= 1
    assert logger.version == "k" * 32 and logger.name == "p"


def test_comet_logger_pickles_its_key_and_on_another_rank_starts_nothing(
    comet_ml: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    logger = CometLogger(project="p")
    copy = pickle.loads(pickle.dumps(logger))
    assert copy._experiment is None and copy._experiment_key == "k" * 32
    monkeypatch.setenv("RANK", "1")
    other = CometLogger(project="p")
    other.log_metrics({"a": 1.0}, step=0)
    other.finalize("success")
    assert len(comet_ml.started) == 1 and other.version is None


@pytest.mark.parametrize(("cls", "package"), [(CometLogger, "comet-ml"), (LitLogger, "litlogger")])
def test_a_missing_client_package_is_named(cls: type, package: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("comet_ml", "litlogger"):
        monkeypatch.setitem(sys.modules, module, None)  # type: ignore[arg-type]
    with pytest.raises(ModuleNotFoundError, match=f"Requirement '{package}.*pip install"):
        cls(name="x") if cls is LitLogger else cls()


class Media:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Media) and (type(self), self.args, self.kwargs) == (
            type(other),
            other.args,
            other.kwargs,
        )


class Run:
    id = "run1"

    def __init__(self, root: Path) -> None:
        self.dir = str(root / "wandb" / "run-x-run1" / "files")
        self.logged: list[dict[str, Any]] = []
        self.config = types.SimpleNamespace(update=lambda *a, **k: None)

    def log(self, values: dict[str, Any]) -> None:
        self.logged.append(values)

    def define_metric(self, *args: Any, **kwargs: Any) -> None:
        pass


def test_wandb_media_go_to_the_run_as_wandb_objects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wandb = types.ModuleType("wandb")
    run = Run(tmp_path)
    wandb.init = lambda **kwargs: run  # type: ignore[attr-defined]
    wandb.run = None  # type: ignore[attr-defined]
    for kind in ("Table", "Image", "Audio", "Video"):
        setattr(wandb, kind, type(kind, (Media,), {}))
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    from callbacks import WandbLogger

    logger = WandbLogger(save_dir=tmp_path, prefix="p")
    logger.log_text("samples", columns=["in", "out"], data=[["a", "b"]])
    logger.log_image("pics", ["1.jpg", "2.jpg"], step=5, caption=["one", "two"])
    logger.log_audio("clips", ["1.wav"])
    with pytest.raises(ValueError, match="Expected 2 items but only found 1 for caption"):
        logger.log_video("films", ["1.mp4", "2.mp4"], caption=["one"])
    with pytest.raises(TypeError, match='Expected a list as "images"'):
        logger.log_image("pics", "1.jpg")  # type: ignore[arg-type]
    table, image, audio = wandb.Table, wandb.Image, wandb.Audio  # type: ignore[attr-defined]
    assert run.logged == [
        {"p-samples": table(columns=["in", "out"], data=[["a", "b"]], dataframe=None)},
        {"p-pics": [image("1.jpg", caption="one"), image("2.jpg", caption="two")], "trainer/global_step": 5},
        {"p-clips": [audio("1.wav")]},
    ]


def test_wandb_reuses_the_scripts_run_and_follows_tensorboards_steps_when_syncing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wandb = types.ModuleType("wandb")
    run = Run(tmp_path)
    metrics_defined: list[tuple[Any, ...]] = []
    run.define_metric = lambda *a, **k: metrics_defined.append((*a, *k.values()))  # type: ignore[method-assign]
    wandb.run = run  # type: ignore[attr-defined]
    wandb.init = lambda **kwargs: pytest.fail("a run is in progress: it is reused, as in Lightning")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    from callbacks import WandbLogger
    from trainer.common.errors import MisconfigurationException

    logger = WandbLogger(save_dir=tmp_path, sync_tensorboard=True)
    with pytest.warns(UserWarning, match="wandb run already in progress"):
        logger.log_metrics({"loss": 0.5}, step=3)
    assert run.logged == [{"loss": 0.5}]  # TensorBoard's events carry the step
    assert metrics_defined == [("*", "global_step")]
    with pytest.raises(MisconfigurationException, match="checkpoints cannot be uploaded in offline mode"):
        WandbLogger(offline=True, log_model=True)


def test_a_checkpoints_score_reaches_the_tracker_as_a_number_of_its_own_kind(tmp_path: Path) -> None:
    from callbacks._tracker import new_checkpoints

    best = tmp_path / "best.ckpt"
    best.write_bytes(b"x")
    callback = types.SimpleNamespace(best_model_path=str(best), best_model_score=torch.tensor(3), best_k_models={})
    (checkpoint,) = new_checkpoints(callback, {})
    assert checkpoint.score == 3 and isinstance(checkpoint.score, int)  # an int step stays an int (Lightning's)
    assert checkpoint.aliases == ["latest", "best"]
