"""Lightning's ``BatchSizeFinder``: the largest batch size that runs a few steps without running out of memory.

Each candidate size is set where the module reads it (``batch_arg_name`` on the module, its
``hparams`` or the datamodule), the loaders are built again, and ``steps_per_trial`` steps run
through :meth:`Trainer.run_trial`, which restores the weights, optimizers and counters after every
trial: optimizer steps in ``fit``, batches of the stage's loop in ``validate``, ``test`` and
``predict``. The search is Lightning's, trial for trial and message for message: ``"power"``
doubles until a trial raises ``torch.OutOfMemoryError`` (or a ``RuntimeError`` saying the memory
ran out) and keeps the last size that worked; ``"binsearch"`` then bisects between the last success
and the failure and takes ``margin`` off the result. Neither grows past ``max_val`` nor past the
length of the dataset.
"""

from __future__ import annotations

import gc
import logging
from typing import TYPE_CHECKING, Any

import torch

from callbacks._attrs import get_attr, has_attr, set_attr
from callbacks.base import Callback
from trainer.common.errors import MisconfigurationException, TunerExit
from trainer.common.rank_zero import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

__all__ = ["BatchSizeFinder", "is_oom_error"]

log = logging.getLogger(__name__)

#: The loader methods' prefix per entry point, as Lightning's messages name them.
_PREFIX = {"fit": "train", "validate": "val", "test": "test", "predict": "predict"}


def is_oom_error(exc: BaseException) -> bool:
    """``torch.OutOfMemoryError`` (CUDA, MPS, XPU), or a RuntimeError saying the memory ran out."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "CUBLAS_STATUS_ALLOC_FAILED" in text)


class _NoOp(Callback):
    """The trial's callback: nothing to record; a trial either runs its steps or raises."""


