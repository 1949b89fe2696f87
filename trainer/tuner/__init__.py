"""Lightning's ``Tuner``: ``lr_find`` and ``scale_batch_size`` before training (or evaluating).

>>> from trainer import Tuner

Each hosts its finder callback (:class:`callbacks.LearningRateFinder`,
:class:`callbacks.BatchSizeFinder`) in a run of its own: ``fit``, or for ``scale_batch_size(method=)``
``validate``/``test``/``predict``. The finder runs its trials from the stage's start hook
through :meth:`Trainer.run_trial`, which restores the module and optimizer after each; the batch-size
finder then ends the hosting run (Lightning's early exit). The trainer's callbacks, loggers, limits
and counters are put back afterwards, so a ``fit`` after tuning gives what a fresh trainer gives.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from callbacks._attrs import set_attr
from callbacks.batch_size_finder import BatchSizeFinder
from callbacks.lr_finder import LearningRateFinder, LRFinderResult, log_lr_curve, lr_attr_name
from trainer.common.errors import UserError
from trainer.hooks import HookDispatch
from trainer.tuner.trial import restore_run, save_run

if TYPE_CHECKING:
    from callbacks.base import Callback
    from trainer.module import DataModule, TrainModule
    from trainer.trainer import Trainer

__all__ = ["LRFinderResult", "Tuner"]


class Tuner:
    """Tune a trainer's module before fitting: a learning rate, a batch size (Lightning's ``Tuner``).

    Args:
        trainer: the trainer to tune with (its strategy, precision, accumulation and data).
    """

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer

    def lr_find(
        self,
        model: TrainModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        dataloaders: Any = None,
        datamodule: DataModule | None = None,
        method: str = "fit",
        min_lr: float = 1e-8,
        max_lr: float = 1,
        num_training: int = 100,
        mode: str = "exponential",
        early_stop_threshold: float | None = 4.0,
        update_attr: bool = True,
        attr_name: str = "",
    ) -> LRFinderResult | None:
        """The learning-rate range test; returns the result (``.results``, ``.suggestion()``, ``.plot()``).

        Weights and optimizer are as before afterwards. With ``update_attr=True`` the suggestion is
        set on ``attr_name`` (or ``lr`` / ``learning_rate``: module attribute, ``hparams`` key or
        datamodule attribute). With a TensorBoard logger the curve is written there (a figure).
        """
        if method != "fit":
            raise UserError("method='fit' is the only valid configuration to run lr finder.")
        _check_method(method, dataloaders, train_dataloaders, val_dataloaders)
        self._check_not_configured(LearningRateFinder)
        finder = LearningRateFinder(min_lr, max_lr, num_training, mode, early_stop_threshold, update_attr, attr_name)
        loggers = self._host(finder, model, "fit", (train_dataloaders, val_dataloaders), datamodule)
        result = finder.optimal_lr
        if result is None:
            return None
        lr = result.suggestion() if update_attr else None
        if lr is not None:  # again here: the sweep may have run in processes the strategy started
            set_attr(model, lr_attr_name(model, attr_name, datamodule), lr, datamodule)
        for logger in loggers:  # they sat out the hosting fit: their folder (save_dir=None) is resolved here
            logger.setup(self._trainer, model, "fit")
        log_lr_curve(loggers, result, self._trainer.global_step)
        return result

    def scale_batch_size(
        self,
        model: TrainModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        dataloaders: Any = None,
        datamodule: DataModule | None = None,
        method: str = "fit",
        mode: str = "power",
        steps_per_trial: int = 3,
        init_val: int = 2,
        max_trials: int = 25,
        batch_arg_name: str = "batch_size",
        margin: float = 0.05,
        max_val: int = 8192,
    ) -> int | None:
        """The largest batch size that runs ``steps_per_trial`` steps of ``method`` without running out of memory.

        ``method="fit"`` trains (optimizer steps), ``"validate"``/``"test"``/``"predict"`` run that
        stage's batches. The size is set on ``batch_arg_name`` (module attribute, ``hparams`` key or
        datamodule attribute) and returned; weights and optimizer are as before. None under ``fast_dev_run``.
        """
        _check_method(method, dataloaders, train_dataloaders, val_dataloaders)
        self._check_not_configured(BatchSizeFinder)
        finder = BatchSizeFinder(mode, steps_per_trial, init_val, max_trials, batch_arg_name, margin, max_val)
        given = (train_dataloaders, val_dataloaders) if method == "fit" else (dataloaders,)
        self._host(finder, model, method, given, datamodule)
        size = finder.optimal_batch_size
        if size is not None:
            set_attr(model, batch_arg_name, size, datamodule)
        return size

    def _check_not_configured(self, kind: type[Callback]) -> None:
        """Lightning's refusal: the trainer's own finder callback would run a second search."""
        if any(isinstance(cb, kind) for cb in self._trainer.callbacks):
            raise ValueError(
                f"Trainer is already configured with a `{kind.__name__}` callback.Please remove it if you want to "
                "use the Tuner."
            )

    def _host(
        self,
        finder: Callback,
        model: TrainModule,
        method: str,
        dataloaders: tuple[Any, ...],
        datamodule: DataModule | None,
    ) -> list[Callback]:
        """``method`` with ``finder`` as the only callback, which ends it once it has searched; then the trainer
        put back. ``dataloaders``: ``fit``'s training and validation loaders, or the stage's.

        Returns the trainer's loggers (they were left out of the hosting run).
        """
        t = self._trainer
        finder._early_exit = True  # type: ignore[attr-defined]
        callbacks, saved = list(t.callbacks), save_run(t)
        loggers = t.loggers
        t.callbacks[:] = [finder]
        state = t.run_state
        state.hooks = HookDispatch(t.callbacks, t)
        # The finder's trials are the only steps, and there is no sanity check.
        state.loop = dataclasses.replace(state.loop, max_steps=t.global_step, num_sanity_val_steps=0)
        try:
            if method == "fit":
                t.fit(model, dataloaders[0], dataloaders[1], datamodule)
            else:
                getattr(t, method)(model, *dataloaders, datamodule=datamodule)
        finally:
            t.callbacks[:] = callbacks
            restore_run(t, saved)
        return loggers


def _check_method(method: str, dataloaders: Any, train_dataloaders: Any = None, val_dataloaders: Any = None) -> None:
    """Lightning's checks of ``method`` and the loaders passed with it."""
    methods = ("fit", "validate", "test", "predict")
    if method not in methods:
        raise ValueError(f"method {method!r} is invalid. Should be one of {methods}.")
    if method == "fit" and dataloaders is not None:
        raise UserError(
            f"In tuner with method={method!r}, `dataloaders` argument should be None, please consider setting "
            "`train_dataloaders` and `val_dataloaders` instead."
        )
    if method != "fit" and (train_dataloaders is not None or val_dataloaders is not None):
        raise UserError(
            f"In tuner with `method`={method!r}, `train_dataloaders` and `val_dataloaders` arguments should be None, "
            "please consider setting `dataloaders` instead."
        )
