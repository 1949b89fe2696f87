"""Lightning's ``BatchSizeFinder``: the largest batch size that trains a few steps without running out of memory.

Each candidate size is set where the module reads it (``batch_arg_name`` on the module, its
``hparams`` or the datamodule), the training loader is built again, and ``steps_per_trial`` optimizer
steps run through :meth:`Trainer.run_trial`, which restores the weights, optimizers and counters
after every trial. ``"power"`` doubles until a trial raises ``torch.OutOfMemoryError`` and keeps
the last size that worked; ``"binsearch"`` then bisects between the last success and the failure.
"""

from __future__ import annotations

import gc
import logging
from typing import TYPE_CHECKING, Any

import torch

from callbacks._attrs import get_attr, has_attr, set_attr
from callbacks.base import Callback
from trainer.common.errors import MisconfigurationException

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

__all__ = ["BatchSizeFinder", "is_oom_error"]

log = logging.getLogger(__name__)


def is_oom_error(exc: BaseException) -> bool:
    """``torch.OutOfMemoryError`` (CUDA, MPS, XPU), or a RuntimeError saying the memory ran out."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "CUBLAS_STATUS_ALLOC_FAILED" in text)


class _NoOp(Callback):
    """The trial's callback: nothing to record; a trial either runs its steps or raises."""


class BatchSizeFinder(Callback):
    """Find the largest batch size that fits, when ``fit`` starts (Lightning's signature and search).

    The result is in ``optimal_batch_size`` and set on ``batch_arg_name``, so the fit (and a later
    one) trains with it.

    Args:
        mode: ``"power"`` (double until a failure) or ``"binsearch"`` (then bisect).
        steps_per_trial: optimizer steps each candidate must run.
        init_val: the first size tried.
        max_trials: the most candidates tried.
        batch_arg_name: where the module or datamodule reads its batch size.
        margin: ``"binsearch"`` only: the found size is reduced by this share, as a safety margin.
        max_val: the largest size tried.
    """

    SUPPORTED_MODES = ("power", "binsearch")

    def __init__(
        self,
        mode: str = "power",
        steps_per_trial: int = 3,
        init_val: int = 2,
        max_trials: int = 25,
        batch_arg_name: str = "batch_size",
        margin: float = 0.05,
        max_val: int = 8192,
    ) -> None:
        mode = mode.lower()
        if mode not in self.SUPPORTED_MODES:
            raise ValueError(f"`mode` should be either of {self.SUPPORTED_MODES}: BatchSizeFinder(mode={mode!r})")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"BatchSizeFinder(margin={margin}): the margin is a share in [0, 1)")
        for name, value in (
            ("steps_per_trial", steps_per_trial),
            ("init_val", init_val),
            ("max_trials", max_trials),
            ("max_val", max_val),
        ):
            least = 0 if name == "max_trials" else 1  # no trial: init_val is the answer, as in Lightning
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"BatchSizeFinder({name}={value!r}): need an int >= {least}")
        self._mode, self._steps_per_trial, self._init_val = mode, steps_per_trial, init_val
        self._max_trials, self._batch_arg_name, self._margin, self._max_val = (
            max_trials,
            batch_arg_name,
            margin,
            max_val,
        )
        self._early_exit = False
        self.optimal_batch_size: int | None = init_val

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Lightning's moment for the search: set up, before the first training step."""
        self.scale_batch_size(trainer, pl_module)

    def scale_batch_size(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Run the search now (inside ``fit``); the found size is set and the training loader rebuilt with it."""
        name = self._batch_arg_name
        if trainer.run_state.given_loaders.get("fit") is not None:  # its batch size is not ours to change
            raise MisconfigurationException(
                "Batch size finder cannot be used with dataloaders passed directly to `.fit()`. Please disable the "
                "feature or incorporate the dataloader into your LightningModule or LightningDataModule "
                f"(its train_dataloader() reads {name!r})."
            )
        if not has_attr(pl_module, name):
            raise AttributeError(
                f"scale_batch_size(batch_arg_name={name!r}): neither {type(pl_module).__name__} nor its hparams "
                f"nor the datamodule has {name!r}; store the batch size there and read it in train_dataloader()"
            )
        size = self._run(trainer, pl_module, self._init_val)
        if get_attr(pl_module, name) != size:
            set_attr(pl_module, name, size)
            trainer.run_trial(_NoOp(), 0, reload_dataloaders=True)  # no steps: the loader is rebuilt at this size
        self.optimal_batch_size = size
        if not self._early_exit:  # hosted by the Tuner, whose caller reports the size (the command prints it)
            log.info("scale_batch_size: batch size %d", size)

    def _run(self, trainer: Trainer, module: TrainModule, size: int) -> int:
        name = self._batch_arg_name
        if not self._max_trials:
            return size
        low, high = 0, None  # the largest size known to fit, the smallest known not to
        for _ in range(self._max_trials):
            size = min(size, self._max_val)
            set_attr(module, name, size)
            if self._fits(trainer):
                low = size
                if size >= self._max_val or size >= _dataset_length(trainer):
                    break
                if high is None:
                    size *= 2
                elif high - low <= 1:
                    break
                else:
                    size = (low + high) // 2
                continue
            high = size
            if size == 1:
                raise RuntimeError(f"scale_batch_size: even {name}=1 runs out of memory")
            if not low:
                size //= 2  # nothing fitted yet: halve until something does
            elif self._mode == "power" or high - low <= 1:
                break
            else:
                size = (low + high) // 2
        if not low:
            raise RuntimeError(
                f"scale_batch_size: no batch size fitted in max_trials={self._max_trials} trials (last tried {size}); "
                "raise max_trials or lower init_val"
            )
        if self._mode == "binsearch" and self._margin > 0:
            low = max(1, int(low * (1 - self._margin)))
        return low

    def _fits(self, trainer: Trainer) -> bool:
        try:
            trainer.run_trial(_NoOp(), self._steps_per_trial, reload_dataloaders=True)
        except BaseException as exc:
            if not is_oom_error(exc):
                raise
            ok = False
        else:
            ok = True
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        # Every rank must go on with the same size: one rank out of memory fails the trial for all.
        return bool(trainer.strategy.reduce(torch.tensor(0.0 if ok else 1.0), "max").item() == 0.0)

    def state_dict(self) -> dict[str, Any]:
        """The size found (it is handed back from the processes a strategy started)."""
        return {"optimal_batch_size": self.optimal_batch_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take back what :meth:`state_dict` gave."""
        self.optimal_batch_size = state_dict.get("optimal_batch_size", self.optimal_batch_size)


def _dataset_length(trainer: Trainer) -> float:
    loader = trainer.train_dataloader if hasattr(trainer, "train_dataloader") else None
    try:
        return len(loader.dataset)  # type: ignore[union-attr]
    except (AttributeError, TypeError):
        return float("inf")
