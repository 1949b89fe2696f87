"""The checkpoint state of what ``self.log`` has accumulated: an exact resume in the middle of an epoch.

A run resumed mid-epoch must end the epoch with the values the uninterrupted run computes: the
epoch mean of ``train/loss`` over every batch of the epoch, not only those after the resume (a
``ReduceLROnPlateau``, ``EarlyStopping`` or ``ModelCheckpoint`` reading it decides on it). So the
training epoch's running sums and counts go into the checkpoint, with the states of the torchmetrics
objects logged in it; those are named by their attribute path in the module (a torchmetrics state is
not in the module's ``state_dict`` unless the user made it persistent), and put back into the same
attribute of the resumed module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from trainer.metrics.store import MetricStore, _Entry

if TYPE_CHECKING:
    from torch import nn

__all__ = ["load_store_state", "metric_paths", "store_state"]

_FLAGS = ("name", "on_step", "on_epoch", "prog_bar", "sync_dist", "reduce_fx")


def metric_paths(module: nn.Module | None) -> dict[int, str]:
    """``id(metric) -> attribute path`` of every torchmetrics object registered in ``module``."""
    if module is None:
        return {}
    return {id(sub): name for name, sub in module.named_modules() if hasattr(sub, "_defaults") and name}


def store_state(store: MetricStore, module: nn.Module | None) -> dict[str, Any]:
    """The running aggregates of ``store`` as plain data and tensors (loadable with ``weights_only``)."""
    paths = metric_paths(module) if any(e.metric is not None for e in store.entries.values()) else {}
    entries = []
    for entry in store.entries.values():
        saved: dict[str, Any] = {flag: getattr(entry, flag) for flag in _FLAGS}
        saved["total"] = None if entry.total is None else entry.total.detach().clone()
        saved["weight"] = entry.weight
        if entry.suffix:
            saved["suffix"] = entry.suffix
        if entry.metric is not None:
            path = paths.get(id(entry.metric))
            saved["metric_path"] = path  # None: not an attribute of the module, its state cannot be saved
            if path is not None:
                saved["metric_state"] = _metric_state(entry.metric)
        entries.append(saved)
    return {"entries": entries}


def load_store_state(store: MetricStore, state: dict[str, Any], module: nn.Module | None) -> None:
    """Put :func:`store_state`'s aggregates back into ``store`` (and the metrics into ``module``'s)."""
    for saved in state.get("entries", []):
        name, on_step, on_epoch, prog_bar, sync_dist, reduce_fx = (saved[flag] for flag in _FLAGS)
        entry = _Entry(name, on_step, on_epoch, prog_bar, sync_dist, reduce_fx, suffix=saved.get("suffix", ""))
        entry.total, entry.weight = saved["total"], float(saved["weight"])
        path = saved.get("metric_path")
        if path is not None and module is not None:
            entry.metric = module.get_submodule(path)
            _load_metric_state(entry.metric, saved["metric_state"])
        if entry.total is not None or entry.metric is not None:
            store.add(entry)


def _metric_state(metric: Any) -> dict[str, Any]:
    """A torchmetrics object's accumulated state (its ``add_state`` tensors or lists) and update count."""
    states = {
        name: [t.detach().clone() for t in value] if isinstance(value, list) else value.detach().clone()
        for name in metric._defaults
        for value in [getattr(metric, name)]
    }
    return {"states": states, "update_count": int(getattr(metric, "_update_count", 0))}


def _load_metric_state(metric: Any, state: dict[str, Any]) -> None:
    device = getattr(metric, "device", torch.device("cpu"))
    for name, value in state["states"].items():
        moved = [t.to(device) for t in value] if isinstance(value, list) else value.to(device)
        setattr(metric, name, moved)
    metric._update_count = state["update_count"]
    metric._computed = None  # a cached result of the states before the resume is not theirs
