"""TensorBoardLogger and CSVLogger with Lightning's interface: folders, experiment, methods, prefixes."""

from __future__ import annotations

import csv
import os
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from callbacks import CSVLogger, Logger, ModelCheckpoint, TensorBoardLogger
from callbacks.csv_logger import CSVWriter
from tests.helpers.callback_tools import Recorder, Scripted, loaders
from tests.helpers.trainers import quiet_trainer


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.parametrize("cls", [TensorBoardLogger, CSVLogger])
def test_runs_from_python_get_lightnings_version_folders(cls: type[Logger], tmp_path: Path) -> None:
    dirs = []
    for _ in range(2):
        logger = cls(save_dir=tmp_path)
        train, val = loaders()
        quiet_trainer(callbacks=[logger], max_epochs=1).fit(Scripted(), train, val)
        dirs.append(logger.log_dir)
        assert logger.root_dir == os.path.join(str(tmp_path), "lightning_logs")
        assert logger.name == "lightning_logs" and logger.save_dir == str(tmp_path)
    assert dirs == [str(tmp_path / "lightning_logs" / "version_0"), str(tmp_path / "lightning_logs" / "version_1")]
    assert all(any(Path(d).iterdir()) for d in dirs)
    assert cls(save_dir=tmp_path).version == 2
    assert cls(save_dir=tmp_path, name="exp", version=7).log_dir == str(tmp_path / "exp" / "version_7")
    assert cls(save_dir=tmp_path, name="", version="run").log_dir == str(tmp_path / "run")
    assert cls(save_dir=tmp_path, name="x", version="").log_dir == str(tmp_path / "x")


