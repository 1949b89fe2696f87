"""Evaluation loops: validation and test (metrics, no gradients), predict (outputs), the sanity check."""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from trainer.common.errors import MissingStepError, PossibleUserWarning
from trainer.common.rng import rng_state, set_rng_state
from trainer.data.fit_loaders import has_val_data, request_val_loaders
from trainer.data.loaders import ZipLoaders
from trainer.loops.dataloader_iter import DataloaderIter, takes_dataloader_iter
from trainer.loops.iteration import iterate, num_batches, set_sampler_epoch
from trainer.loops.model_modes import model_mode, module_modes, overrides, replaced, restore_modes
from trainer.loops.step import make_eval_batch
from trainer.metrics.routing import EPOCH_DEFAULTS
from trainer.metrics.store import MetricStore
from trainer.metrics.sync import epoch_agreement
from trainer.profilers.base import eval_fetch_action, profiled_iter

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.run_state import RunState
    from trainer.trainer import Trainer

__all__ = [
    "eval_loop",
    "module_modes",
    "predict_loop",
    "require_step",
    "restore_modes",
    "sanity_check",
    "set_num_batches",
    "validation_enabled",
]

_NUM_BATCHES = {"validate": "num_val_batches", "test": "num_test_batches", "predict": "num_predict_batches"}


def eval_loop(
    trainer: Trainer, state: RunState, stage: str, max_batches: float | None = None
) -> dict[str, torch.Tensor]:
    """One pass over ``stage``'s data (``"validate"`` or ``"test"``) without gradients.

    Hook order (``X`` is ``validation`` or ``test``)::

        on_X_model_eval
        strategy.evaluation_context()  # DDP: every rank receives rank 0's buffers (BatchNorm statistics)
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
    module, strategy, hooks, router = state.module, trainer.strategy, state.hooks, trainer.metric_router
    assert module is not None
    require_step(module, stage)
    loaders, nums = _batch_counts(state, stage, max_batches)
    modes = module_modes(module)
    # Called unless it is TrainModule's own (which frees gradients the step freed already), as Lightning calls it.
    if state.fn == "fit" and not state.sanity_checking and replaced(module, "on_validation_model_zero_grad"):
        router.no_log("on_validation_model_zero_grad", module.on_validation_model_zero_grad)()
    model_mode(module, f"on_{prefix}_model_eval", router)
    store = MetricStore(strategy.reduce, epoch_agreement(trainer))
    if state.fn != "fit":  # a validate/test call counts its steps' x-axis from 0 (fit: over all runs)
        router.eval_steps.clear()
    outer_stage, state.running_stage = state.running_stage, "sanity_check" if state.sanity_checking else stage
    try:
        with _no_grad(trainer), strategy.evaluation_context():
            with router.logging(store, EPOCH_DEFAULTS, evaluating=True):
                values = _run_epoch(trainer, state, stage, (loaders, nums), store, max_batches)
            with router.refusing(f"on_{prefix}_end"):
                hooks(f"on_{prefix}_end")
    finally:
        state.running_stage = outer_stage
        router.dataloader_suffix = ""
        store.reset()
        model_mode(module, f"on_{prefix}_model_train", router, modes)
    return values


def _batch_counts(state: RunState, stage: str, max_batches: float | None = None) -> tuple[list[Any], list[float]]:
    """``stage``'s prepared loaders and how many batches of each run; the counts are published
    (``trainer.num_val_batches``...) and the samplers told the epoch (see below)."""
    loaders = state.loaders[stage]
    assert isinstance(loaders, list)
    nums = [num_batches(loader, state.loop.limits[stage], stage) for loader in loaders]
    set_num_batches(
        state, stage, _per_iterable(loaders, nums, state.loop.limits[stage], stage) if stage != "predict" else nums
    )
    if max_batches is not None:
        nums = [min(num, max_batches) for num in nums]
    # As Lightning: a sampler may shuffle by the training epoch; in fit the one in progress, in a
    # validate/test/predict call the count of epochs trained (Lightning tells it when the loader is prepared).
    epoch = state.progress.epoch if state.fn == "fit" else _epochs_trained(state)
    for loader in loaders:
        set_sampler_epoch(loader, epoch)
    return loaders, nums


def require_step(module: TrainModule, stage: str) -> None:
    """``Trainer.validate``/``test`` need the module's own ``validation_step``/``test_step``.

    Raises:
        MissingStepError: TrainModule's default is kept, or the step is set to None (Lightning's way to switch off).
    """
    prefix = "validation" if stage == "validate" else "test"
    if not overrides(module, f"{prefix}_step"):
        raise MissingStepError(
            f"No `{prefix}_step()` method defined to run `Trainer.{stage}`. "
            f"({type(module).__name__} does not define {prefix}_step(self, batch, batch_idx))"
        )


def _run_epoch(
    trainer: Trainer,
    state: RunState,
    stage: str,
    prepared: tuple[list[Any], list[float]],
    store: MetricStore,
    max_batches: float | None,
) -> dict[str, torch.Tensor]:
    """The part of :func:`eval_loop` where ``self.log`` is allowed: from ``on_X_start`` to the epoch's values."""
    hooks, router = state.hooks, trainer.metric_router
    prefix = "validation" if stage == "validate" else "test"
    loaders, nums = prepared
    hooks(f"on_{prefix}_start")
    if state.loaders[stage] is not loaders:  # rebuilt in on_X_start (the batch-size finder's new size)
        loaders, nums = _batch_counts(state, stage, max_batches)
    several = len(loaders) > 1
    hooks(f"on_{prefix}_epoch_start")
    pending = store.pending_step
    it_mode = takes_dataloader_iter(getattr(state.module, f"{prefix}_step"))
    if it_mode:  # Lightning's step(self, dataloader_iter): the step fetches its own batches
        it = DataloaderIter(_sources(loaders, nums), on_fetch=_follow_fetch(router, several))
        fetching_batch = make_eval_batch(trainer, state, f"{prefix}_step", prefix, 0 if several else None)
        while not it.done:
            try:
                fetching_batch(it, 0)
            except StopIteration:  # the step found the data exhausted: the loop ends, as in Lightning
                break
            if pending:
                router.emit_eval_step(dict(pending), prefix, it.dataloader_idx)
                pending.clear()
    for dataloader_idx, (loader, num) in enumerate(zip(loaders, nums) if not it_mode else ()):
        # Lightning's rule: with several loaders, steps and batch hooks get ``dataloader_idx``
        # and logged names the ``/dataloader_idx_N`` suffix.
        router.dataloader_suffix = f"/dataloader_idx_{dataloader_idx}" if several else ""
        eval_batch = make_eval_batch(trainer, state, f"{prefix}_step", prefix, dataloader_idx if several else None)
        batches = profiled_iter(trainer.profiler, eval_fetch_action(prefix), iterate(loader, num))
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
    # Lightning's x-axis (its ``_batches_that_stepped``): inside ``fit`` the step just taken, whose count
    # is not yet advanced when it validates; a ``validate``/``test`` call after ``fit`` (8 steps) logs at 8.
    steps = state.progress.global_step
    return router.publish_epoch(store, max(steps - 1, 0) if state.fn == "fit" else steps)


