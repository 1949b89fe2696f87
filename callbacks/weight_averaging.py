"""Weight averaging callbacks: ``WeightAveraging`` and ``EMAWeightAveraging`` (Lightning 2.6's names).

An average of the weights is kept in a :class:`torch.optim.swa_utils.AveragedModel` and updated after
every optimizer step (``on_train_batch_end`` once ``global_step`` has moved, so never in the middle of
an accumulation window) and, where :meth:`WeightAveraging.should_update` asks for it, at an epoch's
end. Validation runs on the averaged weights (swapped in for it, swapped back for training); at the
end of ``fit`` the module holds them.

Checkpoints keep both, in Lightning's layout: ``state_dict`` holds the average (what
``load_from_checkpoint`` and evaluation want), ``current_model_state`` the weights training continues
from, ``averaging_state`` the averaging counters. Resuming puts each back where it was.

Under FSDP the module's parameters are sharded ``DTensor`` s; the average is a full, unsharded copy
on every rank (gathered with ``full_tensor()`` at each update), so it equals a one-process run.
Costs nothing for runs that do not add the callback.
"""

from __future__ import annotations

import copy
import itertools
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.swa_utils import AveragedModel

from callbacks.base import Callback, user_defines

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["EMAWeightAveraging", "WeightAveraging"]

_PREFIX = "module."  # AveragedModel's state_dict names the averaged module's tensors "module.<name>"


def _is_sharded(tensor: torch.Tensor) -> bool:
    return hasattr(tensor, "full_tensor") and hasattr(tensor, "device_mesh")


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a sharded ``DTensor`` gathered (a collective), anything else as it is."""
    return tensor.full_tensor() if _is_sharded(tensor) else tensor  # type: ignore[attr-defined]


@torch.no_grad()
def _write(target: torch.Tensor, value: torch.Tensor) -> None:
    """Copy the full ``value`` into ``target``; into a sharded ``DTensor``, only this rank's shard of it."""
    if _is_sharded(target):
        from torch.distributed.tensor import distribute_tensor

        shard = distribute_tensor(value.to(target.device), target.device_mesh, target.placements)  # type: ignore[attr-defined]
        target.to_local().copy_(shard.to_local())  # type: ignore[attr-defined]
    else:
        target.detach().copy_(value)


class _EMA:
    """``torch.optim.swa_utils.get_ema_avg_fn(decay)`` as a class: the same arithmetic, but picklable, so
    the callback travels to the processes a strategy starts (``ddp`` spawns them)."""

    def __init__(self, decay: float) -> None:
        self.decay = decay

    @torch.no_grad()
    def __call__(self, ema_param: torch.Tensor, current_param: torch.Tensor, num_averaged: Any) -> torch.Tensor:
        return self.decay * ema_param + (1 - self.decay) * current_param


class _FullView:
    """What ``AveragedModel.update_parameters`` reads of a model (``parameters()``, ``buffers()``),
    with sharded tensors gathered whole: used under FSDP only."""

    def __init__(self, module: torch.nn.Module) -> None:
        self._module = module

    def parameters(self) -> Iterator[torch.Tensor]:
        return (_full(p.detach()) for p in self._module.parameters())

    def buffers(self) -> Iterator[torch.Tensor]:
        return (_full(b) for b in self._module.buffers())


