"""``TrainModule`` and ``DataModule``: the user's side of the contract, with Lightning's names.

Porting a ``LightningModule`` is a change of base class. The trainer drives these methods; a module
used outside a trainer is a plain ``nn.Module`` whose ``self.log`` does nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from trainer.trainer import Trainer

__all__ = ["DataModule", "TrainModule"]


class _Hooks:
    """Do-nothing hooks shared by modules and data modules, so the trainer can always call them."""

    def setup(self, stage: str) -> None:
        """Build what the ``stage`` (``"fit"``, ``"validate"``, ``"test"``, ``"predict"``) needs."""

    def teardown(self, stage: str) -> None:
        """Release what :meth:`setup` built."""

    def state_dict(self) -> dict[str, Any]:  # overridden by nn.Module for TrainModule
        """State to put into checkpoints."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class DataModule(_Hooks):
    """Bundles the data of a task: ``setup(stage)`` then one dataloader method per stage.

    Override the ``*_dataloader`` methods a run needs; the trainer reports which one is missing.
    """

    def prepare_data(self) -> None:
        """Download or write files, once per node (here: on every process; keep it idempotent)."""

    def train_dataloader(self) -> Iterable[Any]:
        """The training data."""
        raise NotImplementedError(f"{type(self).__name__} does not define train_dataloader()")

    def val_dataloader(self) -> Iterable[Any]:
        """The validation data."""
        raise NotImplementedError(f"{type(self).__name__} does not define val_dataloader()")

    def test_dataloader(self) -> Iterable[Any]:
        """The test data."""
        raise NotImplementedError(f"{type(self).__name__} does not define test_dataloader()")

    def predict_dataloader(self) -> Iterable[Any]:
        """The prediction data."""
        raise NotImplementedError(f"{type(self).__name__} does not define predict_dataloader()")


class TrainModule(nn.Module):
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

    def __init__(self) -> None:
        super().__init__()
        self._trainer: Trainer | None = None
        self.hparams: dict[str, Any] = {}

    # ----------------------------------------------------------------- trainer state
    @property
    def trainer(self) -> Trainer:
        """The trainer driving this module (an error outside ``fit``/``validate``/...)."""
        if self._trainer is None:
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

    def save_hyperparameters(self, *names: str, **values: Any) -> None:
        """Record the caller's ``__init__`` arguments (or the given ``names``/``values``) in ``hparams``.

        They go into every checkpoint and into TensorBoard's HPARAMS tab.
        """
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        if caller is not None and not values:
            local = caller.f_locals
            init_args = [n for n in caller.f_code.co_varnames[: caller.f_code.co_argcount] if n != "self"]
            for name in names or init_args:
                if name in local:
                    self.hparams[name] = local[name]
        self.hparams.update(values)

    # ----------------------------------------------------------------- user steps
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | Mapping[str, Any] | None:
        """Compute the loss of one batch; return it, a dict with ``"loss"``, or None to skip."""
        raise NotImplementedError(
            f"{type(self).__name__} must define training_step(self, batch, batch_idx) to be trained"
        )

    def configure_optimizers(self) -> Any:
        """Return an optimizer, a list of them, or ``{"optimizer": ..., "lr_scheduler": ...}``."""
        raise NotImplementedError(f"{type(self).__name__} must define configure_optimizers()")

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        """Default prediction: ``self(batch)``."""
        return self(batch)

    # ----------------------------------------------------------------- logging
    def log(
        self,
        name: str,
        value: Any,
        *,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        prog_bar: bool = False,
        sync_dist: bool = False,
        reduce_fx: str = "mean",
        batch_size: int | None = None,
    ) -> None:
        """Record a metric. ``value``: a tensor, a number, or a torchmetrics ``Metric``.

        Defaults follow Lightning: in ``training_step`` values are logged per step; in evaluation
        steps and in epoch-end hooks, per epoch. Epoch values are means weighted by ``batch_size``
        (inferred from the batch when omitted); a ``Metric`` is computed and reset at epoch end.
        With both ``on_step`` and ``on_epoch`` the keys get ``_step`` and ``_epoch`` suffixes.
        ``sync_dist=True`` reduces epoch values over processes (a metric syncs itself).
        """
        if self._trainer is None:
            return
        if type(value) is not torch.Tensor and _is_metric_collection(value):  # tensors first: the per-step case
            # A torchmetrics MetricCollection: each member is a Metric logged under "name/member".
            for key, metric in value.items():
                self.log(
                    f"{name}/{key}",
                    metric,
                    on_step=on_step,
                    on_epoch=on_epoch,
                    prog_bar=prog_bar,
                    sync_dist=sync_dist,
                    reduce_fx=reduce_fx,
                    batch_size=batch_size,
                )
            return
        # Positional: this runs every step, and keyword passing costs a little more per call.
        self._trainer._log(name, value, on_step, on_epoch, prog_bar, sync_dist, reduce_fx, batch_size)

    def log_dict(self, values: Mapping[str, Any], **kwargs: Any) -> None:
        """``self.log`` every item of ``values`` (a dict or a torchmetrics ``MetricCollection``).

        A ``MetricCollection``'s members are logged under the collection's own keys (its ``prefix``
        and ``postfix`` included), each computed and reset at epoch end.
        """
        for name, value in values.items():
            self.log(name, value, **kwargs)

    # ----------------------------------------------------------------- manual optimisation
    def optimizers(self) -> Any:
        """The optimizer(s) from ``configure_optimizers``; one object if there is one."""
        handles = self.trainer.optimizer_handles
        return handles[0] if len(handles) == 1 else handles

    def lr_schedulers(self) -> Any:
        """The scheduler(s) from ``configure_optimizers``; None, one, or a list."""
        schedulers = [cfg.scheduler for cfg in self.trainer.lr_scheduler_configs]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: torch.Tensor) -> None:
        """Backward through the strategy (loss scaling, sync), in place of ``loss.backward()``.

        The trainer's ``on_nonfinite`` policy applies: a non-finite loss raises, warns, or (``"skip"``)
        is not backpropagated and the next ``opt.step()`` is dropped.
        """
        from trainer.loops.step import manual_backward

        manual_backward(self.trainer, loss)

    def clip_gradients(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
    ) -> None:
        """Clip ``optimizer``'s gradients (unscaling first under fp16), for manual optimisation."""
        opt = getattr(optimizer, "optimizer", optimizer)
        self.trainer.strategy.clip_gradients(opt, gradient_clip_val, gradient_clip_algorithm)

    # ----------------------------------------------------------------- hooks (all optional)
    def on_fit_start(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...
    def on_train_epoch_end(self) -> None: ...
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None: ...
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_validation_start(self) -> None: ...
    def on_validation_end(self) -> None: ...
    def on_validation_epoch_start(self) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_validation_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_test_start(self) -> None: ...
    def on_test_end(self) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_epoch_end(self) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_predict_start(self) -> None: ...
    def on_predict_end(self) -> None: ...
    def on_predict_epoch_start(self) -> None: ...
    def on_predict_epoch_end(self) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_before_backward(self, loss: torch.Tensor) -> None: ...
    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...
    def setup(self, stage: str) -> None: ...
    def teardown(self, stage: str) -> None: ...


def _is_metric_collection(value: Any) -> bool:
    """True for a torchmetrics ``MetricCollection`` (duck-typed: ``compute``, ``reset`` and ``items``)."""
    return all(callable(getattr(value, attr, None)) for attr in ("compute", "reset", "items", "keys"))