def _epochs_trained(state: RunState) -> int:
    """Lightning's ``fit_loop.epoch_progress.current.processed`` outside fit: the epochs trained so far."""
    p = state.progress
    return p.epoch + 1 if p.epoch_finished else p.epoch


def predict_loop(trainer: Trainer, state: RunState, keep: bool = True) -> list[list[Any]]:
    """``predict_step`` over the predict data; returns the outputs in order, one list per loader.

    ``keep=False`` (``return_predictions=False``) keeps no output, so memory stays flat.

    Hook order: on_predict_start, on_predict_epoch_start, per batch on_predict_batch_start /
    predict_step / on_predict_batch_end, on_predict_epoch_end, on_predict_end.
    """
    module, strategy, hooks = state.module, trainer.strategy, state.hooks
    assert module is not None
    if module.predict_step is None:
        raise MissingStepError(
            f"`predict_step` cannot be None. ({type(module).__name__}.predict_step is None: set it to a method to "
            "predict)"
        )
    if getattr(module, "forward", None) is None and not overrides(module, "predict_step"):
        raise MissingStepError(
            "`Trainer.predict` requires `forward` method to run. (The default predict_step calls "
            f"{type(module).__name__}.forward; define it, or override predict_step)"
        )
    loaders, nums = _batch_counts(state, "predict")
    outputs: list[list[Any]] = []
    modes = module_modes(module)
    model_mode(module, "on_predict_model_eval", trainer.metric_router)
    try:
        with _no_grad(trainer), strategy.evaluation_context():
            hooks("on_predict_start")
            if state.loaders["predict"] is not loaders:  # rebuilt in on_predict_start (the batch-size finder)
                loaders, nums = _batch_counts(state, "predict")
            hooks("on_predict_epoch_start")
            it_mode = takes_dataloader_iter(module.predict_step)
            if it_mode:  # Lightning's predict_step(self, dataloader_iter): the step fetches its own batches
                outputs = [[] for _ in loaders]
                it = DataloaderIter(_sources(loaders, nums))
                several = len(loaders) > 1
                predict_step = make_eval_batch(trainer, state, "predict_step", "predict", 0 if several else None)
                while not it.done:
                    try:
                        out = predict_step(it, 0)
                    except StopIteration:
                        break
                    if keep:
                        outputs[it.dataloader_idx].append(out)
            for dataloader_idx, (loader, num) in enumerate(zip(loaders, nums) if not it_mode else ()):
                predict_batch = make_eval_batch(
                    trainer, state, "predict_step", "predict", dataloader_idx if len(loaders) > 1 else None
                )
                kept: list[Any] = []
                batches = profiled_iter(trainer.profiler, "[_PredictionLoop].predict_next", iterate(loader, num))
                for batch_idx, batch, _ in batches:
                    out = predict_batch(batch, batch_idx)
                    if keep:
                        kept.append(out)
                outputs.append(kept)
            hooks("on_predict_epoch_end")
            hooks("on_predict_end")
    finally:
        restore_modes(module, modes)
    return outputs


