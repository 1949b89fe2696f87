"""Evaluation loops: validation and test (metrics, no gradients), predict (outputs), the sanity check."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from trainer.common.rng import rng_state, set_rng_state
from trainer.loops.iteration import iterate, num_batches
from trainer.loops.step import make_eval_batch
from trainer.metric_routing import EPOCH_DEFAULTS
from trainer.metrics import MetricStore

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["eval_loop", "predict_loop", "sanity_check", "validation_enabled"]


def eval_loop(trainer: Trainer, stage: str, max_batches: float | None = None) -> dict[str, torch.Tensor]:
    """One pass over ``stage``'s data (``"validate"`` or ``"test"``) without gradients.

    Hook order (``X`` is ``validation`` or ``test``)::

        on_X_start, on_X_epoch_start
        for each batch: on_X_batch_start(batch, i); X_step(batch, i) under forward_context;
                        on_X_batch_end(out, batch, i)
        module.on_X_epoch_end; epoch values computed and logged; callbacks' on_X_epoch_end
        on_X_end

    Returns the epoch-level values (tensors). Python's, NumPy's and torch's random states are the
    same after the loop as before it.
    """
    prefix = "validation" if stage == "validate" else "test"
    module, strategy, hooks, router = trainer.module, trainer.strategy, trainer.hooks, trainer.metric_router
    assert module is not None
    if not hasattr(module, f"{prefix}_step"):
        raise NotImplementedError(f"{type(module).__name__} does not define {prefix}_step(self, batch, batch_idx)")
    loader = trainer.loaders[stage]
    assert loader is not None
    num = num_batches(loader, trainer.limits[stage])
    if max_batches is not None:
        num = min(num, max_batches)
    trainer.num_val_batches = num
    was_training = module.training
    if trainer.stage == "fit" and overrides(module, "on_validation_model_zero_grad"):
        module.on_validation_model_zero_grad()
    model_mode(module, f"on_{prefix}_model_eval")
    store = MetricStore(strategy.reduce)
    # Evaluation leaves the random state as it found it (creating a DataLoader iterator draws from it),
    # so a run resumed from a checkpoint taken before a validation continues exactly.
    rng_before = rng_state()
    try:
        with router.logging(store, EPOCH_DEFAULTS), torch.no_grad(), strategy.evaluation_context():
            hooks(f"on_{prefix}_start")
            hooks(f"on_{prefix}_epoch_start")
            eval_batch = make_eval_batch(trainer, f"{prefix}_step", prefix)
            for batch_idx, batch, _ in iterate(loader, num):
                eval_batch(batch, batch_idx)
            hooks.module(f"on_{prefix}_epoch_end")
            values = router.publish_epoch(store, max(trainer.progress.global_step - 1, 0))
            hooks.callbacks_only(f"on_{prefix}_epoch_end")
            hooks(f"on_{prefix}_end")
    finally:
        store.reset()
        model_mode(module, f"on_{prefix}_model_train", was_training)
        set_rng_state(rng_before)
    return values


def predict_loop(trainer: Trainer) -> list[Any]:
    """``predict_step`` over the predict data; returns the outputs in order.

    Hook order: on_predict_start, on_predict_epoch_start, per batch on_predict_batch_start /
    predict_step / on_predict_batch_end, on_predict_epoch_end, on_predict_end.
    """
    module, strategy, hooks = trainer.module, trainer.strategy, trainer.hooks
    assert module is not None
    loader = trainer.loaders["predict"]
    assert loader is not None
    num = num_batches(loader, trainer.limits["predict"])
    outputs: list[Any] = []
    was_training = module.training
    model_mode(module, "on_predict_model_eval")
    try:
        with torch.no_grad(), strategy.evaluation_context():
            hooks("on_predict_start")
            hooks("on_predict_epoch_start")
            predict_batch = make_eval_batch(trainer, "predict_step", "predict")
            for batch_idx, batch, _ in iterate(loader, num):
                outputs.append(predict_batch(batch, batch_idx))
            hooks("on_predict_epoch_end")
            hooks("on_predict_end")
    finally:
        module.train(was_training)
    return outputs


def validation_enabled(trainer: Trainer) -> bool:
    """Whether ``fit`` validates: validation data, a ``validation_step``, and a limit above 0."""
    return (
        trainer.loaders.get("validate") is not None
        and hasattr(trainer.module, "validation_step")
        and trainer.limits["validate"] not in (0, 0.0)
    )


def sanity_check(trainer: Trainer) -> None:
    """Run a few validation batches before training to surface bugs early; their values are dropped."""
    router = trainer.metric_router
    snapshot = router.snapshot()
    trainer.sanity_checking = True
    try:
        trainer.hooks.callbacks_only("on_sanity_check_start")
        steps = trainer.num_sanity_val_steps
        eval_loop(trainer, "validate", max_batches=math.inf if steps < 0 else steps)
        trainer.hooks.callbacks_only("on_sanity_check_end")
    finally:
        trainer.sanity_checking = False
        router.restore(snapshot)


def overrides(module: TrainModule, hook: str) -> bool:
    """Whether ``module``'s class overrides TrainModule's ``hook``."""
    from trainer.module import TrainModule

    return getattr(type(module), hook) is not getattr(TrainModule, hook)


def model_mode(module: TrainModule, hook: str, training: bool = False) -> None:
    """Call the module's ``on_*_model_eval``/``_train`` hook where overridden, else set the mode directly
    (``training``: the mode to restore; the default hooks' effect, without the call)."""
    if overrides(module, hook):
        getattr(module, hook)()
    else:
        module.train(training)
