"""Epoch values on several processes: every rank makes the same collectives, in the same order.

Evaluation shards are not padded (docs/architecture.md, "Processes"), so one rank may see fewer batches than
another, or none: with one validation sample on two ranks, rank 1 never logs ``val/loss`` and never
updates a torchmetrics object. Reducing only what each rank logged would then have rank 0 wait in an
all-reduce that rank 1 never makes (gloo aborts, or the run hangs until the collective timeout).

So at an epoch's end the ranks first agree on what was logged (one ``all_gather_object`` of the
names and how they reduce), and each rank takes part in the reduction of every value logged with
``sync_dist=True`` anywhere: a rank without it contributes the reduction's neutral element (a zero
sum over zero samples for a mean, ``-inf`` for a max), and computes a torchmetrics object it never
updated (found by its attribute path in the module; its sync is a collective too). Values reduce in
the order rank 0 logged them (then the others'), the same on every rank. A value no rank has samples
for stays absent, as on one process.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import torch

from trainer.metrics.state import metric_paths
from trainer.metrics.store import MetricStore, _Entry

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import nn

    from trainer.trainer import Trainer

__all__ = ["agree_on_entries", "epoch_agreement"]

_NEUTRAL = {"mean": 0.0, "sum": 0.0, "max": -math.inf, "min": math.inf}


def epoch_agreement(trainer: Trainer) -> Callable[[MetricStore], None] | None:
    """The ``agree`` of a stage's :class:`MetricStore`: :func:`agree_on_entries` on several processes, else None."""
    strategy = trainer.strategy
    if strategy.world_size == 1:
        return None
    return functools.partial(
        agree_on_entries, gather_object=strategy.gather_object, module=trainer.module, device=strategy.root_device
    )


def agree_on_entries(
    store: MetricStore,
    gather_object: Callable[[Any], list[Any]],
    module: nn.Module | None,
    device: torch.device,
) -> None:
    """Give ``store`` every synced entry any rank has (neutral where this rank has none), in one order."""
    paths = metric_paths(module) if any(e.metric is not None for e in store.entries.values()) else {}
    mine = [_describe(entry, paths) for entry in store.entries.values() if entry.on_epoch]
    order: dict[str, dict[str, Any]] = {}
    for described in gather_object(mine):
        for item in described:
            order.setdefault(item["name"] + item["suffix"], item)
    unreachable = [n for n, item in order.items() if item["metric"] and item["path"] is None and item["sync"]]
    if unreachable:  # the same answer on every rank: all raise, none waits
        raise RuntimeError(
            f"self.log({unreachable[0]!r}, metric): under several processes a logged torchmetrics object "
            "must be an attribute of the module (self.my_metric = Metric(...)), so that a rank with no "
            "batches of its own can take part in its sync"
        )
    entries = dict(store.entries)
    store.entries.clear()
    for name, item in order.items():
        entry = entries.pop(name, None)
        if entry is None and item["sync"]:
            entry = _neutral_entry(item, module, device)
        if entry is not None:
            store.entries[name] = entry
    store.entries.update(entries)  # logged here on_step only: no epoch value, no collective


def _describe(entry: _Entry, paths: dict[int, str]) -> dict[str, Any]:
    synced = entry.metric is not None or entry.sync_dist  # a torchmetrics object syncs itself
    return {
        "name": entry.name,
        "suffix": entry.suffix,
        "on_step": entry.on_step,
        "reduce_fx": entry.reduce_fx,
        "sync": synced,
        "metric": entry.metric is not None,
        "path": paths.get(id(entry.metric)) if entry.metric is not None else None,
        "dtype": None if entry.total is None else str(entry.total.dtype).removeprefix("torch."),
    }


def _neutral_entry(item: dict[str, Any], module: nn.Module | None, device: torch.device) -> _Entry:
    """An entry this rank never logged: contributes nothing to the reduction, but takes part in it."""
    entry = _Entry(
        item["name"], item["on_step"], True, False, not item["metric"], item["reduce_fx"], suffix=item["suffix"]
    )
    if item["metric"]:
        assert module is not None
        entry.metric = module.get_submodule(item["path"])
    else:
        dtype = getattr(torch, item["dtype"] or "float32")
        entry.total = torch.full((), _NEUTRAL[item["reduce_fx"]], dtype=dtype, device=device)
    return entry
