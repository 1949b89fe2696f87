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

from trainer.common.errors import MisconfigurationException

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
            # Not an error, as in Lightning: a step may be tested without a trainer.
            warnings.warn(
                "You are trying to `self.log()` but the `self.trainer` reference is not registered on the model yet. "
                "This is most likely because the model hasn't been passed to the `Trainer`",
                UserWarning,
                stacklevel=2,
            )
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
        if add_dataloader_idx and "/dataloader_idx_" in name:
            raise MisconfigurationException(
                f"You called `self.log` with the key `{name}` but it should not contain information about "
                "`dataloader_idx` when `add_dataloader_idx=True`: the trainer adds `/dataloader_idx_N` itself "
                "(pass add_dataloader_idx=False to name the key yourself)"
            )
        if (
            logger is not None
            or rank_zero_only
            or enable_graph
            or sync_dist_group is not None
            or type(reduce_fx) is not str
        ):
            if logger and trainer.logger is None:
                warnings.warn(
                    f"You called `self.log({name!r}, ..., logger=True)` but have no logger configured. You can "
                    "enable one by doing `Trainer(logger=ALogger(...))`",
                    UserWarning,
                    stacklevel=2,
                )
            if not self._log_options(name, rank_zero_only, enable_graph, sync_dist_group):
                return
            reduce_fx = _reduce_name(name, reduce_fx)
        if type(value) is not torch.Tensor:  # tensors first: the per-step case
            if _is_metric_collection(value):
                # A torchmetrics MetricCollection: each member is a Metric logged under "name/member".
                for key, metric in _collection_items(value):
                    self.log(
                        f"{name}/{key}",
                        metric,
                        prog_bar,
                        logger,
                        on_step,
                        on_epoch,
                        reduce_fx,
                        sync_dist=sync_dist,
                        add_dataloader_idx=add_dataloader_idx,
                        batch_size=batch_size,
                    )
                return
            _check_loggable(name, value)
            if metric_attribute is None and callable(getattr(value, "compute", None)):
                self._check_metric_attribute(name, value)
        # Positional: this runs every step, and keyword passing costs a little more per call.
        trainer._log(name, value, on_step, on_epoch, prog_bar, sync_dist, reduce_fx, batch_size, add_dataloader_idx)
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

    def _check_metric_attribute(self, name: str, metric: Any) -> None:
        """Refuse, as Lightning, a logged torchmetrics object that is not an attribute of the module.

        Its state goes into checkpoints (an exact resume mid-epoch) and is synced under several
        processes by its attribute path, so a metric the module does not hold cannot be logged.
        """
        paths = self.__dict__.get("_gt_metric_paths")
        if paths is None or id(metric) not in paths:  # worked out once, again when a new metric appears
            paths = {id(m): n for n, m in self.named_modules() if callable(getattr(m, "compute", None)) and n}
            self.__dict__["_gt_metric_paths"] = paths
        if id(metric) in paths:
            return
        if not paths:
            raise MisconfigurationException(
                "Could not find the `LightningModule` attribute for the `torchmetrics.Metric` logged. You can fix "
                f"this by setting an attribute for the metric in your `LightningModule` (self.log({name!r}, ...))."
            )
        raise MisconfigurationException(
            "Could not find the `LightningModule` attribute for the `torchmetrics.Metric` logged. You can fix "
            f"this by calling `self.log({name}, ..., metric_attribute=name)` where `name` is one of "
            f"{list(paths.values())}"
        )

    def log_dict(self, dictionary: Mapping[str, Any], *args: Any, **kwargs: Any) -> None:
        """``self.log`` every item of ``dictionary`` (a dict or a torchmetrics ``MetricCollection``).

        A ``MetricCollection``'s members are logged under the collection's own keys (its ``prefix``
        and ``postfix`` included), each computed and reset at epoch end. Takes ``self.log``'s options.
        """
        items = _collection_items(dictionary) if _is_metric_collection(dictionary) else dictionary.items()
        for name, value in items:
            self.log(name, value, *args, **kwargs)


def _is_metric_collection(value: Any) -> bool:
    """True for a torchmetrics ``MetricCollection`` (duck-typed: ``compute``, ``reset`` and ``items``)."""
    return all(callable(getattr(value, attr, None)) for attr in ("compute", "reset", "items", "keys"))


def _collection_items(collection: Any) -> Any:
    """A ``MetricCollection``'s members as Lightning reads them: without its base metrics, and sharing the
    state of a compute group's members (``copy_state=False``) when the collection has compute groups."""
    if getattr(collection, "_enable_compute_groups", False):
        return collection.items(keep_base=False, copy_state=False)
    try:
        return collection.items(keep_base=False)
    except TypeError:  # an object that only looks like a collection (duck-typed above)
        return collection.items()


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
