"""What a newcomer's own project meets under ``geartrain``: settings that would do nothing, names typed
wrong, one process where several were meant, and an error in their own code.

Each case runs the command as a user runs it, in a folder of its own outside the repository (the
processes start together, so the module costs one run's time).
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO_ROOT, command_server
from tests.helpers.cli import run_many
from trainer import Trainer

NET = """
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import DataModule, TrainModule


class Ramp(DataModule):
    def __init__(self, cache=None):
        super().__init__()
        self.cache = cache

    def setup(self, stage):
        if self.cache is not None:  # the user's own code failing (data.path would be refused before it runs)
            torch.load(self.cache)
        x = torch.linspace(-1, 1, 64).unsqueeze(1)
        self.train_set, self.val_set = TensorDataset(x, 3 * x), TensorDataset(x[::8], 3 * x[::8])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=16, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=16)


class Line(TrainModule):
    def __init__(self, lr: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])
"""

OWN = [
    "--config-dir",
    "my_conf",
    "model=line",
    "data=ramp",
    "trainer.max_epochs=2",
    "trainer.enable_progress_bar=false",
]
CASES = {
    "optim_ignored": [*OWN, "optim.lr=5.0"],
    "monitor_typo": [*OWN, "callbacks.model_checkpoint.monitor=val/mse"],
    "ranked_by_own_metric": [
        *OWN,
        "callbacks.model_checkpoint.monitor=val/loss",
        "callbacks.model_checkpoint.mode=min",
        "strategy=ddp",
    ],
    # What the one-process note says to add (trainer.devices=2, checked below), followed.
    "ddp_as_hinted": [*OWN, "strategy=ddp", "trainer.devices=2"],
    "fsdp_as_hinted": [*OWN, "strategy=fsdp", "trainer.devices=2"],
    "error_in_own_code": [*OWN, "data.cache=missing.pt"],
    "error_in_own_code_ddp": [*OWN, "data.cache=missing.pt", "strategy=ddp", "trainer.devices=2"],
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[int, str, Path]]]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1", "COLUMNS": "120"}
    env.pop("HYDRA_FULL_ERROR", None)
    jobs = {}
    for name, args in CASES.items():
        cwd = tmp_path_factory.mktemp(name)
        (cwd / "my_project").mkdir()
        (cwd / "my_project" / "net.py").write_text(textwrap.dedent(NET))
        for group, text in {"model/line": "_target_: my_project.net.Line\n", "data/ramp": RAMP}.items():
            (cwd / "my_conf" / group).parent.mkdir(parents=True, exist_ok=True)
            (cwd / "my_conf" / f"{group}.yaml").write_text(text)
        jobs[name] = (cwd, args, None)
    yield run_many(jobs, timeout=280, env=env)


RAMP = "_target_: my_project.net.Ramp\ncache: null\n"


@pytest.mark.slow
def test_an_optim_override_the_model_ignores_is_refused(outcomes: dict[str, tuple[int, str, Path]]) -> None:
    code, output, _ = outcomes["optim_ignored"]
    assert code == 1, output[-3000:]
    assert "optim.lr=5.0: does nothing here: my_project.net.Line builds its own optimizer" in output, output
    assert "Error executing job" not in output and "Traceback" not in output, output


@pytest.mark.slow
def test_an_unused_optim_group_is_not_recorded_as_applied(outcomes: dict[str, tuple[int, str, Path]]) -> None:
    code, output, cwd = outcomes["ranked_by_own_metric"]
    assert code == 0, output[-3000:]
    (last,) = cwd.glob("outputs/*/*/checkpoints/last.ckpt")
    recorded = torch.load(last, weights_only=True)["config"]
    assert "optim" not in recorded and recorded["model"]["_target_"] == "my_project.net.Line", recorded.keys()
    # trainer.precision: null in the config means the strategy's: the precision in force is recorded.
    assert recorded["trainer"]["precision"] == recorded["strategy"]["precision"] == "32-true"


@pytest.mark.slow
def test_a_monitor_set_by_the_user_must_be_logged(outcomes: dict[str, tuple[int, str, Path]]) -> None:
    code, output, _ = outcomes["monitor_typo"]
    assert code == 1, output[-3000:]
    message = output[output.index("geartrain: error:") :]
    assert "ModelCheckpoint(monitor='val/mse'): that metric was never logged" in message, message
    # The learning-rate monitor's value is a callback metric too, as in Lightning.
    assert "logged: lr-SGD, train/loss, val/loss" in message and "monitor=val/loss" in message, message
    assert len(message.strip().splitlines()) <= 3, message


@pytest.mark.slow
def test_the_best_checkpoint_is_named_after_its_own_monitor(outcomes: dict[str, tuple[int, str, Path]]) -> None:
    code, output, cwd = outcomes["ranked_by_own_metric"]
    assert code == 0, output[-3000:]
    names = sorted(p.name for p in cwd.glob("outputs/*/*/checkpoints/*.ckpt"))
    best = [n for n in names if n != "last.ckpt"]
    assert len(best) == 1 and "-val_loss=0." in best[0] and "nan" not in best[0], names


@pytest.mark.slow
def test_ddp_without_devices_on_a_cpu_says_it_is_one_process(outcomes: dict[str, tuple[int, str, Path]]) -> None:
    if torch.cuda.is_available():
        pytest.skip("with a GPU, devices=auto is every GPU")
    _, output, _ = outcomes["ranked_by_own_metric"]
    lines = [line for line in output.splitlines() if line.startswith("strategy=ddp:")]
    assert lines == [
        "strategy=ddp: 1 process on cpu, precision 32-true; no GPU here, so devices=auto is one process: "
        "add trainer.devices=2 for two processes on this CPU"
    ], output[:2000]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_the_one_process_hint_trains_two_processes_when_followed(
    outcomes: dict[str, tuple[int, str, Path]], name: str
) -> None:
    from omegaconf import OmegaConf

    from trainer.cli.advice import one_process_note

    if torch.cuda.is_available():
        pytest.skip("with a GPU, devices=auto is every GPU")
    note = one_process_note(OmegaConf.create({"strategy": {"name": name}, "trainer": {}}), 1, name)
    assert note is not None and "add trainer.devices=2 for two processes" in note, note
    assert CASES[f"{name}_as_hinted"] == [*OWN, f"strategy={name}", "trainer.devices=2"]
    code, output, _ = outcomes[f"{name}_as_hinted"]
    assert code == 0, output[-3000:]
    assert f"strategy={name}: 2 processes on cpu, precision 32-true\n" in output, output[:2000]


@pytest.mark.parametrize("name", ["single", "single_device", "amp", "dp", "model_parallel"])
def test_no_hint_where_more_devices_would_not_run(name: str) -> None:
    """A one-process strategy refuses trainer.devices=2; model_parallel needs a model made for it too."""
    from omegaconf import OmegaConf

    from trainer.cli.advice import one_process_note

    assert one_process_note(OmegaConf.create({"strategy": {"name": name}, "trainer": {}}), 1, name) is None


def test_the_run_says_the_precision_it_uses_and_records_it() -> None:
    from omegaconf import OmegaConf

    from trainer.cli.advice import record_precision, run_line

    trainer = Trainer(strategy="amp", accelerator="cpu", logger=False, enable_checkpointing=False)
    config = OmegaConf.create({"strategy": {"name": "amp", "precision": None}, "trainer": {"precision": None}})
    assert run_line(config, trainer, "amp") == "strategy=amp: 1 process on cpu, precision bf16-mixed"
    recorded = record_precision(config, trainer.precision)
    assert recorded.trainer.precision == recorded.strategy.precision == "bf16-mixed"
    assert config.trainer.precision is None  # the run's own config is left as composed
    chosen = OmegaConf.create({"trainer": {"precision": "bf16-true"}})
    assert record_precision(chosen, "bf16-true") is chosen


@pytest.mark.slow
@pytest.mark.parametrize("name", ["error_in_own_code", "error_in_own_code_ddp"])
def test_an_error_in_own_code_shows_own_frames(outcomes: dict[str, tuple[int, str, Path]], name: str) -> None:
    code, output, _ = outcomes[name]
    assert code == 1, output[-3000:]
    start = output.index("Traceback")
    shown = output[start:].strip().splitlines()
    assert "your code only" in shown[0] and "HYDRA_FULL_ERROR=1" in shown[0], shown
    assert any('my_project/net.py", line' in line for line in shown), shown
    assert shown[-1].startswith("FileNotFoundError") and "missing.pt" in shown[-1], shown
    assert len(shown) <= 8, "\n".join(shown)
    for library in ("hydra", "site-packages", "trainer/", "strategies/", "Error executing job"):
        assert library not in output[start:], output[start:]


def test_a_one_device_strategy_given_two_devices_names_the_fix() -> None:
    with pytest.raises(
        ValueError, match=r"runs on one device; got devices=2: leave devices out, or use strategy='ddp'"
    ):
        Trainer(strategy="single", devices=2)


def _own_project(folder: Path) -> Path:
    (folder / "my_project").mkdir()
    (folder / "my_project" / "net.py").write_text(textwrap.dedent(NET))
    for group, text in {"model/line": "_target_: my_project.net.Line\n", "data/ramp": RAMP}.items():
        (folder / "my_conf" / group).parent.mkdir(parents=True, exist_ok=True)
        (folder / "my_conf" / f"{group}.yaml").write_text(text)
    return folder


def test_help_lists_the_users_own_groups_and_the_own_model_form(tmp_path: Path) -> None:
    from tests.helpers.cli import run_geartrain

    result = run_geartrain("--help", "--config-dir", "my_conf", cwd=_own_project(tmp_path), timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    groups = {line.split(":")[0]: line for line in result.stdout.splitlines() if ": " in line}
    assert "line" in groups["model"] and "digits" in groups["model"], groups.get("model")
    assert "ramp" in groups["data"], groups.get("data")
    assert not any(name.startswith("schema/") for name in groups), sorted(groups)
    assert "'~model' +model._target_=my_project.Net" in result.stdout
    assert "README" not in result.stdout  # an installed user may have none


def test_version_is_geartrains(tmp_path: Path) -> None:
    from importlib.metadata import version

    from tests.helpers.cli import run_geartrain

    result = run_geartrain("--version", cwd=tmp_path, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == f"geartrain {version('geartrain')}", result


def test_config_dir_may_come_after_the_overrides(tmp_path: Path) -> None:
    from tests.helpers.cli import run_geartrain

    result = run_geartrain(
        "model=line", "--config-dir", "my_conf", "data=ramp", "--cfg", "job", cwd=_own_project(tmp_path), timeout=90
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "_target_: my_project.net.Line" in result.stdout and "_target_: my_project.net.Ramp" in result.stdout


@pytest.mark.parametrize("name", ["callbacks", "strategies"])
def test_a_users_file_named_like_a_geartrain_package_is_named(tmp_path: Path, name: str) -> None:
    (tmp_path / f"{name}.py").write_text("value = 1\n")
    (tmp_path / "train.py").write_text("from trainer import Trainer\n")
    result = command_server.run(
        ["train.py"], tmp_path, dict(os.environ), 120
    )  # ``python train.py``, from the command server
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert f"{tmp_path / name}.py hides geartrain's package '{name}': rename it (e.g. my_{name}.py)" in last, last


@pytest.mark.slow
def test_resuming_with_ckpt_path_last_continues_the_run_and_its_curve(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    from tests.helpers.cli import run_dirs, run_geartrain

    project = _own_project(tmp_path)
    first = run_geartrain(
        *OWN[:-2], "task=fit", "trainer.max_epochs=1", "trainer.enable_progress_bar=false", cwd=project
    )
    assert first.returncode == 0, first.stderr[-3000:]
    # The packaged monitor (val/acc) is not logged by this model: said once, in geartrain's words.
    warned = [line for line in first.stderr.splitlines() if "val/acc" in line]
    assert warned and warned[0].startswith("geartrain: warning: ModelCheckpoint(monitor='val/acc')"), first.stderr
    assert "_monitor.py" not in first.stderr
    second = run_geartrain(
        *OWN[:-2],
        "task=fit",
        "trainer.max_epochs=2",
        "ckpt_path=last",
        "trainer.enable_progress_bar=false",
        cwd=project,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    (run,) = run_dirs(project)
    assert f"the run continues in {run.relative_to(project)}" in second.stdout, second.stdout[-2000:]
    assert not (run / "cli.log").exists()  # Hydra's log file, empty
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 2
    runs = EventMultiplexer().AddRunsFromDirectory(str(project / "outputs"))
    runs.Reload()
    assert list(runs.Runs()) == [str((run / "tensorboard").relative_to(project / "outputs"))]
    steps = [event.step for event in runs.Scalars(next(iter(runs.Runs())), "val/loss")]
    assert steps == sorted(steps) and len(steps) == 2 and steps[0] < steps[1], steps
