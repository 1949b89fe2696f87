"""A small fit logging to MLflow or W&B, for the trackers' tests: in-process, as a subprocess, or per rank.

    python tests/helpers/tracker_job.py {mlflow,wandb} OUT_DIR TARGET [--kill-at STEP] [--resume]

TARGET is the MLflow tracking URI, or W&B's folder (offline). ``--kill-at`` kills the process with
SIGKILL when that optimizer step is done, after ``last.ckpt`` of an earlier step was written and
later steps were logged: a resume must neither repeat nor lose those. ``--resume`` fits again
from ``OUT_DIR/checkpoints/last.ckpt``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# trainer first: `import strategies` before `trainer` hits a circular import in the foundation.
from trainer import Trainer, TrainModule, seed_everything  # isort: split

from callbacks import Callback, ModelCheckpoint
from strategies import SingleDeviceStrategy

EPOCHS, BATCHES = 2, 5  # 10 optimizer steps; checkpoints after steps 3, 6 and 9 (every 3) and last.ckpt


class Net(TrainModule):
    def __init__(self, hidden: int = 8, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def data() -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCHES * 4 + 8, 4, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(len(x), 1, generator=g)
    train = TensorDataset(x[: BATCHES * 4], y[: BATCHES * 4])
    return DataLoader(train, batch_size=4), DataLoader(TensorDataset(x[BATCHES * 4 :], y[BATCHES * 4 :]), batch_size=4)


class KillAt(Callback):
    """SIGKILL this process once optimizer step ``step`` is done (no clean-up of any kind runs)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def make_logger(tracker: str, target: str, name: str, **kwargs: Any) -> Any:
    """An MLFlowLogger writing to experiment ``name`` at ``target``, or an offline WandbLogger (project ``name``)."""
    if tracker == "mlflow":
        from callbacks import MLFlowLogger

        return MLFlowLogger(experiment_name=name, tracking_uri=target, **kwargs)
    from callbacks import WandbLogger

    return WandbLogger(save_dir=target, project=name, offline=True, **kwargs)


def fit(
    tracker: str,
    out: str | Path,
    target: str,
    *,
    kill_at: int | None = None,
    resume: bool = False,
    strategy: Any = None,
    name: str = "job",
    logger_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One fit of :class:`Net` logging to ``tracker``; returns the logger's run id and rank."""
    seed_everything(0)
    logger = make_logger(tracker, target, name, **(logger_kwargs or {}))
    callbacks: list[Callback] = [
        logger,
        ModelCheckpoint(dirpath=Path(out, "checkpoints"), every_n_train_steps=3, save_last=True),
    ]
    if kill_at is not None:
        callbacks.append(KillAt(kill_at))
    trainer = Trainer(
        max_epochs=EPOCHS,
        strategy=strategy or SingleDeviceStrategy(device="cpu"),
        callbacks=callbacks,
        default_root_dir=out,
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        logger=False,
    )
    train, val = data()
    trainer.fit(Net(), train, val, ckpt_path=Path(out, "checkpoints", "last.ckpt") if resume else None)
    result = {
        "rank": trainer.global_rank,
        "run_id": logger.version,
        "experiment": type(logger.experiment).__name__,
        "steps": trainer.global_step,
    }
    if tracker == "wandb" and trainer.is_global_zero:
        logger.experiment.finish()
    return result


def ddp_fit(tracker: str, out: str, target: str) -> dict[str, Any]:
    """:func:`fit` on one rank of a gloo group (``tests.helpers.distributed.spawn``): DDP over 2 processes."""
    return fit(tracker, out, target, strategy="ddp", name="ddp")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tracker", choices=["mlflow", "wandb"])
    parser.add_argument("out")
    parser.add_argument("target")
    parser.add_argument("--kill-at", type=int)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    result = fit(args.tracker, args.out, args.target, kill_at=args.kill_at, resume=args.resume)
    print(f"RUN {result['run_id']}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main()
