"""``self.log`` and ``self.log_dict`` of :class:`~trainer.module.TrainModule`: Lightning's options, checked here.

The values go to the trainer's :class:`~trainer.metrics.routing.MetricRouter`; the per-step call of a
name takes the shortcut its first call worked out there (:data:`~trainer.metrics.routing.PlainLog`).
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from trainer.trainer import Trainer

__all__ = ["LoggingMixin"]

_Tensor = torch.Tensor


class LoggingMixin(nn.Module):
    """Lightning's logging methods for :class:`~trainer.module.TrainModule` (an ``nn.Module``)."""

    if TYPE_CHECKING:  # declared for mypy only: torch.jit.script reads class annotations as attribute types
        _trainer: Trainer | None

    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool = False,
        logger: bool | None = None,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: str | Callable[..., Any] = "mean",
        enable_graph: bool = False,
        sync_dist: bool = False,
        sync_dist_group: Any | None = None,
        add_dataloader_idx: bool = True,
        batch_size: int | None = None,
        metric_attribute: str | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        """Record a metric. ``value``: a tensor, a number, or a torchmetrics ``Metric``.

        Defaults follow Lightning: in ``training_step`` values are logged per step; in evaluation
        steps and in epoch-end hooks, per epoch. Epoch values are means weighted by ``batch_size``
        (inferred from the batch when omitted); a ``Metric`` is computed and reset at epoch end.
        With both ``on_step`` and ``on_epoch`` the keys get ``_step`` and ``_epoch`` suffixes.
        ``sync_dist=True`` reduces epoch values over processes (a metric syncs itself).
        ``logger=False`` keeps the value out of the loggers (it stays in ``callback_metrics``);
        ``rank_zero_only=True`` records it on rank 0 only (other ranks' ``callback_metrics`` lack it,
        so do not monitor it from callbacks that must agree across ranks). ``reduce_fx`` may be
        any name or function Lightning takes (``"mean"``, ``"avg"``, ``torch.max``, the built-in ``max``...). ``metric_attribute`` is accepted and not needed
        (a logged ``Metric`` is kept by reference). ``enable_graph=True`` and ``sync_dist_group``
        are refused.
        """
        trainer = self._trainer
        if trainer is None:
            return
        # The call a training step makes every step takes a shortcut that a first, full call of the same
        # name worked out (trainer.metrics.routing.PlainLog): detach, check, store; no layers between.
        plan = trainer._plain_log.get(name)
        if (
            plan is not None
            and type(value) is _Tensor
            and on_step is None
            and on_epoch is None
            and logger is not False
            and not (sync_dist or rank_zero_only or enable_graph)
            and sync_dist_group is None
            and reduce_fx == "mean"
        ):
            entry, pending, metrics, shown, dtype = plan
            tensor = value.data if value.requires_grad else value
            if tensor.ndim == 0 and tensor.dtype is dtype:
                entry.step_value = pending[name] = metrics[name] = tensor
                if shown is not None:
                    shown[name] = tensor
                return
        if trainer.barebones:  # after the shortcut: under barebones no call ever takes it
            warnings.warn(  # Lightning's words: logging is off, not an error
                "You are trying to `self.log()` but `Trainer(barebones=True)` is configured. Logging can impact raw "
                f"speed so it is disabled under this setting: {name!r} is not recorded.",
                UserWarning,
                stacklevel=2,
            )
            return
        if (
            logger is False
            or rank_zero_only
            or enable_graph
            or sync_dist_group is not None
            or type(reduce_fx) is not str
        ):
            if not self._log_options(name, rank_zero_only, enable_graph, sync_dist_group):
                return
            reduce_fx = _reduce_name(name, reduce_fx)
        if type(value) is not torch.Tensor:  # tensors first: the per-step case
            if _is_metric_collection(value):
                # A torchmetrics MetricCollection: each member is a Metric logged under "name/member".
                for key, metric in value.items():
                    self.log(
                        f"{name}/{key}", metric, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist=sync_dist
                    )
                return
            _check_loggable(name, value)
        # Positional: this runs every step, and keyword passing costs a little more per call.
        trainer._log(name, value, on_step, on_epoch, prog_bar, sync_dist, reduce_fx, batch_size)
        if logger is False:
            trainer.metric_router.no_logger_keys.update((name, f"{name}_step", f"{name}_epoch"))

    def _log_options(self, name: str, rank_zero_only: bool, enable_graph: bool, group: Any) -> bool:
        """Check the rarely used ``self.log`` options; False where this process records nothing."""
        if enable_graph:
            raise ValueError(
                f"self.log({name!r}, enable_graph=True) is not supported: logged values are detached; "
                "keep the tensor yourself if you need its graph"
            )
        if group is not None:
            raise ValueError(
                f"self.log({name!r}, sync_dist_group=...) is not supported: sync_dist=True reduces over all processes"
            )
        return not (rank_zero_only and self._trainer is not None and self._trainer.strategy.global_rank != 0)

    def log_dict(self, dictionary: Mapping[str, Any], *args: Any, **kwargs: Any) -> None:
        """``self.log`` every item of ``dictionary`` (a dict or a torchmetrics ``MetricCollection``).

        A ``MetricCollection``'s members are logged under the collection's own keys (its ``prefix``
        and ``postfix`` included), each computed and reset at epoch end. Takes ``self.log``'s options.
        """
        for name, value in dictionary.items():
            self.log(name, value, *args, **kwargs)


def _is_metric_collection(value: Any) -> bool:
    """True for a torchmetrics ``MetricCollection`` (duck-typed: ``compute``, ``reset`` and ``items``)."""
    return all(callable(getattr(value, attr, None)) for attr in ("compute", "reset", "items", "keys"))


def _check_loggable(name: str, value: Any) -> None:
    """Refuse what ``self.log`` cannot record (None, a str, a dict, ...) as Lightning does, naming it."""
    if isinstance(value, (numbers.Number, torch.Tensor)) or callable(getattr(value, "compute", None)):
        return
    hint = "; log a dict with self.log_dict" if isinstance(value, Mapping) else ""
    raise ValueError(
        f"`self.log({name}, {value})` was called, but `{type(value).__name__}` values cannot be logged{hint}"
    )


def _reduce_name(name: str, reduce_fx: Any) -> str:
    """``reduce_fx`` as the metric store names it (see :func:`trainer.metrics.store.reduce_fx_name`)."""
    from trainer.metrics.store import reduce_fx_name

    return reduce_fx_name(name, reduce_fx)
