"""DDP overhead: ``Trainer(strategy="ddp", devices=2)`` against a hand-written DDP loop, 2 processes, gloo.

Both sides run in the same two worker processes, started once by geartrain's launcher
(``torch.distributed.launcher.api.elastic_launch``, as ``Trainer(strategy="ddp", devices=2).fit``
starts them): inside the workers the trainer joins the launcher's environment exactly as under
``torchrun``, so the pairs alternate without paying for process start-up, which is left out of the
times as it must be. Each measurement is the slower rank's time around ``fit`` (geartrain) or around
the hand-written loop (wrapping in ``DistributedDataParallel``, a ``DistributedSampler`` loader,
forward, backward with its gradient all-reduce, SGD step), on the same tiny MLP, the same data and
the same number of steps.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bench.core import Result, clock, paired, use_wall_clock

__all__ = ["measure", "run"]

WORLD = 2
BATCH = 64  # per rank

#: The trained weights of the last run of each side (flattened), to check that both did the same work.
_LAST: dict[str, torch.Tensor] = {}


def _dataset(samples: int) -> torch.utils.data.TensorDataset:
    from bench.overhead import IN, OUT

    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(
        torch.randn(samples, IN, generator=g), torch.randint(0, OUT, (samples,), generator=g)
    )


def _slowest(seconds: float) -> float:
    """The largest of the ranks' times: a step is done when every rank is done."""
    import torch.distributed as dist

    value = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value)


def _geartrain(data: torch.utils.data.TensorDataset, batch: int, epochs: int) -> float:
    from bench.overhead import fresh_model
    from trainer import Trainer

    model = fresh_model(log_loss=False)
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=False)
    trainer = Trainer(
        strategy="ddp",
        devices=WORLD,
        max_epochs=epochs,
        enable_progress_bar=False,
        enable_checkpointing=False,
        logger=False,
        num_sanity_val_steps=0,
    )
    start = clock()
    trainer.fit(model, train_dataloaders=loader)
    elapsed = clock() - start
    _LAST["geartrain"] = nn.utils.parameters_to_vector(model.parameters()).detach()
    return _slowest(elapsed)


def _hand(data: torch.utils.data.TensorDataset, batch: int, epochs: int) -> float:
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data.distributed import DistributedSampler

    from bench.overhead import fresh_model

    model = fresh_model(log_loss=False)
    start = clock()
    ddp = DistributedDataParallel(model)
    sampler: DistributedSampler[Any] = DistributedSampler(data, shuffle=False)
    loader = torch.utils.data.DataLoader(data, batch_size=batch, sampler=sampler)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    ddp.train()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    elapsed = clock() - start
    _LAST["hand"] = nn.utils.parameters_to_vector(model.parameters()).detach()
    return _slowest(elapsed)


def _pairs_in_worker(samples: int, batch: int, epochs: int, pairs: int, warmup: int, wall: bool) -> dict[str, Any]:
    """Runs in each worker: join the group, alternate geartrain and hand-written, return the times."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    use_wall_clock(wall)
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="env://")
    data = _dataset(samples)
    a, b, ratio, ratios = paired(
        lambda: _geartrain(data, batch, epochs), lambda: _hand(data, batch, epochs), pairs, warmup
    )
    same = bool(torch.equal(_LAST["geartrain"], _LAST["hand"]))
    return {"ours": a, "theirs": b, "ratio": ratio, "ratios": ratios, "same_weights": same}


def measure(quick: bool = False, pairs: int = 7) -> dict[str, Any]:
    """Start the 2 workers once and run the pairs there; returns times, ratios and ``same_weights``.

    ``same_weights`` says whether both sides ended with bitwise-equal weights (the same work).
    """
    from bench import core
    from strategies.launch import start_processes

    pairs = pairs if quick else max(pairs, 5)
    steps_per_epoch, epochs = (20, 2) if quick else (250, 4)
    samples = WORLD * BATCH * steps_per_epoch
    warmup = 0 if quick else 1
    out: dict[str, Any] = start_processes(_pairs_in_worker, (samples, BATCH, epochs, pairs, warmup, core.WALL), WORLD)
    out["note"] = (
        f"{WORLD} processes, gloo, {steps_per_epoch * epochs} steps ({epochs} epochs of {steps_per_epoch}), "
        f"batch {BATCH} per rank, 1 thread each, {pairs} pairs, slowest rank's time, start-up excluded"
    )
    if not out["same_weights"]:
        out["note"] += "; WARNING: the two sides ended with different weights"
    return out


def run(quick: bool = False, pairs: int = 7) -> list[Result]:
    """The ``ddp`` row: 2 processes over gloo, median of ``max(pairs, 5)`` pairs (``pairs`` when quick)."""
    out = measure(quick, pairs)
    ratio = out["ratio"]
    return [
        Result(
            "ddp, 2 processes (gloo)",
            out["ours"],
            out["theirs"],
            ratio,
            "<= 1.05x",
            ratio <= 1.05,
            out["note"],
            out["ratios"],
        )
    ]
