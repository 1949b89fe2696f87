"""``LambdaCallback``: a callback made of functions, one per hook, as Lightning's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from callbacks.base import Callback

__all__ = ["LambdaCallback"]


class LambdaCallback(Callback):
    """Call the given functions at their hooks; each receives what the hook receives.

    Every hook Lightning's ``LambdaCallback`` takes is a keyword here; a hook left ``None`` costs
    nothing (the trainer calls only hooks that were given).

    Example:
        >>> seen = []
        >>> cb = LambdaCallback(on_train_epoch_end=lambda trainer, pl_module: seen.append(trainer.current_epoch))
        >>> "on_train_epoch_end" in vars(cb)
        True
    """

    def __init__(
        self,
        setup: Callable[..., Any] | None = None,
        teardown: Callable[..., Any] | None = None,
        on_fit_start: Callable[..., Any] | None = None,
        on_fit_end: Callable[..., Any] | None = None,
        on_sanity_check_start: Callable[..., Any] | None = None,
        on_sanity_check_end: Callable[..., Any] | None = None,
        on_train_batch_start: Callable[..., Any] | None = None,
        on_train_batch_end: Callable[..., Any] | None = None,
        on_train_epoch_start: Callable[..., Any] | None = None,
        on_train_epoch_end: Callable[..., Any] | None = None,
        on_validation_epoch_start: Callable[..., Any] | None = None,
        on_validation_epoch_end: Callable[..., Any] | None = None,
        on_test_epoch_start: Callable[..., Any] | None = None,
        on_test_epoch_end: Callable[..., Any] | None = None,
        on_validation_batch_start: Callable[..., Any] | None = None,
        on_validation_batch_end: Callable[..., Any] | None = None,
        on_test_batch_start: Callable[..., Any] | None = None,
        on_test_batch_end: Callable[..., Any] | None = None,
        on_train_start: Callable[..., Any] | None = None,
        on_train_end: Callable[..., Any] | None = None,
        on_validation_start: Callable[..., Any] | None = None,
        on_validation_end: Callable[..., Any] | None = None,
        on_test_start: Callable[..., Any] | None = None,
        on_test_end: Callable[..., Any] | None = None,
        on_exception: Callable[..., Any] | None = None,
        on_save_checkpoint: Callable[..., Any] | None = None,
        on_load_checkpoint: Callable[..., Any] | None = None,
        on_before_backward: Callable[..., Any] | None = None,
        on_after_backward: Callable[..., Any] | None = None,
        on_before_optimizer_step: Callable[..., Any] | None = None,
        on_before_zero_grad: Callable[..., Any] | None = None,
        on_predict_start: Callable[..., Any] | None = None,
        on_predict_end: Callable[..., Any] | None = None,
        on_predict_batch_start: Callable[..., Any] | None = None,
        on_predict_batch_end: Callable[..., Any] | None = None,
        on_predict_epoch_start: Callable[..., Any] | None = None,
        on_predict_epoch_end: Callable[..., Any] | None = None,
    ) -> None:
        given = {
            "setup": setup,
            "teardown": teardown,
            "on_fit_start": on_fit_start,
            "on_fit_end": on_fit_end,
            "on_sanity_check_start": on_sanity_check_start,
            "on_sanity_check_end": on_sanity_check_end,
            "on_train_batch_start": on_train_batch_start,
            "on_train_batch_end": on_train_batch_end,
            "on_train_epoch_start": on_train_epoch_start,
            "on_train_epoch_end": on_train_epoch_end,
            "on_validation_epoch_start": on_validation_epoch_start,
            "on_validation_epoch_end": on_validation_epoch_end,
            "on_test_epoch_start": on_test_epoch_start,
            "on_test_epoch_end": on_test_epoch_end,
            "on_validation_batch_start": on_validation_batch_start,
            "on_validation_batch_end": on_validation_batch_end,
            "on_test_batch_start": on_test_batch_start,
            "on_test_batch_end": on_test_batch_end,
            "on_train_start": on_train_start,
            "on_train_end": on_train_end,
            "on_validation_start": on_validation_start,
            "on_validation_end": on_validation_end,
            "on_test_start": on_test_start,
            "on_test_end": on_test_end,
            "on_exception": on_exception,
            "on_save_checkpoint": on_save_checkpoint,
            "on_load_checkpoint": on_load_checkpoint,
            "on_before_backward": on_before_backward,
            "on_after_backward": on_after_backward,
            "on_before_optimizer_step": on_before_optimizer_step,
            "on_before_zero_grad": on_before_zero_grad,
            "on_predict_start": on_predict_start,
            "on_predict_end": on_predict_end,
            "on_predict_batch_start": on_predict_batch_start,
            "on_predict_batch_end": on_predict_batch_end,
            "on_predict_epoch_start": on_predict_epoch_start,
            "on_predict_epoch_end": on_predict_epoch_end,
        }
        for name, fn in given.items():
            if fn is not None:
                if not callable(fn):
                    raise TypeError(f"LambdaCallback({name}=...) must be callable, got {type(fn).__name__}")
                setattr(self, name, fn)
