"""Callbacks for the ``geartrain`` command in tests: which ranks ran a job, a job slow enough to interrupt, planned failures."""

from __future__ import annotations

import gzip
import time
import zipfile
from pathlib import Path
from typing import Any

from callbacks import Callback


class RankMark(Callback):
    """Writes ``<default_root_dir>/rank-R`` at fit start holding the optimizer's learning rate."""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        Path(trainer.default_root_dir, f"rank-{trainer.global_rank}").write_text(f"{lr:g}")


class Archives(Callback):
    """Writes each step to ``steps-R.gz`` and ``steps-R.zip`` in ``default_root_dir``, never closing them.

    The files sit in a reference cycle, left to the garbage collector: only their finalizers write the
    archives' ends (a gzip trailer, a zip directory), as the process ends.
    """

    def __init__(self) -> None:
        self.files: dict[str, Any] = {"self": self}  # a reference cycle: freed only by the cycle collector

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        root, rank = Path(trainer.default_root_dir), trainer.global_rank
        self.files["gz"] = gzip.open(root / f"steps-{rank}.gz", "wt")  # noqa: SIM115
        self.files["zip"] = zipfile.ZipFile(root / f"steps-{rank}.zip", "w")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.files["gz"].write(f"step {trainer.global_step}\n")
        self.files["gz"].flush()  # compressed and on disk; only closing writes the stream's end
        self.files["zip"].writestr(f"step-{trainer.global_step}.txt", "done")


class SlowSteps(Callback):
    """Sleeps after every training batch; from step 2, rank 0 touches ``<default_root_dir>/stepping``."""

    def __init__(self, seconds: float = 0.2) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step >= 2 and trainer.is_global_zero:
            Path(trainer.default_root_dir, "stepping").touch()
        time.sleep(self.seconds)


class FailIn(Callback):
    """Raises at the second training batch of the named sweep jobs' named ranks (``"JOB:RANK"``, JOB Hydra's job number).

    ``"0:0", "0:1"`` fails job 0 on every rank of two; ``"1:1"`` fails job 1 on rank 1 only, so rank 0
    is left waiting in the step's gradient all-reduce for a peer that is gone.
    """

    def __init__(self, at: list[str]) -> None:
        self.at = set(at)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        from hydra.core.hydra_config import HydraConfig

        here = f"{HydraConfig.get().job.num}:{trainer.global_rank}"
        if batch_idx == 1 and here in self.at:
            raise RuntimeError(f"planned failure in job:rank {here}")
