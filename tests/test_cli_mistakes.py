"""Config mistakes that used to end the ``geartrain`` command with a traceback now end it with a short message.

Before: bad ``tuner.*`` values, a missing data file, ``data.batch_size<=0``, ``trainer.num_nodes=2``
outside torchrun, an output folder that cannot be written, and a ``model_parallel`` mesh that does
not fit the processes (found only inside the workers) each printed a traceback; ``lr_find`` whose
loss was never finite advised raising ``num_training``, logged that twice and exited 0. All the
commands start at once, in folders of their own, as in test_cli_messages.py.
"""

from __future__ import annotations

import errno
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from tests.helpers.cli import run_many
from trainer.common.errors import ConfigError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LR_FIND = ("task=lr_find", "tuner.lr_find.num_training=20")


@dataclass(frozen=True)
class Mistake:
    args: tuple[str, ...]
    named: tuple[str, ...]  # what the message must name: the key, the file, the fix


MISTAKES = {
    "lr_find_mode": Mistake((*LR_FIND, "tuner.lr_find.mode=cosine"), ("tuner.lr_find.mode=cosine", "exponential")),
    "missing_data_path": Mistake(("experiment=charlm", "data.path=corpus.txt"), ("data.path=corpus.txt", "no such")),
    "batch_size_zero": Mistake(("data.batch_size=0",), ("data.batch_size=0", "from 1")),
    "num_nodes_outside_torchrun": Mistake(
        ("strategy=ddp", "trainer.num_nodes=2"), ("trainer.num_nodes=2", "torchrun --nnodes=2", "srun")
    ),
    "output_folder_not_writable": Mistake(("hydra.run.dir=a_file/run",), ("a_file", "hydra.run.dir=")),
    # An interpolated folder only Hydra can resolve, so Hydra makes it (and met the error) itself.
    "interpolated_output_folder_not_writable": Mistake(
        ("hydra.run.dir=a_file/${now:%H-%M-%S}",), ("cannot write the run directory a_file/", "hydra.run.dir=")
    ),
    "mesh_does_not_fit": Mistake(
        ("strategy=model_parallel", "trainer.devices=2", "strategy.tensor_parallel_size=3", "trainer.max_epochs=1"),
        ("tensor_parallel_size=3", "2 processes"),
    ),
    "lr_find_diverges_at_once": Mistake(
        (*LR_FIND, "tuner.lr_find.min_lr=1000", "tuner.lr_find.max_lr=10000", "logger=none"),
        ("lr_find: the loss", "too early to suggest", "lower tuner.lr_find.min_lr (now 1000)"),
    ),
    "lr_find_never_finite": Mistake(
        (*LR_FIND, "model._target_=nan_model.NanDigits", "logger=none"), ("lr_find", "not finite at any step")
    ),
}

#: The tuner values each refused by the command before anything is built (unit-checked below, fast).
TUNER_MISTAKES = [
    ("lr_find", {"mode": "cosine"}, "tuner.lr_find.mode=cosine: choose exponential or linear"),
    ("lr_find", {"min_lr": 0}, "tuner.lr_find.min_lr=0: a learning rate is a positive number"),
    ("lr_find", {"min_lr": "abc"}, "tuner.lr_find.min_lr=abc"),
    ("lr_find", {"min_lr": 0.5, "max_lr": 0.1}, "tuner.lr_find.min_lr=0.5 is not below tuner.lr_find.max_lr=0.1"),
    ("lr_find", {"num_training": 0}, "tuner.lr_find.num_training=0: the sweep needs a whole number of steps from 2"),
    ("lr_find", {"num_training": 2.5}, "tuner.lr_find.num_training=2.5"),
    ("lr_find", {"early_stop_threshold": -1}, "tuner.lr_find.early_stop_threshold=-1"),
    ("lr_find", {"num_trainin": 10}, "tuner.lr_find.num_trainin: no such option"),
    ("scale_batch_size", {"mode": "linear"}, "tuner.scale_batch_size.mode=linear: choose power or binsearch"),
    ("scale_batch_size", {"init_val": 0}, "tuner.scale_batch_size.init_val=0: a whole number from 1"),
    ("scale_batch_size", {"max_trials": -2}, "tuner.scale_batch_size.max_trials=-2"),
    ("scale_batch_size", {"steps_per_trial": 0}, "tuner.scale_batch_size.steps_per_trial=0"),
    ("scale_batch_size", {"init_val": 64, "max_val": 8}, "tuner.scale_batch_size.max_val=8 is below"),
    ("scale_batch_size", {"margin": 1.5}, "tuner.scale_batch_size.margin=1.5"),
]


@pytest.mark.parametrize(("task", "options", "said"), TUNER_MISTAKES)
def test_bad_tuner_values_are_refused_naming_the_override(task: str, options: dict[str, object], said: str) -> None:
    from trainer.cli.checks import check_tuner_options

    with pytest.raises(ConfigError) as refused:
        check_tuner_options(task, options)
    assert said in str(refused.value)


