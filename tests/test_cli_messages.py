"""Each mistake a user can make on the ``geartrain`` command ends it with a short message and exit code 1.

Run as a user runs it (the command in a subprocess): no traceback, a few lines that name the key or
file and the fix, and no run directory left behind by a run that failed before training. All the
commands start at once, in folders of their own, to keep the suite's wall time down.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO_ROOT
from tests.helpers.cli import run_many

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@dataclass(frozen=True)
class Mistake:
    args: tuple[str, ...]
    named: tuple[str, ...]  # what the message must name: the key, the file, the fix
    before_training: bool = True  # so the run must leave no run directory
    env: tuple[tuple[str, str], ...] = ()


MISTAKES = {
    "typo_in_a_key": Mistake(("trainer.max_epoch=3",), ("trainer.max_epoch", "did you mean trainer.max_epochs?")),
    "typo_in_a_nested_key": Mistake(("model.hiden=3",), ("model.hiden", "model.hidden")),
    "value_of_the_wrong_type": Mistake(("optim.lr=abc",), ("optim.lr", "abc", "Float")),
    "value_out_of_range": Mistake(("optim.lr=-1",), ("optim.lr", "positive")),
    "unknown_experiment": Mistake(
        ("experiment=does_not_exist",), ("experiment=does_not_exist", "charlm", "digits_ddp", "--config-dir")
    ),
    "unknown_strategy": Mistake(("strategy=foo",), ("strategy=foo", "single", "ddp")),
    "unknown_task": Mistake(("task=fitt",), ("task=fitt", "fit_test")),
    "missing_checkpoint": Mistake(("ckpt_path=missing.ckpt",), ("missing.ckpt", "ckpt_path=last")),
    # Training starts from scratch instead (as Lightning's fit); evaluating needs a checkpoint.
    "no_run_to_resume": Mistake(("task=test", "ckpt_path=last"), ("ckpt_path=last", "outputs", "Train first")),
    "unreadable_checkpoint": Mistake(("ckpt_path=garbage.ckpt",), ("garbage.ckpt", "not a readable")),
    "resume_with_another_optimizer": Mistake(
        ("optim=sgd", "ckpt_path=adamw.ckpt"), ("adamw.ckpt", "optimizer AdamW", "configures SGD", "weights.pt")
    ),
    "checkpoint_missing_an_entry": Mistake(("ckpt_path=no_progress.ckpt",), ("no_progress.ckpt", "'progress'")),
    "class_not_found": Mistake(("model._target_=my_project.Net",), ("model", "my_project", "folder")),
    # A class of the user's (here one of the tests') given without dropping the group's default keys.
    "target_keeping_the_groups_keys": Mistake(
        ("model._target_=tests.helpers.tiny_mlp.TinyMLP",),
        ("model._target_=tests.helpers.tiny_mlp.TinyMLP", "(hidden, dropout", "'~model' +model._target_=tests."),
    ),
    "model_argument_of_the_wrong_type": Mistake(
        ("model.dropout=abc",), ("model.dropout=abc", "DigitsClassifier takes dropout: float", "model.dropout=0.1")
    ),
    "own_argument_of_the_wrong_type": Mistake(
        ("~model", "+model._target_=tests.helpers.tiny_mlp.TinyMLP", "+model.log_loss=3"),
        ("model.log_loss=3", "TinyMLP takes log_loss: bool", "true or false"),
    ),
    "monitor_never_logged": Mistake(
        ("trainer.max_epochs=1", "callbacks.early_stopping.monitor=val/los", "callbacks.early_stopping.strict=true"),
        ("EarlyStopping(monitor='val/los')", "logged: ", "callbacks.early_stopping.monitor=val/loss"),
        before_training=False,
    ),
    # Raised in a worker process: it reaches the command as a failed worker, and is still told short.
    "monitor_never_logged_under_ddp": Mistake(
        (
            "strategy=ddp",
            "trainer.devices=2",
            "trainer.max_epochs=1",
            "callbacks.early_stopping.monitor=val/los",
            "callbacks.early_stopping.strict=true",
        ),
        ("(rank ", "EarlyStopping(monitor='val/los')", "callbacks.early_stopping.monitor=val/loss"),
        before_training=False,
    ),
}
if torch.cuda.device_count() < 2:  # DataParallel asked for more GPUs than there are, or for the CPU: one rule
    MISTAKES["dp_with_more_devices_than_gpus"] = Mistake(
        ("strategy=dp", "trainer.devices=2"), ("strategy='dp'", "devices=2", "strategy='ddp'")
    )
    MISTAKES["dp_on_the_cpu"] = Mistake(
        ("strategy=dp", "trainer.accelerator=cpu"), ("strategy='dp' runs on CUDA GPUs only", "accelerator='cpu'")
    )
#: The same mistake with HYDRA_FULL_ERROR=1: the traceback is back.
FULL = Mistake(("task=test", "ckpt_path=last"), ("Traceback", "ckpt_path=last"), env=(("HYDRA_FULL_ERROR", "1"),))


def write_checkpoints(folder: Path) -> None:
    """``adamw.ckpt``: the default job's model after one step (AdamW, cosine); ``no_progress.ckpt``: without progress."""
    from examples.digits import DigitsClassifier, DigitsData
    from tests.helpers.trainers import quiet_trainer

    trainer = quiet_trainer(folder / "first", max_steps=1, limit_val_batches=0)
    trainer.fit(DigitsClassifier(), datamodule=DigitsData())
    trainer.save_checkpoint(folder / "adamw.ckpt")
    state = torch.load(folder / "adamw.ckpt", weights_only=True)
    del state["progress"]
    torch.save(state, folder / "no_progress.ckpt")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[int, str, Path]]]:
    checkpoints = tmp_path_factory.mktemp("checkpoints")
    write_checkpoints(checkpoints)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    jobs = {}
    for name, mistake in {**MISTAKES, "full_error": FULL}.items():
        cwd = tmp_path_factory.mktemp(name)
        (cwd / "garbage.ckpt").write_bytes(b"not a checkpoint\n")
        for file in ("adamw.ckpt", "no_progress.ckpt"):
            shutil.copy(checkpoints / file, cwd / file)
        jobs[name] = (cwd, ["trainer.enable_progress_bar=false", *mistake.args], dict(mistake.env))
    yield run_many(jobs, timeout=240, env=env)


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_mistake_ends_with_a_short_message(outcomes: dict[str, tuple[int, str, Path]], name: str) -> None:
    code, output, cwd = outcomes[name]
    mistake = MISTAKES[name]
    assert code == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    message = output[output.index("geartrain: error:") :] if "geartrain: error:" in output else output
    assert len(message.strip().splitlines()) <= 10, message
    for text in mistake.named:
        assert text in message, (text, message)
    if mistake.before_training:
        assert not (cwd / "outputs").exists(), sorted(p.relative_to(cwd).as_posix() for p in cwd.rglob("*"))


def test_hydra_full_error_still_shows_the_traceback(outcomes: dict[str, tuple[int, str, Path]]) -> None:
    code, output, _ = outcomes["full_error"]
    assert code == 1
    for text in FULL.named:
        assert text in output, output[-3000:]