def _sources(loaders: list[Any], nums: list[float]) -> list[tuple[int, float, Callable[[], Iterator[Any]]]]:
    """The loaders as :class:`~trainer.loops.dataloader_iter.DataloaderIter` reads them, one after another."""
    return [(idx, num, functools.partial(iterate, loader, num)) for idx, (loader, num) in enumerate(zip(loaders, nums))]


def _follow_fetch(router: Any, several: bool) -> Callable[[Any, int], None]:
    """What the logging follows as a step fetches: the batch (``self.log``'s batch size), the loader's suffix."""

    def on_fetch(batch: Any, dataloader_idx: int) -> None:
        router.current_batch = batch
        router.dataloader_suffix = f"/dataloader_idx_{dataloader_idx}" if several else ""

    return on_fetch


def _per_iterable(loaders: list[Any], nums: list[float], limit: Any, stage: str) -> list[float]:
    """The batch counts Lightning reports: per loader, and for a combined loader per iterable it combines."""
    counts: list[float] = []
    for loader, num in zip(loaders, nums):
        if isinstance(loader, ZipLoaders):
            counts += [num_batches(inner, limit, stage) for inner in loader.loaders]
        else:
            counts.append(num)
    return counts


def set_num_batches(state: RunState, stage: str, nums: list[float]) -> None:
    """``state.num_val_batches`` (or test's, predict's): one count per loader, a list as Lightning's.

    During the sanity check ``num_val_batches`` holds the full validation's counts, as in Lightning;
    the sanity check's own (cut by ``num_sanity_val_steps``) are ``num_sanity_val_batches``.
    """
    setattr(state, _NUM_BATCHES[stage], list(nums))
    if stage == "validate" and state.fn == "fit":
        steps = state.loop.num_sanity_val_steps
        state.num_sanity_val_batches = [min(num, math.inf if steps < 0 else steps) for num in nums]


def validation_enabled(state: RunState) -> bool:
    """Whether ``fit`` validates: validation data (requested or not yet), a ``validation_step``, a limit above 0."""
    return (
        state.module is not None
        and overrides(state.module, "validation_step")
        and state.loop.limits["validate"] not in (0, 0.0)
        and has_val_data(state)
    )


def warn_if_validation_is_half_defined(state: RunState) -> None:
    """Lightning's warnings when ``fit`` has validation data but no ``validation_step``, or the reverse:
    the validation loop is skipped, which is seldom what was meant."""
    has_loader = has_val_data(state)  # requested, or given / defined and requested when first needed
    has_step = state.module is not None and overrides(state.module, "validation_step")
    if has_loader and not has_step:
        warnings.warn(
            "You passed in a `val_dataloader` but have no `validation_step`. Skipping val loop.",
            UserWarning,
            stacklevel=3,
        )
    elif has_step and not has_loader:
        warnings.warn(
            "You defined a `validation_step` but have no `val_dataloader`. Skipping val loop.",
            PossibleUserWarning,
            stacklevel=3,
        )


def sanity_check(trainer: Trainer, state: RunState) -> None:
    """Run a few validation batches before training to surface bugs early; their values are dropped.

    As Lightning's, the sanity check leaves no trace in the random state either: Python's, NumPy's
    and torch's generators are put back afterwards, so adding or removing it changes no number of
    the training that follows.
    """
    router = trainer.metric_router
    snapshot = router.snapshot()
    rng_before = rng_state()
    state.sanity_checking = True
    outer_stage, state.running_stage = state.running_stage, "sanity_check"
    try:
        state.hooks.callbacks_only("on_sanity_check_start")
        steps = state.loop.num_sanity_val_steps
        if request_val_loaders(trainer) is not None:  # val_dataloader() runs here, its random draws undone
            eval_loop(trainer, state, "validate", max_batches=math.inf if steps < 0 else steps)
        state.hooks.callbacks_only("on_sanity_check_end")
    finally:
        state.sanity_checking = False
        state.running_stage = outer_stage
        router.restore(snapshot)
        set_rng_state(rng_before)


def _no_grad(trainer: Trainer) -> contextlib.AbstractContextManager[Any]:
    """``Trainer(inference_mode=True)`` (Lightning's default): ``torch.inference_mode()``, else ``no_grad``.

    Validation inside ``fit`` always runs under ``no_grad``, as Lightning's: tensors its hooks create
    (a pruning mask made at ``on_validation_epoch_end``, a buffer set in ``validation_step``) are
    used by the training that follows, and autograd refuses inference tensors there.
    A strategy whose evaluation needs autograd's version counters (FSDP's parameter gathering) sets
    ``supports_inference_mode = False`` and gets ``no_grad``.
    """
    if trainer.inference_mode and trainer.strategy.supports_inference_mode and trainer.stage != "fit":
        return torch.inference_mode()
    return torch.no_grad()
