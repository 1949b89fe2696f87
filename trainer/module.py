"""``TrainModule`` (and ``DataModule``): the user's side of the contract, with Lightning's names.

Porting a ``LightningModule`` is a change of base class. The trainer drives these methods; a module
used outside a trainer is a plain ``nn.Module`` whose ``self.log`` does nothing. The hooks are in
:mod:`trainer.module_hooks`, hyperparameters in :mod:`trainer.hparams`, the data module in
:mod:`trainer.datamodule` (re-exported here), checkpoint loading in :mod:`trainer.checkpoint.lightning_format`.
"""

from __future__ import annotations

import builtins
import contextlib
import numbers
import os
from collections.abc import Callable, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from trainer.datamodule import DataModule
from trainer.hparams import HyperparametersMixin
from trainer.module_export import ExportMixin
from trainer.module_hooks import DataHooks, ModelDefaults, ModelHooks

if TYPE_CHECKING:
    from trainer.trainer import Trainer

M = TypeVar("M", bound="TrainModule")

__all__ = ["DataModule", "TrainModule"]

_Tensor = torch.Tensor


class TrainModule(HyperparametersMixin, ModelHooks, ModelDefaults, DataHooks, ExportMixin, nn.Module):
    """Base class for models the :class:`~trainer.Trainer` trains.

    Override ``training_step`` and ``configure_optimizers``; add ``validation_step``, ``test_step``,
    ``predict_step`` and any ``on_*`` hook as needed. Set ``automatic_optimization = False`` to call
    ``self.optimizers()``, ``self.manual_backward(loss)`` and ``opt.step()`` yourself.

    >>> class Net(TrainModule):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.layer = nn.Linear(2, 1)
    ...     def training_step(self, batch, batch_idx):
    ...         return self.layer(batch).sum()
    ...     def configure_optimizers(self):
    ...         return torch.optim.SGD(self.parameters(), lr=0.1)
    >>> Net().training_step(torch.ones(1, 2), 0).shape
    torch.Size([])
    """

    #: When False the trainer calls ``training_step`` and leaves backward and step to it.
    automatic_optimization: bool = True
    #: Whether loading weights requires every key to match (``load_from_checkpoint``'s default ``strict``).
    strict_loading: bool = True
    #: An example input (a tensor or a tuple of them): the model summary shows input and output sizes.
    example_input_array: Any = None
    #: The device mesh of a model-parallel strategy (None: geartrain has none).
    device_mesh: Any = None
    #: Lightning Fabric's object when run by Fabric (always None: geartrain has no Fabric).
    fabric: Any = None
    #: The checkpoint keys of the hyperparameters (geartrain's file format; Lightning's are ``hyper_parameters``...).
    CHECKPOINT_HYPER_PARAMS_KEY = "hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "hparams_type"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer: Trainer | None = None

    # ----------------------------------------------------------------- trainer state
    @property
    def trainer(self) -> Trainer:
        """The trainer driving this module (an error outside ``fit``/``validate``/...)."""
        if self._trainer is None:
            if self.__dict__.get("_jit_is_scripting"):  # torch.jit walks attributes; not an error there
                return None  # type: ignore[return-value]
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer")
        return self._trainer

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far (0 outside a trainer)."""
        return self._trainer.global_step if self._trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        """The epoch being trained, from 0 (0 outside a trainer)."""
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def device(self) -> torch.device:
        """The device of the module's first parameter or buffer (CPU if it has none)."""
        for param in self.parameters():
            return param.device
        for buffer in self.buffers():
            return buffer.device
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the module's first floating-point parameter (the default dtype if none)."""
        for param in self.parameters():
            if param.is_floating_point():
                return param.dtype
        return torch.get_default_dtype()

    @property
    def on_gpu(self) -> bool:
        """Whether the module is on a CUDA device."""
        return self.device.type == "cuda"

    @property
    def global_rank(self) -> int:
        """This process's rank among all processes (0 outside a trainer)."""
        return self._trainer.strategy.global_rank if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        """This process's rank on its node (0 outside a trainer)."""
        return self._trainer.strategy.local_rank if self._trainer is not None else 0

    @property
    def loggers(self) -> list[Any]:
        """The trainer's loggers (the callbacks that write logged metrics), [] outside a trainer."""
        t = self._trainer
        if t is None:
            return []
        return list(t.loggers)

    @property
    def logger(self) -> Any:
        """The first of :attr:`loggers`, or None."""
        loggers = self.loggers
        return loggers[0] if loggers else None

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only (so a message appears once under DDP)."""
        if self.global_rank == 0:
            builtins.print(*args, **kwargs)

    def all_gather(self, data: Any, group: Any | None = None, sync_grads: bool = False) -> Any:
        """Gather ``data`` (a tensor, or a dict/list/tuple of them) from every process.

        Each tensor gets a new first dimension of size world size (on one process: returned as it
        is, as Lightning does). ``sync_grads=True`` keeps the graph (``torch.distributed.nn``).
        """
        if group is not None:
            raise ValueError("self.all_gather(group=...) is not supported: geartrain gathers over all processes")
        t = self._trainer
        if t is None or t.strategy.world_size == 1:
            return data
        gather: Callable[[torch.Tensor], torch.Tensor] = _gather_with_grads if sync_grads else t.strategy.all_gather
        return _map_tensors(data, gather)

    @classmethod
    def load_from_checkpoint(
        cls: type[M],
        checkpoint_path: str | os.PathLike[str] | IO[bytes],
        map_location: Any = None,
        hparams_file: str | os.PathLike[str] | None = None,
        strict: bool | None = None,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> M:
        """Rebuild the module from a checkpoint's saved hyperparameters, then load its weights.

        ``kwargs`` override saved hyperparameters or supply those a checkpoint cannot hold (an
        ``nn.Module`` argument: it is saved as a description; a missing one is an error naming it).
        Reads geartrain's and Lightning 2.x's checkpoints, always with ``weights_only=True``.
        ``strict`` defaults to :attr:`strict_loading`.
        """
        from trainer.checkpoint.lightning_format import load_from_checkpoint

        return load_from_checkpoint(cls, checkpoint_path, map_location, hparams_file, strict, weights_only, kwargs)

    # ----------------------------------------------------------------- user steps
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | Mapping[str, Any] | None:
        """Compute the loss of one batch; return it, a dict with ``"loss"``, or None to skip."""
        raise NotImplementedError(
            f"{type(self).__name__} must define training_step(self, batch, batch_idx) to be trained"
        )

    def configure_optimizers(self) -> Any:
        """Return an optimizer, a list of them, or ``{"optimizer": ..., "lr_scheduler": ...}``."""
        raise NotImplementedError(f"{type(self).__name__} must define configure_optimizers()")

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        """Default prediction: ``self(batch)``; takes ``(batch, batch_idx[, dataloader_idx])`` as Lightning's does."""
        return self(kwargs["batch"] if "batch" in kwargs else args[0])

    # ----------------------------------------------------------------- logging
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
        return not (rank_zero_only and self.global_rank != 0)

    def log_dict(self, dictionary: Mapping[str, Any], *args: Any, **kwargs: Any) -> None:
        """``self.log`` every item of ``dictionary`` (a dict or a torchmetrics ``MetricCollection``).

        A ``MetricCollection``'s members are logged under the collection's own keys (its ``prefix``
        and ``postfix`` included), each computed and reset at epoch end. Takes ``self.log``'s options.
        """
        for name, value in dictionary.items():
            self.log(name, value, *args, **kwargs)

    # ----------------------------------------------------------------- manual optimisation
    def optimizers(self, use_pl_optimizer: bool = True) -> Any:
        """The optimizer(s) from ``configure_optimizers``; one object if there is one.

        ``use_pl_optimizer=False`` returns the torch optimizers themselves (their ``step`` bypasses
        the strategy: no fp16 scaling, no global step count), as in Lightning.
        """
        handles = self.trainer.optimizer_handles if use_pl_optimizer else self.trainer.optimizers
        return handles[0] if len(handles) == 1 else handles

    def lr_schedulers(self) -> Any:
        """The scheduler(s) from ``configure_optimizers``; None, one, or a list."""
        schedulers = [cfg.scheduler for cfg in self.trainer.lr_scheduler_configs]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward through the strategy (loss scaling, sync), in place of ``loss.backward()``.

        The trainer's ``on_nonfinite`` policy applies: a non-finite loss raises, warns, or (``"skip"``)
        is not backpropagated and the next ``opt.step()`` is dropped.
        """
        from trainer.loops.step import manual_backward

        manual_backward(self.trainer, loss, *args, **kwargs)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward of the training loss (automatic optimisation); override to change how it runs."""
        loss.backward(*args, **kwargs)

    def toggle_optimizer(self, optimizer: Any) -> None:
        """Let only ``optimizer``'s parameters require grad (others switched off until untoggled)."""
        opt = getattr(optimizer, "optimizer", optimizer)
        own = {id(p) for group in opt.param_groups for p in group["params"]}
        saved: dict[int, bool] = self.__dict__.setdefault("_toggled", {})
        for param in self.parameters():
            if id(param) not in own:
                saved.setdefault(id(param), param.requires_grad)
                param.requires_grad = False

    def untoggle_optimizer(self, optimizer: Any) -> None:
        """Restore the ``requires_grad`` flags :meth:`toggle_optimizer` switched off."""
        saved: dict[int, bool] = self.__dict__.pop("_toggled", {})
        for param in self.parameters():
            if id(param) in saved:
                param.requires_grad = saved[id(param)]

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: Any) -> Iterator[None]:
        """:meth:`toggle_optimizer` for the ``with`` block, untoggled after it."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    def freeze(self: M) -> M:
        """No parameter requires grad, and eval mode."""
        for param in self.parameters():
            param.requires_grad = False
        return self.eval()

    def unfreeze(self: M) -> M:
        """Every parameter requires grad, and training mode."""
        for param in self.parameters():
            param.requires_grad = True
        return self.train()

    def clip_gradients(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip ``optimizer``'s gradients by ``"norm"`` (default) or ``"value"``, unscaling first under fp16."""
        opt = getattr(optimizer, "optimizer", optimizer)
        self.trainer.strategy.clip_gradients(opt, gradient_clip_val, gradient_clip_algorithm or "norm")


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


def _gather_with_grads(x: torch.Tensor) -> torch.Tensor:
    """All-gather that keeps the autograd graph (gradients flow back to every rank's input)."""
    import torch.distributed.nn.functional as dist_nn

    return torch.stack(dist_nn.all_gather(x))


def _map_tensors(data: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``fn`` applied to every tensor in a tree of dicts, lists and tuples."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, Mapping):
        return type(data)({k: _map_tensors(v, fn) for k, v in data.items()})  # type: ignore[call-arg]
    if isinstance(data, (list, tuple)):
        return type(data)(_map_tensors(v, fn) for v in data)
    return data
