"""Evaluation loops: validation and test (metrics, no gradients), predict (outputs), the sanity check."""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any

import torch

from trainer.common.rng import rng_state, set_rng_state
from trainer.loops.iteration import iterate, num_batches
from trainer.loops.step import make_eval_batch
from trainer.metric_routing import EPOCH_DEFAULTS
from trainer.metric_sync import epoch_agreement
from trainer.metrics import MetricStore
from trainer.profilers.base import profiled_iter

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["eval_loop", "predict_loop", "sanity_check", "set_num_batches", "validation_enabled"]

_NUM_BATCHES = {"validate": "num_val_batches", "test": "num_test_batches", "predict": "num_predict_batches"}


def eval_loop(trainer: Trainer, stage: str, max_batches: float | None = None) -> dict[str, torch.Tensor]:
    """One pass over ``stage``'s data (``"validate"`` or ``"test"``) without gradients.

    Hook order (``X`` is ``validation`` or ``test``)::

        on_X_model_eval
        on_X_start, on_X_epoch_start
        for each batch: batch transfer hooks; on_X_batch_start(batch, i);
                        X_step(batch, i) under forward_context; on_X_batch_end(out, batch, i)
        on_X_epoch_end; epoch values computed and logged
        on_X_end
        on_X_model_train

    Each hook runs the callbacks' first, then the module's (:mod:`trainer.hook_order`).

    Several loaders run one after another; ``X_step`` and the batch hooks then get ``dataloader_idx``
    as their last argument, and logged names end in ``/dataloader_idx_N``.

    Returns the epoch-level values (tensors). Random numbers drawn here (a shuffled loader's order,
    dropout left on, ``torch.rand`` in a step) are drawn from the global generators, and the run goes
    on from where they leave them, as in Lightning; only the sanity check puts them back
    (:func:`sanity_check`).
    """
    prefix = "validation" if stage == "validate" else "test"
    module, strategy, hooks, router = trainer.module, trainer.strategy, trainer.hooks, trainer.metric_router
    assert module is not None
    if not hasattr(module, f"{prefix}_step"):
        raise NotImplementedError(f"{type(module).__name__} does not define {prefix}_step(self, batch, batch_idx)")
    loaders = trainer.loaders[stage]
    assert isinstance(loaders, list)
    nums = [num_batches(loader, trainer.limits[stage]) for loader in loaders]
    if max_batches is not None:
        nums = [min(num, max_batches) for num in nums]
    set_num_batches(trainer, stage, nums)
    was_training = module.training
    if trainer.stage == "fit" and not trainer.sanity_checking and overrides(module, "on_validation_model_zero_grad"):
        module.on_validation_model_zero_grad()
    model_mode(module, f"on_{prefix}_model_eval")
    store = MetricStore(strategy.reduce, epoch_agreement(trainer))
    if trainer.stage != "fit":  # a validate/test call counts its steps' x-axis from 0 (fit: over all runs)
        router.eval_steps.clear()
    outer_stage, trainer.running_stage = trainer.running_stage, "sanity_check" if trainer.sanity_checking else stage
    try:
        with _no_grad(trainer), strategy.evaluation_context():
            with router.logging(store, EPOCH_DEFAULTS):
                values = _run_epoch(trainer, prefix, loaders, nums, store)
            with router.refusing(f"on_{prefix}_end"):
                hooks(f"on_{prefix}_end")
    finally:
        trainer.running_stage = outer_stage
        router.dataloader_suffix = ""
        store.reset()
        model_mode(module, f"on_{prefix}_model_train", was_training)
    return values


def _run_epoch(
    trainer: Trainer, prefix: str, loaders: list[Any], nums: list[float], store: MetricStore
) -> dict[str, torch.Tensor]:
    """The part of :func:`eval_loop` where ``self.log`` is allowed: from ``on_X_start`` to the epoch's values."""
    hooks, router = trainer.hooks, trainer.metric_router
    several = len(loaders) > 1
    hooks(f"on_{prefix}_start")
    hooks(f"on_{prefix}_epoch_start")
    for dataloader_idx, (loader, num) in enumerate(zip(loaders, nums)):
        # Lightning's rule: with several loaders, steps and batch hooks get ``dataloader_idx``
        # and logged names the ``/dataloader_idx_N`` suffix.
        router.dataloader_suffix = f"/dataloader_idx_{dataloader_idx}" if several else ""
        eval_batch = make_eval_batch(trainer, f"{prefix}_step", prefix, dataloader_idx if several else None)
        batches = profiled_iter(trainer.profiler, f"{prefix}_dataloader_next", iterate(loader, num))
        pending = store.pending_step
        for batch_idx, batch, _ in batches:
            eval_batch(batch, batch_idx)
            if pending:  # values logged with on_step=True go to the loggers now, as in Lightning
                router.emit_eval_step(dict(pending), prefix, dataloader_idx)
                pending.clear()
    router.dataloader_suffix = ""
    # Callbacks, then the module (trainer/hook_order.py); the callbacks see the epoch's values
    # of the steps, as in Lightning, which computes them when read.
    if hooks.overridden(f"on_{prefix}_epoch_end"):
        router.remember(store.epoch_values(), store)
        hooks(f"on_{prefix}_epoch_end")
    return router.publish_epoch(store, max(trainer.progress.global_step - 1, 0))


