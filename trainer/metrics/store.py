"""What ``self.log`` records: per-step values and per-epoch aggregates, for one stage at a time.

Values stay tensors on their device until a logger asks for numbers, so logging every step does not
force a host-device sync. Epoch aggregates are batch-size-weighted sums, reduced over processes only
when the user asked (``sync_dist=True``); torchmetrics objects aggregate and sync themselves.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.common.tree import is_metric

__all__ = ["MetricStore"]

_REDUCE_FX = ("mean", "sum", "max", "min")
#: The functions Lightning takes as ``reduce_fx``, by the name the store uses.
_REDUCE_FUNCTIONS: dict[Any, str] = {
    torch.mean: "mean",
    torch.sum: "sum",
    sum: "sum",
    torch.max: "max",
    max: "max",
    torch.min: "min",
    min: "min",
}


def reduce_fx_name(name: str, reduce_fx: Any) -> str:
    """A ``reduce_fx`` Lightning accepts as the store names it: ``"mean"``, ``"sum"``, ``"max"`` or ``"min"``.

    As Lightning: those names in any case and ``"avg"``, or ``torch.mean``/``torch.sum``/``torch.max``/
    ``torch.min`` and the built-in ``sum``/``max``/``min``; anything else is refused.
    """
    if isinstance(reduce_fx, str):
        key = reduce_fx.lower()
        key = "mean" if key == "avg" else key
        if key in _REDUCE_FX:
            return key
    else:
        found = _REDUCE_FUNCTIONS.get(reduce_fx)
        if found is not None:
            return found
    shown = getattr(reduce_fx, "__name__", reduce_fx)
    raise ValueError(
        f"self.log({name!r}): reduce_fx must be one of 'mean', 'sum', 'max', 'min' (any case, or 'avg'), "
        f"torch.mean/sum/max/min or the built-in sum/max/min, got {shown!r}; for another reduction log a "
        "torchmetrics Metric"
    )


@dataclass
class _Entry:
    name: str
    on_step: bool
    on_epoch: bool
    prog_bar: bool
    sync_dist: bool
    reduce_fx: str
    metric: Any = None
    step_value: torch.Tensor | None = None
    total: torch.Tensor | None = None  # weighted sum (mean/sum) or running max/min
    weight: float = 0.0
    #: ``"/dataloader_idx_N"`` for a value logged while evaluating loader N of several (Lightning's
    #: suffix, after ``_step``/``_epoch``: ``loss_epoch/dataloader_idx_0``), else "".
    suffix: str = ""

    def key(self, fork: str = "") -> str:
        """The name the loggers see: ``name``, then ``fork`` (``"_step"``, ``"_epoch"`` or ""), then the suffix."""
        return f"{self.name}{fork}{self.suffix}"

    def update(self, value: torch.Tensor, batch_size: int) -> None:
        # The running sums are updated in place: ``total`` is always a tensor this entry created (by the
        # product or the clone below), so nobody else holds it. ``add_(value, alpha=n)`` is one kernel
        # where ``total += value * n`` is two (and a tensor made from the number n).
        if self.total is None:
            self.total = value * batch_size if self.reduce_fx == "mean" else value.clone()
        elif self.reduce_fx == "mean":
            if self.total.dtype == value.dtype:
                self.total.add_(value, alpha=batch_size)
            else:  # let type promotion widen the sum, as the out-of-place form does
                self.total = self.total + value * batch_size
        elif self.reduce_fx == "sum":
            if self.total.dtype == value.dtype:
                self.total.add_(value)
            else:
                self.total = self.total + value
        elif self.reduce_fx == "max":
            self.total = torch.maximum(self.total, value)
        else:
            self.total = torch.minimum(self.total, value)
        self.weight += batch_size

    def _computed(self) -> torch.Tensor:
        """The logged Metric's ``compute()``, which must be a tensor (or a number, made one), as Lightning's.

        A tuple of tensors would otherwise become one vector silently, not the scalar a metric name stands for.
        """
        value = self.metric.compute()
        if not isinstance(value, (torch.Tensor, int, float)):
            raise ValueError(
                f"The `.compute()` return of the metric logged as {self.name!r} must be a tensor. Found {value}"
            )
        return torch.as_tensor(value).detach()

    def compute(self, reduce: Callable[[torch.Tensor, str], torch.Tensor]) -> torch.Tensor | None:
        if self.metric is not None:
            if getattr(self.metric, "_update_count", 1) == 0:
                # A rank without batches (an empty evaluation shard) still takes part in the metric's
                # sync, which gives every rank the result; torchmetrics' warning would be noise.
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return self._computed()
            return self._computed()
        if self.total is None:
            return None
        total = self.total
        if self.reduce_fx == "mean":
            weight = torch.tensor(self.weight, dtype=torch.float64, device=total.device)
            if self.sync_dist:
                total = reduce(total.double(), "sum")
                weight = reduce(weight, "sum")
                if self.weight == 0 and not weight.item():  # no samples on any rank: absent, as on one process
                    return None
            return (total.double() / weight).to(torch.get_default_dtype())
        # A copy: ``total`` keeps being updated in place if anything logs after this.
        return reduce(total, self.reduce_fx) if self.sync_dist else total.clone()


@dataclass
class MetricStore:
    """Everything logged during one stage (``"train"``, ``"validate"``, ``"test"``).

    Args:
        reduce: the strategy's cross-process reduction, used for ``sync_dist=True``.
    """

    reduce: Callable[[torch.Tensor, str], torch.Tensor]
    #: Under several processes: makes every rank's entries the same list before values are reduced
    #: (:func:`trainer.metrics.sync.agree_on_entries`); None on one process.
    agree: Callable[[MetricStore], None] | None = None
    entries: dict[str, _Entry] = field(default_factory=dict)
    #: Step-level values logged since the loggers were last given them.
    pending_step: dict[str, torch.Tensor] = field(default_factory=dict)
    #: Keys (with suffixes) of values logged with ``prog_bar=True``; kept up to date as entries appear.
    _prog_bar: set[str] = field(default_factory=set)

    def log(
        self,
        name: str,
        value: Any,
        on_step: bool,
        on_epoch: bool,
        prog_bar: bool,
        sync_dist: bool,
        reduce_fx: str,
        batch_size: Callable[[], int],
        suffix: str = "",
    ) -> str | None:
        """Record ``value``; return the step-level key it produced (in :attr:`pending_step`), if any.

        ``suffix``: Lightning's ``"/dataloader_idx_N"``, which ends every key of the value.
        """
        if reduce_fx not in _REDUCE_FX:
            reduce_fx = reduce_fx_name(name, reduce_fx)
        entry = self.entries.get(name + suffix if suffix else name)
        if entry is None:
            entry = _Entry(name, on_step, on_epoch, prog_bar, sync_dist, reduce_fx, suffix=suffix)
            self.add(entry)
        metric = None if isinstance(value, torch.Tensor) else value if is_metric(value) else None
        entry.metric = metric
        if metric is not None:
            # The batch value torchmetrics cached when the user called metric(preds, target).
            step_value = getattr(metric, "_forward_cache", None)
            tensor = torch.as_tensor(step_value).detach() if step_value is not None else None
        else:
            if isinstance(value, torch.Tensor):
                # Cut from autograd without ``detach()``, which costs microseconds a step (it shares the
                # version counter and builds autograd metadata; see docs/performance.md), where ``.data``
                # costs next to nothing. Safe here: the store only reads the value, and the running sums
                # are tensors of their own (``value * n`` or a clone).
                tensor = value.data if value.requires_grad else value
            else:
                tensor = torch.as_tensor(value)
            if tensor.numel() != 1:
                raise ValueError(
                    f"self.log({name!r}) needs a scalar (one-element tensor or number), "
                    f"got a tensor of shape {tuple(tensor.shape)}"
                )
            if tensor.dim():
                tensor = tensor.reshape(())
            if not tensor.is_floating_point():
                tensor = tensor.to(torch.get_default_dtype())
            if on_epoch:
                entry.update(tensor, batch_size() if reduce_fx == "mean" else 1)
        if on_step and tensor is not None:
            if sync_dist and metric is None:
                tensor = self.reduce(tensor, "mean" if reduce_fx == "mean" else reduce_fx)
            key = f"{name}_step{suffix}" if on_epoch else name + suffix
            entry.step_value = tensor
            self.pending_step[key] = tensor
            return key
        return None

    def epoch_values(self) -> dict[str, torch.Tensor]:
        """Compute every epoch-level value (syncing where asked), keyed as loggers should see them."""
        out: dict[str, torch.Tensor] = {}
        if self.agree is not None:
            self.agree(self)
        for entry in self.entries.values():
            if not entry.on_epoch:
                continue
            value = entry.compute(self.reduce)
            if value is not None:
                out[entry.key("_epoch" if entry.on_step else "")] = value
        return out

    def add(self, entry: _Entry) -> None:
        """Keep ``entry`` (new, or restored from a checkpoint), with its progress-bar keys."""
        self.entries[entry.key()] = entry
        if entry.prog_bar:
            forks = ("_step", "_epoch") if entry.on_step and entry.on_epoch else ("",)
            self._prog_bar.update(entry.key(fork) for fork in forks)

    def prog_bar_keys(self) -> set[str]:
        """Names of values logged with ``prog_bar=True`` (with their suffixes); do not modify."""
        return self._prog_bar

    def reset(self) -> None:
        """Forget the epoch's aggregates and reset logged torchmetrics objects.

        Metrics logged per step only are reset too: their state would otherwise keep growing over
        the whole run (Lightning resets every logged metric at the epoch's end).
        """
        for entry in self.entries.values():
            if entry.metric is not None:
                entry.metric.reset()
        self.entries.clear()
        self.pending_step.clear()
        self._prog_bar.clear()
