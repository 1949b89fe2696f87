"""``LearningRateMonitor``: log every optimizer's learning rates (and momentum, weight decay) to the loggers."""

from __future__ import annotations

import warnings
from collections import Counter
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from callbacks.base import Callback, logs_at
from trainer.common.errors import UserError

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["LearningRateMonitor"]


def _number(value: Any) -> float:
    return float(value.item() if isinstance(value, torch.Tensor) else value)


def _batches_that_stepped(trainer: Trainer, pl_module: TrainModule) -> int:
    """Lightning's logging x-axis: automatic optimisation steps once per accumulation window; manual
    optimisation counts every batch (several optimizers stepping in one batch are one logging step)."""
    p = trainer.progress
    return p.global_step if pl_module.automatic_optimization else p.batches_before_epoch + p.batch_in_epoch


class LearningRateMonitor(Callback):
    """Send the learning rate of every parameter group to the loggers, keyed as Lightning keys them.

    The key is ``lr-<OptimizerClass>``, or the scheduler config's ``"name"`` when it has one. A
    second optimizer of the same class (without a named scheduler) gets ``-1``, a third ``-2``
    (``lr-SGD-1``). With several parameter groups each gets ``/pg1``, ``/pg2``, ... or ``/<name>``
    where the group has a ``"name"`` (a single named group gets ``/<name>`` too). Momentum and weight
    decay, when asked for, are ``<key>-momentum`` (``betas[0]`` for Adam-like optimizers, 0 where
    there is none) and ``<key>-weight_decay``.

    Args:
        logging_interval: ``"step"`` logs the rates at the start of every batch where the trainer
            logs (every ``log_every_n_steps`` batches that stepped, Lightning's rule); ``"epoch"``
            logs the rate an epoch starts with, at that epoch's first step; ``None`` picks ``"step"`` if a scheduler steps per
            step, else ``"epoch"``.
        log_momentum: also log momentum.
        log_weight_decay: also log weight decay.

    The values also enter ``trainer.callback_metrics`` (as Lightning's), so other callbacks can monitor them.

    Raises:
        UserError: one optimizer has two parameter groups with the same ``"name"`` (a ``ValueError``
            and Lightning's ``MisconfigurationException``), at the start of training.
    """

    def __init__(
        self, logging_interval: str | None = None, log_momentum: bool = False, log_weight_decay: bool = False
    ) -> None:
        if logging_interval not in (None, "step", "epoch"):
            raise ValueError(f"logging_interval must be 'step', 'epoch' or None, got {logging_interval!r}")
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        #: Every learning rate logged so far, by key (Lightning's ``lrs``).
        self.lrs: dict[str, list[float]] = {}
        #: The momentum (``<key>-momentum``) and weight decay (``<key>-weight_decay``) logged last.
        self.last_momentum_values: dict[str, float | None] = {}
        self.last_weight_decay_values: dict[str, float | None] = {}

    def _log(self, trainer: Trainer, step: int) -> None:
        values = self.learning_rates(trainer)
        for key in values:  # an optimizer that gained a parameter group: its history goes on under /pg1 (Lightning's)
            old = key.removesuffix("/pg1")
            if old != key and old in self.lrs and key not in self.lrs:
                self.lrs[key] = self.lrs.pop(old)
        for key, value in values.items():
            if key.endswith("-momentum"):
                self.last_momentum_values[key] = value
            elif key.endswith("-weight_decay"):
                self.last_weight_decay_values[key] = value
            else:
                self.lrs.setdefault(key, []).append(value)
        trainer.log_metrics(values, step=step)
        # As Lightning: the rates are also callback metrics, so EarlyStopping or a checkpoint can monitor them.
        device = trainer.strategy.root_device
        trainer.callback_metrics.update({key: torch.tensor(value, device=device) for key, value in values.items()})

    def _interval(self, trainer: Trainer) -> str:
        if self.logging_interval is not None:
            return self.logging_interval
        per_step = any(cfg.interval == "step" for cfg in trainer.lr_scheduler_configs)
        return "step" if per_step else "epoch"

    @staticmethod
    def _names(trainer: Trainer) -> list[tuple[torch.optim.Optimizer, str]]:
        """Every optimizer with its base key: scheduled ones first (as Lightning orders them)."""
        named: list[tuple[torch.optim.Optimizer, str]] = []
        seen_types: Counter[type] = Counter()

        def add(optimizer: torch.optim.Optimizer, given: str | None) -> None:
            name = given if given is not None else f"lr-{type(optimizer).__name__}"
            if given is None:
                seen_types[type(optimizer)] += 1
                if seen_types[type(optimizer)] > 1:
                    name = f"{name}-{seen_types[type(optimizer)] - 1}"
            named.append((optimizer, name))

        for cfg in trainer.lr_scheduler_configs:
            optimizer = cfg.scheduler.optimizer
            if all(optimizer is not o for o, _ in named):
                add(optimizer, cfg.name)
        for optimizer in trainer.optimizers:
            if all(optimizer is not o for o, _ in named):
                add(optimizer, None)
        return named

    def learning_rates(self, trainer: Trainer) -> dict[str, float]:
        """The current values of every parameter group, keyed as they are logged."""
        out: dict[str, float] = {}
        for optimizer, name in self._names(trainer):
            groups = optimizer.param_groups
            group_names = [g.get("name", f"pg{i + 1}") for i, g in enumerate(groups)]
            if len(set(group_names)) != len(group_names):
                raise UserError(
                    f"LearningRateMonitor: {name} has parameter groups with the same 'name' ({group_names}); "
                    "give each group of one optimizer its own name (A single `Optimizer` cannot have multiple "
                    "parameter groups with identical `name` values)"
                )
            betas = "betas" in optimizer.defaults
            for i, group in enumerate(groups):
                if len(groups) > 1:
                    key = f"{name}/{group_names[i]}"
                else:
                    key = f"{name}/{group['name']}" if group.get("name") else name
                out[key] = _number(group["lr"])
                if self.log_momentum:
                    out[f"{key}-momentum"] = _number(group["betas"][0] if betas else group.get("momentum", 0))
                if self.log_weight_decay:
                    out[f"{key}-weight_decay"] = _number(group.get("weight_decay", 0))
        return out

    @override
    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        # Checked once, before any value is logged: a bad configuration fails before the first step.
        self.learning_rates(trainer)
        if self.log_momentum:
            optimizers = [o for o, _ in self._names(trainer)]
            if any("momentum" not in o.defaults and "betas" not in o.defaults for o in optimizers):
                warnings.warn(
                    "LearningRateMonitor(log_momentum=True): some optimizers do not have momentum. This will log "
                    "a value 0 for the momentum.",
                    RuntimeWarning,
                    stacklevel=2,
                )

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._interval(trainer) == "epoch":
            self._log(trainer, _batches_that_stepped(trainer, pl_module))

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int) -> None:
        # Lightning's rule: at the start of each batch where the trainer logs, the rates this batch's
        # steps will use, at x = the batches that stepped so far (the trainer's logging step).
        if self._interval(trainer) != "step":
            return
        stepped = _batches_that_stepped(trainer, pl_module)
        if logs_at(trainer, stepped + 1):
            self._log(trainer, stepped)
