"""``StochasticWeightAveraging`` (Lightning 2.6's name and semantics): SWA with ``SWALR``.

From epoch ``swa_epoch_start`` the learning rate anneals to ``swa_lrs`` (``torch.optim.swa_utils.SWALR``,
replacing the module's scheduler, as Lightning does) and an equal-weight average of the weights is
updated at the start of every epoch up to the last. When the last epoch has been trained the module
takes the average, and a module with batch norms has its running statistics recomputed for the
averaged weights with ``torch.optim.swa_utils.update_bn`` over the training data.

One difference from Lightning, on purpose: Lightning recomputes the batch-norm statistics in an extra
training epoch without backward (``current_epoch`` and ``global_step`` end one higher); here
``update_bn`` does it after the last epoch, so the counters say what was trained. The statistics are
the same when ``training_step`` runs the module's ``forward`` on the batch's first element.

Checkpoints hold the average, its count, the SWALR state and the epoch last averaged; resuming (also
in the middle of the SWA phase) continues exactly. Not for sharded models (FSDP): refused.
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn
from torch.optim.swa_utils import SWALR, update_bn

from callbacks.base import Callback
from trainer.common.errors import UserError

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

log = logging.getLogger("trainer")

__all__ = ["StochasticWeightAveraging"]

_CPU = torch.device("cpu")  # Lightning's default device of the average

AvgFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class StochasticWeightAveraging(Callback):
    """Average the weights of the last epochs (Izmailov et al., 2018, "Averaging Weights Leads to Wider Optima").

    Args:
        swa_lrs: the SWA learning rate: one float for every parameter group, or a list with one per group.
        swa_epoch_start: the epoch (counted from 1) SWA starts at, or a float in ``[0, 1]``: that share of
            ``max_epochs``.
        annealing_epochs: epochs of the annealing from the current learning rate to ``swa_lrs``.
        annealing_strategy: ``"cos"`` or ``"linear"``.
        avg_fn: ``(averaged, current, n_averaged) -> new averaged``; default: the equal-weight mean.
        device: where the average lives (``None``: the module's device).

    Example:
        >>> swa = StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=3)
        >>> swa.swa_start
        2
    """

    def __init__(
        self,
        swa_lrs: float | list[float],
        swa_epoch_start: int | float = 0.8,
        annealing_epochs: int = 10,
        annealing_strategy: Literal["cos", "linear"] = "cos",
        avg_fn: AvgFn | None = None,
        device: torch.device | str | None = _CPU,
    ) -> None:
        err = (
            f"swa_epoch_start should be a >0 integer or a float between 0 and 1. "
            f"StochasticWeightAveraging(swa_epoch_start={swa_epoch_start!r}): give an int >= 1 or a float in [0, 1]"
        )
        if isinstance(swa_epoch_start, bool) or not isinstance(swa_epoch_start, (int, float)):
            raise UserError(err)
        if isinstance(swa_epoch_start, int) and swa_epoch_start < 1:
            raise UserError(err)
        if isinstance(swa_epoch_start, float) and not 0 <= swa_epoch_start <= 1:
            raise UserError(err)
        wrong_float = isinstance(swa_lrs, float) and swa_lrs <= 0
        wrong_list = isinstance(swa_lrs, list) and not all(isinstance(lr, float) and lr > 0 for lr in swa_lrs)
        if not isinstance(swa_lrs, (float, list)) or wrong_float or wrong_list:
            raise UserError(
                "The `swa_lrs` should a positive float, or a list of positive floats. "
                f"StochasticWeightAveraging(swa_lrs={swa_lrs!r}): one per parameter group, e.g. swa_lrs=1e-2"
            )
        if annealing_strategy not in ("cos", "linear"):
            raise UserError(f"StochasticWeightAveraging(annealing_strategy={annealing_strategy!r}): 'cos' or 'linear'")
        if avg_fn is not None and not callable(avg_fn):
            raise UserError(
                "The `avg_fn` should be callable. StochasticWeightAveraging(avg_fn=...): give a function (averaged, current, n) -> averaged"
            )
        if device is not None and not isinstance(device, (torch.device, str)):
            raise UserError(f"device is expected to be a torch.device or a str. Found {device}")
        self.n_averaged: torch.Tensor | None = None
        self._swa_epoch_start = swa_epoch_start
        self._swa_lrs = swa_lrs
        self._annealing_epochs = annealing_epochs
        self._annealing_strategy = annealing_strategy
        self._avg_fn: AvgFn = avg_fn or self.avg_fn
        self._device = device
        self._model_contains_batch_norm: bool | None = None
        self._average_model: nn.Module | None = None
        self._initialized = False
        self._swa_scheduler: Any = None
        self._scheduler_state: dict[str, Any] | None = None
        self._init_n_averaged = 0
        self._latest_update_epoch = -1
        self._max_epochs: int = -1
        self._resumed_at_epoch_end = False

    @property
    def swa_start(self) -> int:
        """The first epoch of the SWA phase, counted from 0."""
        assert isinstance(self._swa_epoch_start, int)
        return max(self._swa_epoch_start - 1, 0)

    @property
    def swa_end(self) -> float:
        """The last epoch of the SWA phase, counted from 0 (infinite without ``max_epochs``)."""
        return math.inf if self._max_epochs == -1 else self._max_epochs - 1

    @staticmethod
    def pl_module_contains_batch_norm(pl_module: TrainModule) -> bool:
        """Whether the module has batch norms (whose statistics are recomputed at the end)."""
        return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in pl_module.modules())

    # ----------------------------------------------------------------- hooks
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        """Copy the module (before a strategy wraps it); the copy holds the average."""
        if stage == "fit":
            self._average_model = copy.deepcopy(pl_module, memo={id(trainer): None})

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Refuse what SWA does not support; resolve ``swa_epoch_start`` against ``max_epochs``."""
        if any(hasattr(p, "device_mesh") for p in pl_module.parameters()):
            raise UserError(
                "SWA does not currently support sharded models. StochasticWeightAveraging does not support sharded models (FSDP, model parallel); use "
                "strategy='ddp', or EMAWeightAveraging/WeightAveraging, which do"
            )
        if len(trainer.optimizers) != 1:
            raise UserError(f"SWA currently works with 1 `optimizer`, got {len(trainer.optimizers)}")
        if len(trainer.lr_scheduler_configs) > 1:
            raise UserError(
                "SWA currently not supported for more than 1 `lr_scheduler`: "
                f"StochasticWeightAveraging replaces the learning-rate scheduler: it supports at most 1, "
                f"got {len(trainer.lr_scheduler_configs)}"
            )
        max_epochs = -1 if trainer.max_epochs is None else trainer.max_epochs
        if isinstance(self._swa_epoch_start, float):
            if max_epochs == -1:
                raise UserError(
                    "SWA with `swa_epoch_start` as a float is not supported when `max_epochs=-1`. "
                    "StochasticWeightAveraging(swa_epoch_start=<float>) needs max_epochs; with max_epochs=-1 "
                    "give swa_epoch_start as an int epoch"
                )
            self._swa_epoch_start = int(max_epochs * self._swa_epoch_start)
        self._model_contains_batch_norm = self.pl_module_contains_batch_norm(pl_module)
        self._max_epochs = max_epochs

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """At the SWA phase's first epoch, start SWALR; in the phase, average the weights once per epoch."""
        epoch = trainer.current_epoch
        in_phase = self.swa_start <= epoch <= self.swa_end
        if not self._initialized and in_phase:
            self._start_phase(trainer, pl_module)
        if in_phase and epoch > self._latest_update_epoch:
            assert self.n_averaged is not None and self._average_model is not None
            self.update_parameters(self._average_model, pl_module, self.n_averaged, self._avg_fn)
            self._latest_update_epoch = epoch

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Step SWALR once per epoch (where the trainer steps epoch-interval schedulers)."""
        if self._swa_scheduler is not None and pl_module.automatic_optimization:
            if self._resumed_at_epoch_end:
                # Resumed from a checkpoint taken after the epoch's last step: SWALR, rebuilt, has not
                # seen an optimizer step yet and torch would warn about the order, which is right here.
                self._resumed_at_epoch_end = False
                with warnings.catch_warnings():
                    warnings.filterwarnings(
                        "ignore", message="Detected call of `lr_scheduler.step", category=UserWarning
                    )
                    self._swa_scheduler.step()
                return
            self._swa_scheduler.step()

    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """After the last epoch, the module takes the average; batch-norm statistics are recomputed for it."""
        finished_phase = self._max_epochs != -1 and trainer.current_epoch - 1 == self.swa_end
        if self._average_model is None or not (finished_phase or (self._max_epochs == -1 and self._initialized)):
            return
        self.transfer_weights(self._average_model, pl_module)
        if self._model_contains_batch_norm and finished_phase:
            loader = trainer.loaders["fit"]  # the loop's own (resumable) loader: the order the training drew
            num = trainer.num_training_batches
            batches = loader if math.isinf(num) else itertools.islice(loader, int(num))
            update_bn(batches, pl_module, device=trainer.strategy.root_device)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """A checkpoint from the SWA phase holds SWALR's state, not the module's scheduler: drop the latter."""
        own = checkpoint.get("callbacks", {}).get(self.state_key) or {}
        if own.get("scheduler_state") is not None and trainer.lr_scheduler_configs:
            trainer.lr_scheduler_configs.clear()

    def state_dict(self) -> dict[str, Any]:
        """The count, the epoch last averaged, SWALR's state and the average's weights."""
        return {
            "n_averaged": 0 if self.n_averaged is None else self.n_averaged.item(),
            "latest_update_epoch": self._latest_update_epoch,
            "scheduler_state": None if self._swa_scheduler is None else self._swa_scheduler.state_dict(),
            "average_model_state": None if self._average_model is None else self._average_model.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (SWALR is rebuilt from it at the next epoch's start)."""
        self._init_n_averaged = state_dict["n_averaged"]
        self._latest_update_epoch = state_dict["latest_update_epoch"]
        self._scheduler_state = state_dict["scheduler_state"]
        if self._average_model is not None and state_dict["average_model_state"] is not None:
            self._average_model.load_state_dict(state_dict["average_model_state"])

    # ----------------------------------------------------------------- the average
    def _start_phase(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._initialized = True
        assert self._average_model is not None
        self._average_model = self._average_model.to(self._device or trainer.strategy.root_device)
        optimizer = trainer.optimizers[0]
        if isinstance(self._swa_lrs, float):
            self._swa_lrs = [self._swa_lrs] * len(optimizer.param_groups)
        for lr, group in zip(self._swa_lrs, optimizer.param_groups):
            group["initial_lr"] = lr
        self._swa_scheduler = SWALR(
            optimizer,
            swa_lr=self._swa_lrs,  # type: ignore[arg-type]
            anneal_epochs=self._annealing_epochs,
            anneal_strategy=self._annealing_strategy,
            last_epoch=self._max_epochs if self._annealing_strategy == "cos" else -1,
        )
        if self._scheduler_state is not None:
            self._swa_scheduler.load_state_dict(self._scheduler_state)
            self._resumed_at_epoch_end = True
        # SWALR replaces the module's scheduler (Lightning swaps its config); this callback steps it.
        if trainer.lr_scheduler_configs:
            config = trainer.lr_scheduler_configs[0]
            if config.interval != "epoch" or config.frequency != 1:
                warnings.warn(f"SWA is currently only supported every epoch. Found {config}", UserWarning, stacklevel=2)
            if trainer.is_global_zero:
                log.info(f"Swapping scheduler `{type(config.scheduler).__name__}` for `SWALR`")
        trainer.lr_scheduler_configs.clear()
        if self.n_averaged is None:
            self.n_averaged = torch.tensor(self._init_n_averaged, dtype=torch.long, device=pl_module.device)

    @staticmethod
    def transfer_weights(src_pl_module: nn.Module, dst_pl_module: nn.Module) -> None:
        """Copy the parameters of ``src_pl_module`` into ``dst_pl_module``."""
        for src, dst in zip(src_pl_module.parameters(), dst_pl_module.parameters()):
            dst.detach().copy_(src.to(dst.device))

    @staticmethod
    def update_parameters(average_model: nn.Module, model: nn.Module, n_averaged: torch.Tensor, avg_fn: AvgFn) -> None:
        """One averaging step: the first copies the weights, later ones apply ``avg_fn``."""
        for p_swa, p_model in zip(average_model.parameters(), model.parameters()):
            device = p_swa.device
            swa, current = p_swa.detach(), p_model.detach().to(device)
            p_swa.detach().copy_(current if n_averaged == 0 else avg_fn(swa, current, n_averaged.to(device)))
        n_averaged += 1

    @staticmethod
    def avg_fn(
        averaged_model_parameter: torch.Tensor, model_parameter: torch.Tensor, num_averaged: torch.Tensor
    ) -> torch.Tensor:
        """The equal-weight running mean."""
        return averaged_model_parameter + (model_parameter - averaged_model_parameter) / (num_averaged + 1)