class BatchSizeFinder(Callback):
    """Find the largest batch size that fits, when the entry point starts (Lightning's signature and search).

    ``fit`` searches at ``on_fit_start``, ``validate`` at ``on_validation_start``, ``test`` at
    ``on_test_start``, ``predict`` at ``on_predict_start``. The result is in ``optimal_batch_size``
    and set on ``batch_arg_name``, and the stage goes on with loaders of that size.

    Args:
        mode: ``"power"`` (double until a failure) or ``"binsearch"`` (then bisect).
        steps_per_trial: steps (``fit``: optimizer steps; else batches) each candidate must run.
        init_val: the first size tried.
        max_trials: the most successful trials (``"power"``: the most trials).
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
            raise ValueError(f"`margin` should be between 0 and 1. Found margin={margin}")
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

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str | None = None) -> None:
        """Lightning's signature (``stage`` optional). Lightning's checks are made when the search starts
        (:meth:`scale_batch_size`), once the stage's loaders are known; under a distributed strategy the
        ranks search together (Lightning refuses it)."""

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Lightning's moment for the search in ``fit``: set up, before the first training step."""
        self.scale_batch_size(trainer, pl_module)

    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """In ``validate`` (not the validations of ``fit``, nor the sanity check): search before the first batch."""
        if trainer.sanity_checking or trainer.stage != "validate":
            return
        self.scale_batch_size(trainer, pl_module)

    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """In ``test``: search before the first batch."""
        self.scale_batch_size(trainer, pl_module)

    def on_predict_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """In ``predict``: search before the first batch."""
        self.scale_batch_size(trainer, pl_module)

    def scale_batch_size(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Run the search now; the found size is set and the stage's loaders rebuilt with it.

        Hosted by the ``Tuner``, the entry point then ends (Lightning's early exit).
        """
        self.optimal_batch_size = self._search(trainer, pl_module)
        if self._early_exit:
            raise TunerExit

    def _search(self, trainer: Trainer, module: TrainModule) -> int | None:
        """Lightning's checks in its order, then the search; None under ``fast_dev_run`` (nothing runs)."""
        if trainer.fast_dev_run:
            rank_zero_warn("Skipping batch size scaler since `fast_dev_run` is enabled.", category=UserWarning)
            return None
        stage = trainer.stage or "fit"
        name = self._batch_arg_name
        if trainer.run_state.given_loaders.get(stage) is not None:  # their batch size is not ours to change
            method = "fit" if stage == "fit" else stage
            raise MisconfigurationException(
                f"The Batch size finder cannot be used with dataloaders passed directly to `.{method}()`. Please "
                "disable the feature or incorporate the dataloader into your LightningModule or LightningDataModule "
                f"(its {_PREFIX[stage]}_dataloader() reads {name!r})."
            )
        if stage != "fit" and len(trainer.loaders.get(stage) or []) > 1:
            raise MisconfigurationException(
                f"The Batch size finder cannot be used with multiple {_PREFIX[stage]} dataloaders. (Tune with one, "
                "or set the batch size of each yourself.)"
            )
        self._check_attr(module)
        if stage == "fit" and trainer.loaders.get("fit") is None:
            trainer.run_trial(_NoOp(), 0, reload_dataloaders=True)  # the loader, for the dataset's length
        size, _ = self._adjust(trainer, module, value=self._init_val)
        try:
            size = (
                self._power(trainer, module, size) if self._mode == "power" else self._binsearch(trainer, module, size)
            )
        finally:
            trainer.run_trial(_NoOp(), 0, reload_dataloaders=True)  # no steps: the loaders, at the size now set
        log.info(f"Finished batch size finder, will continue with full run using batch size {size}")
        return size

    def _check_attr(self, module: TrainModule) -> None:
        """``batch_arg_name`` must be where the loaders read it; on the module and in its ``hparams``: a warning."""
        name = self._batch_arg_name
        if not has_attr(module, name):
            raise MisconfigurationException(
                f"Field {name} not found in `model`, `datamodule`, nor their `hparams` attributes. (The batch size "
                f"finder sets {name!r} there; store the batch size there and read it in the *_dataloader() methods.)"
            )
        hparams = getattr(module, "hparams", None)
        if hasattr(module, name) and hparams is not None and name in hparams:
            rank_zero_warn(
                f"Field `model.{name}` and `model.hparams.{name}` are mutually exclusive! `model.{name}` will be "
                "used as the initial batch size for scaling. If this is not the intended behavior, please remove "
                "either one.",
                category=UserWarning,
            )

    def _power(self, trainer: Trainer, module: TrainModule, size: int) -> int:
        """Double after every success; after a failure halve, and stop once something has fitted."""
        any_success = False
        for trial in range(self._max_trials):
            if size >= self._max_val:
                rank_zero_info(f"Reached the maximum batch size limit of {self._max_val}. Stopping search.")
                break
            if self._fits(trainer):
                if trial + 1 >= self._max_trials:
                    break
                size, changed = self._adjust(trainer, module, factor=2.0, desc="succeeded")
                if not changed:
                    break
                any_success = True
            else:
                size, _ = self._adjust(trainer, module, factor=0.5, desc="failed")
                if any_success:
                    break
        return size

    def _binsearch(self, trainer: Trainer, module: TrainModule, size: int) -> int:
        """Double until a failure, then bisect between the last success and the smallest failure."""
        low, high, count = 1, None, 0
        while True:
            if size >= self._max_val:
                rank_zero_info(f"Reached the maximum batch size limit of {self._max_val}. Stopping search.")
                break
            if self._fits(trainer):
                count += 1
                if count >= self._max_trials:
                    break
                low = size
                if high:
                    if high - low <= 1:
                        break
                    size, changed = self._adjust(trainer, module, value=(high + low) // 2, desc="succeeded")
                else:
                    size, changed = self._adjust(trainer, module, factor=2.0, desc="succeeded")
                if not changed:
                    break
            else:
                high = size
                size, _ = self._adjust(trainer, module, value=(high + low) // 2, desc="failed")
                if high - low <= 1:
                    break
        if self._margin > 0:
            reduced = max(1, int(size * (1 - self._margin)))
            if reduced != size:
                rank_zero_info(f"Applying margin of {self._margin:.1%}, reducing batch size from {size} to {reduced}")
                size = reduced
                set_attr(module, self._batch_arg_name, size)
        return size

    def _adjust(
        self, trainer: Trainer, module: TrainModule, factor: float = 1.0, value: int | None = None, desc: str = ""
    ) -> tuple[int, bool]:
        """Lightning's step of the search: the next size (``value``, else the current times ``factor``, at most
        ``max_val``) set on ``batch_arg_name``; unchanged when the current size already covers the dataset."""
        batch_size = get_attr(module, self._batch_arg_name)
        length = _dataset_length(trainer)
        if length is not None and batch_size >= length:
            rank_zero_info(
                f"The batch size {batch_size} is greater or equal than the length of your dataset: {length}."
            )
            return batch_size, False
        new_size = value if value is not None else int(batch_size * factor)
        if new_size > self._max_val:
            if desc:
                rank_zero_info(
                    f"Batch size {new_size} exceeds max_val limit {self._max_val}, capping at {self._max_val}"
                )
            new_size = self._max_val
        if desc:
            rank_zero_info(f"Batch size {batch_size} {desc}, trying batch size {new_size}")
        set_attr(module, self._batch_arg_name, new_size)
        return new_size, new_size != batch_size

    def _fits(self, trainer: Trainer) -> bool:
        """One trial at the size now set; False when it ran out of memory (on any rank)."""
        try:
            trainer.run_trial(_NoOp(), self._steps_per_trial, reload_dataloaders=True)
        except RuntimeError as exc:
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


def _dataset_length(trainer: Trainer) -> int | None:
    """The length of the running stage's data as Lightning's ``CombinedLoader`` counts it (the longest
    dataset of combined training loaders, the shortest with ``"min_size"``); None for iterable datasets."""
    stage = trainer.stage or "fit"
    prepared = trainer.loaders.get(stage)
    mode = getattr(prepared, "mode", "max_size_cycle")
    loaders = getattr(prepared, "loaders", None)
    if loaders is None:
        loaders = prepared if isinstance(prepared, list) else [prepared]
    lengths = []
    for loader in loaders:
        try:
            lengths.append(len(loader.dataset))
        except (AttributeError, TypeError, NotImplementedError):
            continue
    if not lengths:
        return None
    return min(lengths) if mode == "min_size" else max(lengths)