@pytest.mark.parametrize("cls", [TensorBoardLogger, CSVLogger])
def test_a_logger_built_on_another_rank_writes_nothing(
    cls: type[Logger], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")  # as torchrun sets it, before any trainer exists
    logger = cls(save_dir=tmp_path)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.log_hyperparams({"lr": 0.1})
    logger.experiment.add_scalar("b", 1.0)
    logger.finalize("success")
    assert list(tmp_path.iterdir()) == []


def test_version_is_chosen_in_the_folder_the_trainer_supplies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lightning_logs" / "version_4").mkdir(parents=True)  # in the working directory
    logger = CSVLogger()  # save_dir: the trainer's default_root_dir, known at setup
    assert logger.version == 5  # looked up in ".", not kept
    train, val = loaders()
    quiet_trainer(tmp_path / "root", callbacks=[logger], max_epochs=1).fit(Scripted(), train, val)
    assert logger.log_dir == str(tmp_path / "root" / "lightning_logs" / "version_0")
    assert logger.path.exists()


def test_geartrain_command_config_writes_into_the_run_directory() -> None:
    for kind, folder in (("tensorboard", "tensorboard"), ("csv", "csv")):
        conf = yaml.safe_load(Path("conf/logger", f"{kind}.yaml").read_text())[kind]
        assert conf["name"] == folder and conf["version"] == ""  # <run dir>/<folder>, no version_N


def test_tensorboard_experiment_metrics_hyperparameters_and_prefix(tmp_path: Path) -> None:
    logger = TensorBoardLogger(save_dir=tmp_path, prefix="p", sub_dir="sub")
    assert isinstance(logger.experiment, SummaryWriter)
    assert logger.log_dir == str(tmp_path / "lightning_logs" / "version_0" / "sub")
    assert logger.group_separator == "/" and logger.sub_dir == "sub"
    logger.log_metrics({"loss": torch.tensor(0.5), "acc": 0.25}, step=3)
    logger.log_hyperparams(Namespace(lr=0.1, net={"width": 4}))
    logger.save()
    logger.finalize("success")
    scalars = _scalars(Path(logger.log_dir))
    assert scalars["p-loss"] == [(3, 0.5)] and scalars["p-acc"] == [(3, 0.25)]
    assert scalars["p-hp_metric"] == [(0, -1.0)]  # default_hp_metric, as Lightning writes it
    saved = yaml.safe_load((Path(logger.log_dir) / "hparams.yaml").read_text())
    assert saved == {"lr": 0.1, "net": {"width": 4}}  # nested, as Lightning's hparams.yaml


def test_tensorboard_kwargs_go_to_the_summary_writer_and_unknown_ones_are_refused(tmp_path: Path) -> None:
    logger = TensorBoardLogger(save_dir=tmp_path, filename_suffix=".mine", max_queue=3)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.finalize("success")
    events = [p for p in Path(logger.log_dir).iterdir() if p.name != "hparams.yaml"]  # `{}`, as Lightning's
    assert [p.name.endswith(".mine") for p in events] == [True]
    with pytest.raises(TypeError, match=r"flush_every is not an option.*flush_secs"):
        TensorBoardLogger(save_dir=tmp_path, flush_every=3)


def test_tensorboard_without_default_hp_metric_writes_no_placeholder(tmp_path: Path) -> None:
    logger = TensorBoardLogger(save_dir=tmp_path, default_hp_metric=False)
    logger.log_hyperparams({"lr": 0.1})
    logger.log_hyperparams({"lr": 0.1}, metrics={"best": 2.0})
    logger.finalize("success")
    assert _scalars(Path(logger.log_dir)) == {"best": [(0, 2.0)]}


def test_tensorboard_log_graph_traces_the_example_input(tmp_path: Path) -> None:
    class WithExample(Scripted):
        example_input_array = torch.zeros(2, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x)

    logger = TensorBoardLogger(save_dir=tmp_path, log_graph=True)
    train, val = loaders()
    quiet_trainer(callbacks=[logger], max_epochs=1).fit(WithExample(), train, val)
    logger.finalize("success")
    acc = EventAccumulator(str(logger.log_dir))
    acc.Reload()
    assert acc.Tags()["graph"]
    without = TensorBoardLogger(save_dir=tmp_path, log_graph=True)
    with pytest.warns(UserWarning, match="example_input_array` attribute is not set"):  # Lightning's warning
        without.log_graph(torch.nn.Linear(1, 1))
    with pytest.warns(UserWarning, match="can't be traced by TensorBoard"):
        without.log_graph(torch.nn.Linear(1, 1), {"x": 1})  # type: ignore[arg-type]
    alone = WithExample()  # not attached to a trainer: traced all the same
    without.log_graph(alone, torch.zeros(1, 4))


def test_csv_experiment_is_the_writer_and_rows_reach_disk_every_n_steps(tmp_path: Path) -> None:
    logger = CSVLogger(save_dir=tmp_path, prefix="p", flush_logs_every_n_steps=2)
    assert isinstance(logger.experiment, CSVWriter)
    logger.log_metrics({"a": 1.0}, step=0)
    assert not logger.path.exists()  # buffered until (step + 1) % 2 == 0
    logger.log_metrics({"a": 2.0, "b": torch.tensor(3.0)}, step=1)
    with logger.path.open() as f:
        assert list(csv.DictReader(f)) == [
            {"step": "0", "p-a": "1.0", "p-b": ""},
            {"step": "1", "p-a": "2.0", "p-b": "3.0"},
        ]
    logger.log_hyperparams({"lr": 0.5})
    logger.finalize("success")
    assert yaml.safe_load((Path(logger.log_dir) / "hparams.yaml").read_text()) == {"lr": 0.5}
    assert logger.experiment.metrics_file_path == str(logger.path)


def test_csv_logger_writes_module_hyperparameters_and_flushes_at_the_end_of_fit(tmp_path: Path) -> None:
    logger = CSVLogger(save_dir=tmp_path, name="run", version="", flush_logs_every_n_steps=1000)
    train, val = loaders()
    quiet_trainer(callbacks=[logger], max_epochs=2, log_every_n_steps=1).fit(Scripted(lr=0.25), train, val)
    assert yaml.safe_load((tmp_path / "run" / "hparams.yaml").read_text()) == {"lr": 0.25}
    with (tmp_path / "run" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len([r for r in rows if r["train/loss"]]) == 8  # every step, although the buffer never filled


def test_loggers_hear_after_save_checkpoint(tmp_path: Path) -> None:
    class Heard(CSVLogger):
        def __init__(self) -> None:
            super().__init__(save_dir=tmp_path)
            self.heard: list[Any] = []

        def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
            self.heard.append((checkpoint_callback, checkpoint_callback.best_model_path))

    logger, ck = Heard(), ModelCheckpoint(dirpath=tmp_path / "ck", save_top_k=-1)
    train, val = loaders()
    quiet_trainer(callbacks=[logger, ck], max_epochs=2).fit(Scripted(), train, val)
    assert [(c, Path(p).name) for c, p in logger.heard] == [(ck, "epoch=0-step=4.ckpt"), (ck, "epoch=1-step=8.ckpt")]


def test_a_lightning_style_custom_logger_receives_what_is_logged() -> None:
    class Mine(Logger):
        def __init__(self) -> None:  # as Lightning users write them: no call to the base __init__
            self.metrics: list[tuple[int | None, dict[str, float]]] = []
            self.params: list[dict[str, Any]] = []
            self.status: list[str] = []

        @property
        def name(self) -> str:
            return "mine"

        @property
        def version(self) -> int:
            return 0

        def log_metrics(self, metrics: Any, step: int | None = None) -> None:
            self.metrics.append((step, dict(metrics)))

        def log_hyperparams(self, params: Any, metrics: Any = None) -> None:
            self.params.append(dict(params))

        def finalize(self, status: str) -> None:
            self.status.append(status)

    mine = Mine()
    train, val = loaders()
    quiet_trainer(callbacks=[mine], max_epochs=1, log_every_n_steps=2).fit(Scripted(lr=0.5), train, val)
    assert mine.params == [{"lr": 0.5}]
    assert [step for step, m in mine.metrics if "train/loss" in m] == [1, 3]
    assert any("val/loss" in m for _, m in mine.metrics)
    assert mine.status == ["success"]


@pytest.mark.slow
def test_under_ddp_rank_zero_writes_into_the_version_the_caller_sees(tmp_path: Path) -> None:
    logger = CSVLogger(save_dir=tmp_path)
    train, val = loaders()
    trainer = quiet_trainer(callbacks=[logger], max_epochs=1, strategy="ddp_spawn", devices=2)
    trainer.fit(Scripted(), train, val)
    assert logger.log_dir == str(tmp_path / "lightning_logs" / "version_0")
    assert _names_under(tmp_path) == ["lightning_logs/version_0/hparams.yaml", "lightning_logs/version_0/metrics.csv"]


def _names_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_csv_writer_appends_what_it_keeps_and_rewrites_only_for_a_new_column(tmp_path: Path) -> None:
    import trainer.lightning as pl

    assert pl.loggers.csv_logs.ExperimentWriter is CSVWriter
    logger = CSVLogger(save_dir=tmp_path, flush_logs_every_n_steps=1)
    assert isinstance(logger.log_dir, str)  # Lightning's type
    logger.log_metrics({"a": 1.0})  # no step: the number of rows kept (0), written at once
    assert logger.experiment.metrics == []  # forgotten once written
    logger.log_metrics({"a": 2.0, "b": 3.0}, step=1)  # a new column: the file is rewritten, rows kept
    logger.log_metrics({"b": 4.0}, step=2)
    with open(logger.experiment.metrics_file_path, newline="") as f:
        assert list(csv.DictReader(f)) == [
            {"step": "0", "a": "1.0", "b": ""},
            {"step": "1", "a": "2.0", "b": "3.0"},
            {"step": "2", "a": "", "b": "4.0"},
        ]


def test_csv_hyperparameters_are_written_at_once_even_none(tmp_path: Path) -> None:
    logger = CSVLogger(save_dir=tmp_path, name=None)
    logger.log_hyperparams()  # Lightning's default: an empty hparams.yaml
    assert yaml.safe_load((tmp_path / "version_0" / "hparams.yaml").read_text()) == {}
    logger.log_hyperparams({"lr": 0.1})
    assert yaml.safe_load((tmp_path / "version_0" / "hparams.yaml").read_text()) == {"lr": 0.1}


def test_csv_writer_on_a_used_folder_warns_and_starts_a_new_file(tmp_path: Path) -> None:
    (tmp_path / "exp" / "version_0").mkdir(parents=True)
    (tmp_path / "exp" / "version_0" / "metrics.csv").write_text("step,old\n0,1\n")
    logger = CSVLogger(save_dir=tmp_path, name="exp", version=0)
    with pytest.warns(UserWarning, match="exists and is not empty"):
        logger.log_metrics({"new": 1.0}, step=99)
    logger.save()
    assert (tmp_path / "exp" / "version_0" / "metrics.csv").read_text().splitlines() == ["step,new", "99,1.0"]


def test_a_custom_logger_without_a_local_folder_has_no_log_dir(tmp_path: Path) -> None:
    class Remote(Logger):
        @property
        def save_dir(self) -> str | None:  # type: ignore[override]
            return None

        def log_metrics(self, metrics: Any, step: int | None = None) -> None:
            self.rows = [*getattr(self, "rows", []), (step, dict(metrics))]

        def log_hyperparams(self, params: Any, metrics: Any = None) -> None:
            pass

    logger = Remote()
    assert (logger.root_dir, logger.log_dir) == (None, None)  # Lightning's answer: no local files
    train, val = loaders()
    trainer = quiet_trainer(tmp_path, callbacks=[logger], max_epochs=1, log_every_n_steps=1)
    trainer.fit(Scripted(), train, val)
    assert trainer.log_dir == str(tmp_path)
    assert [step for step, _ in logger.rows] == [0, 1, 2, 3, 3]  # four steps, then validation at step 3


def test_the_run_hyperparameters_merge_the_data_modules_and_a_clash_is_refused(tmp_path: Path) -> None:
    from trainer import DataModule

    class Data(DataModule):
        def __init__(self, lr: float, batch: int = 8) -> None:
            super().__init__()
            self.save_hyperparameters()

        def train_dataloader(self) -> Any:
            return loaders()[0]

    class Heard(TensorBoardLogger):
        def log_hyperparams(self, params: Any, metrics: Any = None) -> None:
            self.heard = dict(params)  # Lightning's trainer calls this at fit start: an override sees it
            super().log_hyperparams(params, metrics)

    logger = Heard(save_dir=tmp_path)
    quiet_trainer(callbacks=[logger], max_epochs=1).fit(Scripted(lr=0.5), datamodule=Data(lr=0.5))
    assert logger.heard == {"lr": 0.5, "batch": 8}
    with pytest.raises(RuntimeError, match=r"Error while merging hparams: the keys \['lr'\]"):
        quiet_trainer(callbacks=[TensorBoardLogger(save_dir=tmp_path)], max_epochs=1).fit(
            Scripted(lr=0.5), datamodule=Data(lr=0.1)
        )


def test_the_dummy_logger_takes_any_loggers_method_and_nothing_else() -> None:
    from callbacks._logger import DummyLogger

    logger = DummyLogger()
    assert logger.log_text(key="samples", columns=["a"], data=[["x"]]) is None  # WandbLogger's method
    assert logger.log_model_artifact("model.ckpt") is None  # LitLogger's
    assert not hasattr(logger, "best_model_path") and not hasattr(logger, "dirpath")  # not a checkpoint callback


def test_a_value_logged_as_step_is_the_x_of_its_row_as_in_lightning() -> None:
    class StepAxis(Scripted):
        def on_train_epoch_end(self) -> None:
            self.log("step", 10.0 + self.current_epoch)
            self.log("custom", float(self.current_epoch))

    recorder = Recorder()
    train, val = loaders()
    quiet_trainer(callbacks=[recorder], max_epochs=2, log_every_n_steps=100).fit(StepAxis(), train, val)
    assert recorder.of("custom") == [(10, 0.0), (11, 1.0)]  # at the logged step
    assert recorder.of("step") == []  # the x-axis, not a value
    assert (3, 0.0) in recorder.of("epoch") and (10, 0.0) not in recorder.of("epoch")  # that row has no epoch


def test_the_csv_experiment_exists_from_set_up_on_rank_zero(tmp_path: Path) -> None:
    seen: list[Any] = []

    class AtSetup(Recorder):
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            seen.append(logger._experiment)  # Lightning's tests read it there

    logger = CSVLogger(save_dir=tmp_path)
    train, val = loaders()
    quiet_trainer(callbacks=[logger, AtSetup()], max_epochs=1).fit(Scripted(), train, val)
    assert isinstance(seen[0], CSVWriter) and os.path.isdir(seen[0].log_dir)


def test_tensorboard_writes_an_empty_hparams_yaml_without_hyperparameters(tmp_path: Path) -> None:
    class Bare(Scripted):
        def __init__(self) -> None:
            super().__init__()
            self._hparams = type(self.hparams)()  # no hyperparameters at all (loggers get the initial ones)
            self._hparams_initial = type(self.hparams)()

    assert not Bare().hparams
    logger = TensorBoardLogger(save_dir=tmp_path, default_hp_metric=False)
    train, val = loaders()
    quiet_trainer(callbacks=[logger], max_epochs=1).fit(Bare(), train, val)
    assert yaml.safe_load((Path(logger.log_dir) / "hparams.yaml").read_text()) == {}  # Lightning's


def test_an_evaluation_steps_row_carries_no_epoch_as_in_lightning(tmp_path: Path) -> None:
    class StepLogged(Scripted):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_step", float(batch_idx), on_step=True, on_epoch=False)

    class Heard(TensorBoardLogger):
        def log_metrics(self, metrics: Any, step: int | None = None) -> None:
            self.rows = [*getattr(self, "rows", []), (step, sorted(metrics))]
            super().log_metrics(metrics, step)

    logger = Heard(save_dir=tmp_path, default_hp_metric=False)
    _, val = loaders()
    quiet_trainer(callbacks=[logger]).validate(StepLogged(), val, verbose=False)
    assert logger.rows == [(0, ["val_step"]), (1, ["val_step"])]  # x: the evaluation steps, no epoch
