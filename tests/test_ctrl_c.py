"""Ctrl-C on the ``geartrain`` command: one line saying where it stopped and how to resume, exit code 130.

On one device and under DDP alike: the run finishes its step, saves ``last.ckpt``, prints
``interrupted at step N, saved <path>, resume with ckpt_path=last`` and claims no final metrics.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import Callback, ModelCheckpoint
from tests.helpers import REPO_ROOT
from tests.helpers.distributed import group_members
from tests.helpers.tiny_mlp import TinyMLP, make_batches
from trainer import Trainer

pytestmark = pytest.mark.slow  # every test here starts processes


@pytest.mark.timeout(300)
@pytest.mark.parametrize("processes", [1, 2], ids=["one_device", "ddp"])
def test_ctrl_c_ends_the_command_with_one_line_and_code_130(tmp_path: Path, processes: int) -> None:
    run_dir = tmp_path / "run"
    strategy = ["strategy=ddp", "trainer.devices=2"] if processes == 2 else []
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", *strategy, "task=fit_test", "trainer.max_epochs=50",
         "trainer.enable_progress_bar=false", "trainer.num_sanity_val_steps=0", f"hydra.run.dir={run_dir}",
         "+callbacks.slow._target_=tests.helpers.rank_marks.SlowSteps"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group: as a terminal's foreground job
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 200
        while not (run_dir / "stepping").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the job did not start stepping"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
        out, err = proc.communicate(timeout=90)
        leftovers = group_members(proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    step = int(torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["progress"]["global_step"])
    assert step >= 2
    line = f"interrupted at step {step}, saved {run_dir / 'checkpoints' / 'last.ckpt'}, resume with ckpt_path=last"
    assert err.strip().splitlines()[-1] == line, err[-3000:]
    assert err.count("interrupted at step") == 1  # rank 0 alone says it
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert "final metrics" not in out  # a run that stopped early claims no final values
    assert leftovers == []


def test_the_ctrl_c_line_names_the_last_file_the_run_wrote(
    tmp_path: Path, make_trainer: Callable[..., Trainer], capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``last.ckpt`` this run did not write is kept (as Lightning keeps it), so the run saves ``last-v1.ckpt``:
    the line names that file, the one holding the interrupted state, not the stranger's ``last.ckpt``."""

    class CtrlCAtStep3(Callback):
        def on_train_batch_end(
            self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            if trainer.global_step == 3:
                os.kill(os.getpid(), signal.SIGINT)

    folder = tmp_path / "ckpts"
    folder.mkdir()
    torch.save({"a user's": "file"}, folder / "last.ckpt")
    trainer = make_trainer(max_epochs=5, callbacks=[ModelCheckpoint(dirpath=folder, save_last=True), CtrlCAtStep3()])
    with pytest.raises(SystemExit) as stop, pytest.warns(UserWarning, match="was not written by this run"):
        trainer.fit(TinyMLP(), make_batches(8))
    assert stop.value.code == 130
    line = f"interrupted at step 3, saved {folder / 'last-v1.ckpt'}, resume with ckpt_path=last"
    assert capsys.readouterr().err.strip().splitlines()[-1] == line
    assert torch.load(folder / "last-v1.ckpt", weights_only=True)["global_step"] == 3
    assert torch.load(folder / "last.ckpt", weights_only=True) == {"a user's": "file"}