class WeightAveraging(Callback):
    """Keep an average of the module's weights, used for validation and held by the module after ``fit``.

    Arguments other than ``device`` and ``use_buffers`` go to :class:`~torch.optim.swa_utils.AveragedModel`
    (``avg_fn``, ``multi_avg_fn``); without one the average is SWA's equal-weight mean. Override
    :meth:`should_update` to choose when it is updated.

    Args:
        device: where the average lives (default: the module's device). ``"cpu"`` saves accelerator memory.
        use_buffers: average the buffers too (batch-norm statistics); ``False`` leaves them to the user
            (``torch.optim.swa_utils.update_bn``).
        **kwargs: passed to ``AveragedModel``.

    Example:
        >>> from torch.optim.swa_utils import get_ema_avg_fn
        >>> cb = WeightAveraging(avg_fn=get_ema_avg_fn(0.99))
        >>> cb.should_update(step_idx=0), cb.should_update(epoch_idx=0)
        (True, False)
    """

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        use_buffers: bool = True,
        **kwargs: Any,
    ) -> None:
        self._device: torch.device | int | None = torch.device(device) if isinstance(device, str) else device
        self._use_buffers = use_buffers
        self._kwargs = kwargs
        self._average_model: AveragedModel | None = None
        self._latest_update_step = 0
        self._latest_update_epoch = -1
        self._sharded = False

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """Whether to update the average after optimizer step ``step_idx`` or at the end of epoch ``epoch_idx``.

        Called with one of them set (zero-based); the default updates after every optimizer step.
        """
        return step_idx is not None

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        """At ``fit``: make the average, a copy of the module's weights (before a strategy shards them)."""
        if stage != "fit":
            return
        if user_defines(pl_module, "configure_model"):
            # As Lightning: the layers configure_model makes must exist before they are copied (the
            # trainer calls it again afterwards; it should build its layers only once).
            warnings.warn(
                f"{type(self).__name__} with a module that overrides configure_model: it is called now, to "
                "copy every layer; the average is not sharded, so it needs the whole model's memory",
                stacklevel=2,
            )
            pl_module.configure_model()
        # The module refers to its trainer; the average is a copy of the weights, not of the run.
        plain = copy.deepcopy(pl_module, memo={id(trainer): None})
        device = self._device if self._device is not None else pl_module.device
        self._average_model = AveragedModel(plain, device=device, use_buffers=self._use_buffers, **self._kwargs)

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Follow the module to the device the strategy put it on (unless ``device`` was given)."""
        assert self._average_model is not None
        self._sharded = any(_is_sharded(p) for p in pl_module.parameters())
        have, need = len(list(self._averaged_tensors())), len(list(self._tensors(pl_module)))
        if have != need:
            raise RuntimeError(
                f"{type(self).__name__}: the module has {need} parameters and buffers, its average {have}: a layer "
                "was added after setup; create layers in __init__ or configure_model"
            )
        if self._device is None:
            self._average_model.to(trainer.strategy.root_device)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After an optimizer step (``global_step`` moved), update the average if :meth:`should_update` says so."""
        step = trainer.global_step
        if step > self._latest_update_step and self.should_update(step_idx=step - 1):
            self._update(pl_module)
            self._latest_update_step = step

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """At an epoch's end, update the average if :meth:`should_update` asks for this epoch."""
        epoch = trainer.current_epoch
        if epoch > self._latest_update_epoch and self.should_update(epoch_idx=epoch):
            self._update(pl_module)
            self._latest_update_epoch = epoch

    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Training is over: the module takes the averaged weights."""
        assert self._average_model is not None
        for average, current in zip(self._averaged_tensors(), self._tensors(pl_module)):
            _write(current, average)

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Validate the averaged weights: swap them in."""
        if self._average_model is not None:
            self._swap(pl_module)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Swap the training weights back."""
        if self._average_model is not None:
            self._swap(pl_module)

    def state_dict(self) -> dict[str, Any]:
        """The last step the average was updated at (the tensors travel in ``on_save_checkpoint``)."""
        return {"latest_update_step": self._latest_update_step, "latest_update_epoch": self._latest_update_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self._latest_update_step = state_dict["latest_update_step"]
        self._latest_update_epoch = state_dict.get("latest_update_epoch", -1)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """Lightning's layout: the average as ``state_dict``, the training weights as ``current_model_state``."""
        if self._average_model is None:
            return  # outside fit: the module's weights (the average, once fit has ended) are the state_dict
        state = self._average_model.state_dict()
        checkpoint["current_model_state"] = checkpoint["state_dict"]
        checkpoint["state_dict"] = {k[len(_PREFIX) :]: v for k, v in state.items() if k.startswith(_PREFIX)}
        checkpoint["averaging_state"] = {k: v for k, v in state.items() if not k.startswith(_PREFIX)}

    def on_load_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """Load the average, and have the trainer load ``current_model_state`` into the module.

        Called before the trainer loads ``checkpoint["state_dict"]``: that entry is pointed at the
        training weights, so the module resumes from them and the average from the average.
        """
        if self._average_model is None:
            return  # validate/test/predict from a checkpoint: its state_dict (the average) is what they use
        if "current_model_state" in checkpoint and "averaging_state" in checkpoint:
            state = {_PREFIX + k: v for k, v in checkpoint["state_dict"].items()}
            state.update(checkpoint["averaging_state"])
            self._average_model.load_state_dict(state)
            checkpoint["state_dict"] = checkpoint["current_model_state"]
        else:
            warnings.warn(
                f"{type(self).__name__}: the checkpoint was not written with weight averaging; the average "
                "starts from its weights",
                stacklevel=2,
            )
            self._average_model.module.load_state_dict(copy.deepcopy(checkpoint["state_dict"]), strict=False)

    # ----------------------------------------------------------------- the tensors
    def _update(self, pl_module: TrainModule) -> None:
        assert self._average_model is not None
        self._average_model.update_parameters(_FullView(pl_module) if self._sharded else pl_module)  # type: ignore[arg-type]

    def _averaged_tensors(self) -> Iterator[torch.Tensor]:
        assert self._average_model is not None
        module = self._average_model.module
        return itertools.chain(module.parameters(), module.buffers())

    @staticmethod
    def _tensors(pl_module: TrainModule) -> Iterator[torch.Tensor]:
        return itertools.chain(pl_module.parameters(), pl_module.buffers())

    def _swap(self, pl_module: TrainModule) -> None:
        """Exchange the module's weights with the average (sharded ones through their full values)."""
        for average, current in zip(self._averaged_tensors(), self._tensors(pl_module)):
            held = _full(current.detach()).to(average.device, copy=True)
            _write(current, average.detach())
            average.detach().copy_(held)