def test_the_default_tuner_values_pass() -> None:
    from omegaconf import OmegaConf

    from trainer.cli.checks import check_tuner_options

    defaults = OmegaConf.load(REPO_ROOT / "conf" / "config.yaml").tuner
    for task in ("lr_find", "scale_batch_size"):
        check_tuner_options(task, dict(defaults[task]))


NAN_MODEL = """
import torch
from examples.digits import DigitsClassifier


class NanDigits(DigitsClassifier):
    def forward(self, x):
        return super().forward(x) * float("nan")
"""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[int, str, Path]]]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    jobs = {}
    for name, mistake in MISTAKES.items():
        cwd = tmp_path_factory.mktemp(name)
        (cwd / "a_file").write_text("not a folder\n")
        (cwd / "nan_model.py").write_text(NAN_MODEL)
        jobs[name] = (cwd, ["trainer.enable_progress_bar=false", *mistake.args], None)
    yield run_many(jobs, timeout=600, env=env)


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_mistake_ends_with_a_short_message(outcomes: dict[str, tuple[int, str, Path]], name: str) -> None:
    code, output, cwd = outcomes[name]
    assert code == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    message = output[output.index("geartrain: error:") :]
    assert len(message.strip().splitlines()) <= 10, message
    for text in MISTAKES[name].named:
        assert text in message, (text, message)
    assert not (cwd / "outputs").exists(), sorted(p.relative_to(cwd).as_posix() for p in cwd.rglob("*"))


def test_lr_find_never_finite_says_it_once(outcomes: dict[str, tuple[int, str, Path]]) -> None:
    _, output, _ = outcomes["lr_find_never_finite"]
    assert output.count("not finite at any step") == 1, output[-3000:]
    assert "raise num_training" not in output


def test_lr_find_diverging_at_once_says_it_once_and_asks_for_a_lower_min_lr(
    outcomes: dict[str, tuple[int, str, Path]],
) -> None:
    """It used to advise raising num_training, which does not help, and exit 0."""
    _, output, _ = outcomes["lr_find_diverges_at_once"]
    assert output.count("too early to suggest") == 1, output[-3000:]
    assert "num_training" not in output and "suggested lr" not in output, output[-3000:]


@pytest.mark.parametrize("diverged", [True, False])
def test_lr_find_without_points_before_the_loss_blew_up_asks_for_a_lower_min_lr(diverged: bool) -> None:
    """Also when the loss went NaN at once, which never trips early_stop_threshold (the sweep runs on)."""
    from callbacks.lr_finder import LRFinderResult

    result = LRFinderResult("exponential", 1.0, 100.0, 20)
    # Diverged: past early_stop_threshold times the lowest at step 2, where the sweep stopped; else NaN from step 1.
    losses = [2.0, 5.0, 50.0] if diverged else [2.0] + [math.nan] * 19
    result.results = {"lr": [1.26**i for i in range(len(losses))], "loss": losses}
    result.diverged = diverged
    assert result.suggestion() is None
    reason = result.no_suggestion_reason(options="tuner.lr_find.")
    went = "diverged from the sweep's step 2 of 20" if diverged else "was not finite from the sweep's step 1 of 20"
    assert reason is not None and f"lr_find: the loss {went} on" in reason, reason
    assert reason.endswith("pass a lower tuner.lr_find.min_lr (now 1)") and "num_training" not in reason


def test_a_mesh_that_does_not_fit_is_refused_before_processes_start(
    outcomes: dict[str, tuple[int, str, Path]],
) -> None:
    _, output, _ = outcomes["mesh_does_not_fit"]
    assert "geartrain: error: ModelParallelStrategy:" in output, output[-3000:]
    assert "(rank " not in output  # said by the launching process, not by a worker


