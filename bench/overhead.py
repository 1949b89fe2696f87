"""Step and evaluation overhead on a tiny MLP, where the trainer's own Python work shows most.

The model (32 -> 64 -> 10, batch 64, SGD, one thread) is so small that a step costs tens of
microseconds, so any per-step work the trainer adds is visible in the ratio. Both sides train the
same module object from the same initial weights on the same in-memory batches.
"""

from __future__ import annotations

import io
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from bench.core import Result, clock, ratio_result
from trainer import Trainer, TrainModule

__all__ = ["TinyMLP", "hand_fit", "hand_validate", "make_batches", "run"]

IN, HIDDEN, OUT, BATCH = 32, 64, 10, 64


class TinyMLP(TrainModule):
    """32 -> 64 -> 10 with plain SGD; with ``log_loss`` it logs its loss every step like a typical module."""

    def __init__(self, log_loss: bool = True) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
        self.log_loss = log_loss

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        if self.log_loss:
            self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Batches:
    """Fixed batches held in memory: a sized iterable, as a DataLoader is, without its cost."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return iter(self.batches)


def make_batches(n: int, seed: int = 0) -> Batches:
    """``n`` fixed random batches of (inputs, labels), held in memory."""
    g = torch.Generator().manual_seed(seed)
    return Batches(
        [(torch.randn(BATCH, IN, generator=g), torch.randint(0, OUT, (BATCH,), generator=g)) for _ in range(n)]
    )


def fresh_model(log_loss: bool = True) -> TinyMLP:
    """The same initial weights every time."""
    torch.manual_seed(0)
    return TinyMLP(log_loss)


# ----------------------------------------------------------------- training
def geartrain_fit(batches: Batches, epochs: int, root: Path | None = None, log_loss: bool = True) -> float:
    """Seconds spent in ``Trainer.fit``; with ``root``, the default callbacks write there."""
    model = fresh_model(log_loss)
    if root is None:
        trainer = Trainer(
            max_epochs=epochs,
            enable_progress_bar=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            logger=False,
            num_sanity_val_steps=0,
        )
    else:
        from callbacks import ModelCheckpoint, ProgressBar, TensorBoardLogger

        callbacks = [
            ProgressBar(stream=io.StringIO()),
            TensorBoardLogger(save_dir=root),
            ModelCheckpoint(dirpath=root / "checkpoints", save_last=True),
        ]
        trainer = Trainer(
            max_epochs=epochs,
            log_every_n_steps=50,
            callbacks=callbacks,
            default_root_dir=root,
            enable_model_summary=False,  # a one-off print the hand-written side does not do
        )
    start = clock()
    trainer.fit(model, train_dataloaders=batches)
    return clock() - start


def hand_fit(batches: Batches, epochs: int, root: Path | None = None) -> float:
    """The same training written by hand; with ``root``, the same progress lines, scalars and saves."""
    model = fresh_model()
    start = clock()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model.train()
    writer = stream = None
    if root is not None:
        from torch.utils.tensorboard import SummaryWriter

        writer, stream = SummaryWriter(log_dir=str(root / "tb")), io.StringIO()
    step = 0
    for epoch in range(epochs):
        epoch_start = time.perf_counter()
        for i, (x, y) in enumerate(batches):
            loss = nn.functional.cross_entropy(model.net(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if writer is not None and stream is not None:
                if step % 50 == 0:
                    writer.add_scalar("train/loss", loss.item(), step - 1)
                if (i + 1) % 50 == 0:
                    rate = (i + 1) / (time.perf_counter() - epoch_start)
                    print(f"epoch {epoch} step {step} batch {i + 1}/{len(batches)} {rate:.1f} it/s", file=stream)
        if root is not None:
            state = {"state_dict": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
            torch.save(state, root / "last.ckpt")
    if writer is not None:
        writer.close()
    return clock() - start


# ----------------------------------------------------------------- a tracker
def geartrain_fit_mlflow(batches: Batches, epochs: int, store: str) -> float:
    """Seconds in ``Trainer.fit`` with an ``MLFlowLogger`` writing to the local MLflow store ``store``."""
    from callbacks import MLFlowLogger

    model = fresh_model()
    trainer = Trainer(
        max_epochs=epochs,
        log_every_n_steps=50,
        callbacks=[MLFlowLogger(experiment_name="bench", tracking_uri=store)],
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    start = clock()
    trainer.fit(model, train_dataloaders=batches)
    return clock() - start


def hand_fit_mlflow(batches: Batches, epochs: int, store: str) -> float:
    """The same training by hand, with one MLflow run and the same values every 50 steps (loss, epoch)."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient
    from mlflow.tracking.context.registry import resolve_tags

    model = fresh_model()
    start = clock()
    client = MlflowClient(store)
    found = client.get_experiment_by_name("bench")
    experiment = found.experiment_id if found is not None else client.create_experiment("bench")
    # The run's source, user and git tags, as mlflow.start_run() and the logger both record them.
    run_id = client.create_run(experiment, tags=resolve_tags({})).info.run_id
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model.train()
    step = 0
    for epoch in range(epochs):
        for x, y in batches:
            loss = nn.functional.cross_entropy(model.net(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % 50 == 0:
                stamp = int(time.time() * 1000)
                values = [Metric("train/loss", loss.item(), stamp, step - 1), Metric("epoch", epoch, stamp, step - 1)]
                client.log_batch(run_id, metrics=values)
    client.set_terminated(run_id, "FINISHED")
    return clock() - start


# ----------------------------------------------------------------- evaluation
def geartrain_validate(batches: Batches) -> float:
    """Seconds spent in ``Trainer.validate`` (batch-size-weighted mean loss over the batches)."""
    model = fresh_model()
    trainer = Trainer(enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False, logger=False)
    start = clock()
    trainer.validate(model, dataloaders=batches, verbose=False)  # the hand-written loop prints no table
    return clock() - start


def hand_validate(batches: Batches) -> float:
    """The same evaluation by hand: no_grad, eval mode, weighted mean of the loss, one sync at the end."""
    model = fresh_model()
    start = clock()
    model.eval()
    total, count = torch.zeros((), dtype=torch.float64), 0
    with torch.no_grad():
        for x, y in batches:
            loss = nn.functional.cross_entropy(model.net(x), y)
            total += loss * len(x)
            count += len(x)
    float(total / count)
    model.train()
    return clock() - start


def run(quick: bool = False, pairs: int = 7) -> list[Result]:
    """The overhead rows: training without callbacks, with the defaults, with an MLflow logger; evaluation."""
    torch.set_num_threads(1)
    steps, epochs = (200, 2) if quick else (2000, 4)
    warmup = 0 if quick else 1
    batches = make_batches(steps // epochs)
    eval_batches = make_batches(100 if quick else 2000, seed=1)
    note = f"{steps} steps ({epochs} epochs of {len(batches)}), batch {BATCH}, 1 thread, {pairs} pairs"
    results = [
        ratio_result(
            "step overhead, no callbacks",
            lambda: geartrain_fit(batches, epochs, log_loss=False),
            lambda: hand_fit(batches, epochs),
            pairs,
            1.03,
            note,
            warmup,
        ),
        ratio_result(
            "step overhead, no callbacks, self.log every step",
            lambda: geartrain_fit(batches, epochs),
            lambda: hand_fit(batches, epochs),
            pairs,
            1.03,
            "the module logs its loss every step (values stay tensors; no logger reads them)",
            warmup,
        ),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401  (import cost is the import row's)

        root = Path(tmp)
        counter = iter(range(10**6))

        def fresh_dir() -> Path:
            path = root / str(next(counter))
            os.makedirs(path)
            return path

        results.append(
            ratio_result(
                "step overhead, default callbacks",
                lambda: geartrain_fit(batches, epochs, fresh_dir()),
                lambda: hand_fit(batches, epochs, fresh_dir()),
                pairs,
                1.05,
                "progress bar, TensorBoard every 50 steps, checkpoint at each epoch end, on both sides",
                warmup,
            )
        )
        import importlib.util

        if importlib.util.find_spec("mlflow") is not None:
            import mlflow  # noqa: F401  (its import is not a step's cost)

            # A local file store: no server between the two sides. Newer MLflow asks for this opt-in.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            store = f"file:{root / 'mlruns'}"
            results.append(
                ratio_result(
                    "step overhead, MLflow logger",
                    lambda: geartrain_fit_mlflow(batches, epochs, store),
                    lambda: hand_fit_mlflow(batches, epochs, store),
                    pairs,
                    1.10,
                    "train/loss and epoch to a local MLflow file store every 50 steps, one run each, on both sides",
                    warmup,
                )
            )
    results.append(
        ratio_result(
            "evaluation loop",
            lambda: geartrain_validate(eval_batches),
            lambda: hand_validate(eval_batches),
            pairs,
            1.05,
            f"validate over {len(eval_batches)} batches of {BATCH}",
            warmup,
        )
    )
    return results