class EMAWeightAveraging(WeightAveraging):
    """An exponential moving average of the weights: ``avg = decay * avg + (1 - decay) * weights``.

    The first update copies the weights. Updated after every ``update_every_n_steps``-th optimizer step
    from step ``update_starting_at_step`` on, and at the end of every epoch from
    ``update_starting_at_epoch`` on (``None``: not by epoch).

    Args:
        device: where the average lives (default: the module's device).
        use_buffers: average the buffers too.
        decay: the weight of the old average, in ``[0, 1]``.
        update_every_n_steps: update after steps whose index is a multiple of this (0: never by step).
        update_starting_at_step: first step index to update at (``None``: from the start).
        update_starting_at_epoch: first epoch index to update at the end of (``None``: not by epoch).
        **kwargs: passed to ``AveragedModel``.

    Example:
        >>> ema = EMAWeightAveraging(decay=0.9, update_every_n_steps=2, update_starting_at_step=4)
        >>> [ema.should_update(step_idx=i) for i in range(3, 7)]
        [False, True, False, True]
    """

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        use_buffers: bool = True,
        decay: float = 0.999,
        update_every_n_steps: int = 1,
        update_starting_at_step: int | None = None,
        update_starting_at_epoch: int | None = None,
        **kwargs: Any,
    ) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"EMAWeightAveraging(decay={decay!r}): decay must be in [0, 1], e.g. 0.999")
        if not isinstance(update_every_n_steps, int) or update_every_n_steps < 0:
            raise ValueError(
                f"EMAWeightAveraging(update_every_n_steps={update_every_n_steps!r}): must be an int >= 0 "
                "(0: never by step)"
            )
        super().__init__(device=device, use_buffers=use_buffers, **kwargs, avg_fn=_EMA(decay))
        self.decay = decay
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """By step: from ``update_starting_at_step``, every ``update_every_n_steps``; by epoch: from
        ``update_starting_at_epoch``."""
        if step_idx is not None:
            started = self.update_starting_at_step is None or step_idx >= self.update_starting_at_step
            if started and self.update_every_n_steps > 0 and step_idx % self.update_every_n_steps == 0:
                return True
        if epoch_idx is not None:
            return self.update_starting_at_epoch is not None and epoch_idx >= self.update_starting_at_epoch
        return False