def test_a_read_only_run_directory_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.cli.run_dir_guard import guarded_run_dir

    def read_only(self: Path, *args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    with (
        pytest.raises(ConfigError, match=r"cannot write the run directory .*run: Read-only file system"),
        guarded_run_dir(tmp_path / "run"),
    ):
        pass


FLAKY_MODEL = '''
import torch
from hydra.core.hydra_config import HydraConfig
from examples.digits import DigitsClassifier


class Flaky(DigitsClassifier):
    """Trial 1 raises as a diverged run does; trial 2 ends with a NaN metric; the others train."""

    def training_step(self, batch, batch_idx):
        if HydraConfig.get().job.num == 1:
            raise FloatingPointError("the loss is nan at step 0")
        return super().training_step(batch, batch_idx)

    def on_validation_epoch_end(self):
        if HydraConfig.get().job.num == 2:
            self.log("val/acc", float("nan"))
'''


PARTICULAR_MODEL = '''
from hydra.core.hydra_config import HydraConfig
from examples.digits import DigitsClassifier


class Particular(DigitsClassifier):
    """Trial 0's sampled width cannot be built; trial 2 never logs the optimised metric; the others train."""

    def __init__(self, hidden=128, **kwargs):
        if HydraConfig.get().job.num == 0:
            raise ValueError(f"no model of width {hidden} here")
        super().__init__(hidden=hidden, **kwargs)

    def log(self, name, value, *args, **kwargs):
        if name != "val/acc" or HydraConfig.get().job.num != 2:
            super().log(name, value, *args, **kwargs)
'''


ALWAYS_NAN = """
from examples.digits import DigitsClassifier


class AlwaysNan(DigitsClassifier):
    def training_step(self, batch, batch_idx):
        raise FloatingPointError("the loss is nan at step 0")
"""


STUDY = ("trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
         "trainer.enable_progress_bar=false", "logger=none", "task=fit")  # fmt: skip

#: The studies of the tests below: a study's arguments and the model file its folder holds.
STUDIES: dict[str, tuple[tuple[str, ...], tuple[str, str] | None]] = {
    "flaky": (
        ("-m", "hparams_search=digits_optuna", "hydra.sweeper.n_trials=4", "model._target_=flaky.Flaky", *STUDY),
        ("flaky.py", FLAKY_MODEL),
    ),
    "always_nan": (
        ("-m", "hparams_search=digits_optuna", "hydra.sweeper.n_trials=2", "model._target_=always_nan.AlwaysNan",
         *STUDY),
        ("always_nan.py", ALWAYS_NAN),
    ),
    "particular": (
        ("-m", "hparams_search=digits_optuna", "hydra.sweeper.n_trials=3", "model._target_=particular.Particular",
         *STUDY),
        ("particular.py", PARTICULAR_MODEL),
    ),
    "config_mistake": (
        ("-m", "hparams_search=digits_optuna", "hydra.sweeper.n_trials=3", "optimized_metric=val/accuracy", *STUDY),
        None,
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, Path]]:
    """The ``geartrain -m`` studies, started at once, each in a folder of its own."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    jobs = {}
    for name, (args, model) in STUDIES.items():
        cwd = tmp_path_factory.mktemp(name)
        if model is not None:
            (cwd / model[0]).write_text(model[1])
        jobs[name] = (cwd, list(args), None)
    return run_many(jobs, timeout=600, env=env)


def test_a_study_goes_on_past_failed_trials_and_says_why(studies: dict[str, tuple[int, str, Path]]) -> None:
    """Item 8: one NaN trial used to end the whole study with a chained traceback."""
    code, output, _ = studies["flaky"]
    assert code == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "study: 2 of 4 trials failed:" in output, output[-3000:]
    assert "trial 1 (" in output and "FloatingPointError: the loss is nan at step 0" in output
    assert "trial 2 (" in output and "val/acc ended as nan" in output
    assert "Best parameters" in output  # the study finished over the trials that trained


def test_a_study_whose_every_trial_fails_ends_with_the_tally_not_a_traceback(
    studies: dict[str, tuple[int, str, Path]],
) -> None:
    """Optuna's sweeper asks for the best trial at the end; with none it raised through a chained traceback."""
    code, output, _ = studies["always_nan"]
    assert code == 1, output[-3000:]
    assert "Traceback" not in output and "No trials are completed" not in output, output[-3000:]
    assert "study: every trial failed (2), so it has no best parameters:" in output, output[-3000:]
    assert output.count("FloatingPointError: the loss is nan at step 0") == 2, output[-3000:]


def test_a_config_mistake_still_ends_the_study_at_the_first_trial(studies: dict[str, tuple[int, str, Path]]) -> None:
    code, output, cwd = studies["config_mistake"]
    assert code == 1, output[-3000:]
    assert "optimized_metric=val/accuracy" in output and "Traceback" not in output, output[-3000:]
    assert len(list(cwd.glob("multirun/*/*/*/.hydra"))) == 1  # trials 1 and 2 never started
    assert (
        "study: ended at trial 0 by this config mistake, which every trial would repeat (1 trial(s) ran, 1 failed)"
        in output
    )


def test_a_mistake_of_one_trials_values_is_that_trials_failure_and_the_study_goes_on(
    studies: dict[str, tuple[int, str, Path]],
) -> None:
    """A sampled width the model refuses, a trial that never logs the metric: each ended the whole study."""
    code, output, _ = studies["particular"]
    assert code == 0, output[-3000:]
    assert "Traceback" not in output and "geartrain: error" not in output, output[-3000:]
    assert "study: 2 of 3 trials failed:" in output, output[-3000:]
    built = re.search(
        r"trial 0 \(.*model\.hidden=(\d+).*\): could not build model: .*no model of width (\d+) here", output
    )
    assert built and built.group(1) == built.group(2), output[-3000:]
    assert re.search(r"trial 2 \(.*\): optimized_metric=val/acc: the run did not log it", output), output[-3000:]
    assert "Best parameters" in output  # over trial 1, the one that trained