def predict_loop(trainer: Trainer, keep: bool = True) -> list[list[Any]]:
    """``predict_step`` over the predict data; returns the outputs in order, one list per loader.

    ``keep=False`` (``return_predictions=False``) keeps no output, so memory stays flat.

    Hook order: on_predict_start, on_predict_epoch_start, per batch on_predict_batch_start /
    predict_step / on_predict_batch_end, on_predict_epoch_end, on_predict_end.
    """
    module, strategy, hooks = trainer.module, trainer.strategy, trainer.hooks
    assert module is not None
    loaders = trainer.loaders["predict"]
    assert isinstance(loaders, list)
    nums = [num_batches(loader, trainer.limits["predict"]) for loader in loaders]
    set_num_batches(trainer, "predict", nums)
    outputs: list[list[Any]] = []
    was_training = module.training
    model_mode(module, "on_predict_model_eval")
    try:
        with _no_grad(trainer), strategy.evaluation_context():
            hooks("on_predict_start")
            hooks("on_predict_epoch_start")
            for dataloader_idx, (loader, num) in enumerate(zip(loaders, nums)):
                predict_batch = make_eval_batch(
                    trainer, "predict_step", "predict", dataloader_idx if len(loaders) > 1 else None
                )
                kept: list[Any] = []
                batches = profiled_iter(trainer.profiler, "predict_dataloader_next", iterate(loader, num))
                for batch_idx, batch, _ in batches:
                    out = predict_batch(batch, batch_idx)
                    if keep:
                        kept.append(out)
                outputs.append(kept)
            hooks("on_predict_epoch_end")
            hooks("on_predict_end")
    finally:
        module.train(was_training)
    return outputs


def set_num_batches(trainer: Trainer, stage: str, nums: list[float]) -> None:
    """``trainer.num_val_batches`` (or test's, predict's): a number for one loader, a list for several."""
    value: float | list[float] = nums[0] if len(nums) == 1 else nums
    name = "num_sanity_val_batches" if trainer.sanity_checking else _NUM_BATCHES[stage]
    setattr(trainer, name, value)
    if stage == "validate":
        trainer.num_val_batches = value


def validation_enabled(trainer: Trainer) -> bool:
    """Whether ``fit`` validates: validation data, a ``validation_step``, and a limit above 0."""
    return (
        trainer.loaders.get("validate") is not None
        and hasattr(trainer.module, "validation_step")
        and trainer.limits["validate"] not in (0, 0.0)
    )


def sanity_check(trainer: Trainer) -> None:
    """Run a few validation batches before training to surface bugs early; their values are dropped.

    As Lightning's, the sanity check leaves no trace in the random state either: Python's, NumPy's
    and torch's generators are put back afterwards, so adding or removing it changes no number of
    the training that follows.
    """
    router = trainer.metric_router
    snapshot = router.snapshot()
    rng_before = rng_state()
    trainer.sanity_checking = True
    outer_stage, trainer.running_stage = trainer.running_stage, "sanity_check"
    try:
        trainer.hooks.callbacks_only("on_sanity_check_start")
        steps = trainer.num_sanity_val_steps
        eval_loop(trainer, "validate", max_batches=math.inf if steps < 0 else steps)
        trainer.hooks.callbacks_only("on_sanity_check_end")
    finally:
        trainer.sanity_checking = False
        trainer.running_stage = outer_stage
        router.restore(snapshot)
        set_rng_state(rng_before)


def _no_grad(trainer: Trainer) -> contextlib.AbstractContextManager[Any]:
    """``Trainer(inference_mode=True)`` (Lightning's default): ``torch.inference_mode()``, else ``no_grad``.

    A strategy whose evaluation needs autograd's version counters (FSDP's parameter gathering) sets
    ``supports_inference_mode = False`` and gets ``no_grad``.
    """
    if trainer.inference_mode and trainer.strategy.supports_inference_mode:
        return torch.inference_mode()
    return torch.no_grad()


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
