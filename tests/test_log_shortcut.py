"""``self.log``'s per-step shortcut (``MetricRouter.plain``) does exactly what the full path does.

A training step's ``self.log(name, loss)`` takes a shortcut once a first, full call of the same name
worked out where the value goes. Each test runs the same module twice, once with the shortcut and
once with it switched off, and compares everything a user or a callback can see: ``callback_metrics``
and ``progress_bar_metrics`` after every batch, the rows the loggers got, the epoch values at the end.
The modules switch between calls the shortcut may take and calls it must leave to the full path.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torchmetrics

from callbacks.base import Callback
from tests.helpers.regression import Regressor, make_loader
from trainer import Trainer
from trainer.metrics.routing import MetricRouter


class _NoPlans(dict):  # type: ignore[type-arg]
    """A ``plain`` dict that never keeps a plan: every ``self.log`` takes the full path."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


class _Seen(Callback):
    """What callbacks and loggers see: the metric dicts after every batch, every row handed to loggers."""

    def __init__(self) -> None:
        self.batches: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.rows: list[tuple[int, dict[str, float]]] = []

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.batches.append((_plain(trainer.callback_metrics), _plain(trainer.progress_bar_metrics)))

    def on_log_metrics(self, trainer: Any, module: Any, metrics: dict[str, torch.Tensor], step: int) -> None:
        self.rows.append((step, {k: float(v) for k, v in metrics.items()}))


def _plain(metrics: dict[str, Any]) -> dict[str, Any]:
    """Values with what distinguishes them: number, dtype, shape, whether they still carry a graph
    (``progress_bar_metrics`` holds Python numbers, as Lightning's does)."""
    return {
        k: (float(v), v.dtype, tuple(v.shape), v.requires_grad, v.grad_fn is None)
        if isinstance(v, torch.Tensor)
        else (v, type(v))
        for k, v in metrics.items()
    }


def _run(module: Regressor, make_trainer: Any, shortcut: bool, **kwargs: Any) -> tuple[_Seen, Trainer, MetricRouter]:
    seen = _Seen()
    trainer = make_trainer(max_epochs=2, log_every_n_steps=1, callbacks=[seen], **kwargs)
    if not shortcut:
        trainer.metric_router.plain = trainer._plain_log = _NoPlans()
    trainer.fit(module, make_loader(12, 2), make_loader(4, 2))
    return seen, trainer, trainer.metric_router


def _same_either_way(make_module: Any, make_trainer: Any, **kwargs: Any) -> tuple[_Seen, Trainer]:
    torch.manual_seed(0)
    fast, trainer, _ = _run(make_module(), make_trainer, True, **kwargs)
    torch.manual_seed(0)
    full, reference, _ = _run(make_module(), make_trainer, False, **kwargs)
    assert fast.batches == full.batches
    assert fast.rows == full.rows
    for name in ("callback_metrics", "progress_bar_metrics", "logged_metrics"):
        assert _plain(getattr(trainer, name)) == _plain(getattr(reference, name)), name
    assert trainer.metric_router.no_logger_keys == reference.metric_router.no_logger_keys
    return fast, trainer


class _Switching(Regressor):
    """Per-step logs whose options, types and shapes change from batch to batch."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        self.log("loss", loss)  # the shortcut's case, every step
        self.log("bar", loss * 2, prog_bar=batch_idx % 2 == 0)  # the bar follows the first call's choice
        # an int tensor, a one-element vector, a Python number: converted by the full path each time
        self.log("count", torch.tensor(batch_idx))
        self.log("vector", loss.reshape(1))
        self.log("number", float(batch_idx))
        # the same name under changing options: hidden from loggers, per epoch too, synced, max-reduced
        self.log("hidden", loss, logger=batch_idx != 3)
        self.log("both", loss, on_epoch=batch_idx >= 2)
        self.log("synced", loss, sync_dist=batch_idx % 3 == 0)
        self.log("reduced", loss, reduce_fx="max" if batch_idx == 1 else "mean")
        self.log("double", loss.double() if batch_idx == 4 else loss)
        self.log("loss_step", loss * 5)  # a name with the suffix the full path strips for callback_metrics
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        self.log("loss", torch.tensor(7.0))  # the same name in another store, per epoch


def test_switching_options_types_and_shapes_give_what_the_full_path_gives(make_trainer: Any) -> None:
    seen, trainer = _same_either_way(_Switching, make_trainer)
    assert len(seen.batches) == 12 and seen.rows
    # Logged values are detached copies: no graph is kept alive between steps.
    for callback_metrics, _ in seen.batches:
        assert not callback_metrics["loss"][3] and callback_metrics["loss"][4]
    assert "hidden" in trainer.metric_router.no_logger_keys


class _MetricThenTensor(Regressor):
    """A name logged as a torchmetrics Metric in some steps and as a tensor in others."""

    def __init__(self) -> None:
        super().__init__()
        self.total = torchmetrics.SumMetric()

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        if batch_idx % 3 == 1:
            self.total(loss.detach())
            self.log("mixed", self.total)
        else:
            self.log("mixed", loss)
        return loss


def test_a_name_logged_as_a_metric_between_tensors_gives_what_the_full_path_gives(make_trainer: Any) -> None:
    _, trainer = _same_either_way(_MetricThenTensor, make_trainer)
    torch.manual_seed(0)
    _, reference, _ = _run(_MetricThenTensor(), make_trainer, False)
    # The entry forgets the metric when a tensor is logged under its name: the epoch's end resets
    # only metrics that are still logged, so the totals left after the fit say which one it held.
    assert float(trainer.lightning_module.total.sum_value) == float(reference.lightning_module.total.sum_value)


class _InHooks(Regressor):
    """The same name from the step, a batch hook and an epoch hook (where the defaults differ)."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        self.log("loss", loss)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.log("loss", outputs["loss"] * 3 if isinstance(outputs, dict) else outputs * 3)

    def on_train_epoch_start(self) -> None:
        self.log("loss", torch.tensor(-1.0))  # per epoch here: must not reuse the step's plan

    def on_train_epoch_end(self) -> None:
        self.log("loss", torch.tensor(-2.0))


def test_hooks_with_other_defaults_and_validation_between_steps_give_what_the_full_path_gives(
    make_trainer: Any,
) -> None:
    _same_either_way(_InHooks, make_trainer, val_check_interval=3)
    _same_either_way(_InHooks, make_trainer, accumulate_grad_batches=2)


def test_sync_dist_and_reduce_fx_still_reach_the_full_path(make_trainer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step value logged with ``sync_dist=True`` is reduced, and an unknown ``reduce_fx`` refused, after plain calls."""
    from strategies.base import Strategy

    # One process reduces to the value itself; a reduction that shows it ran tells the paths apart.
    monkeypatch.setattr(Strategy, "reduce", lambda self, tensor, op="mean": tensor * 10)
    _same_either_way(_Switching, make_trainer)

    class Bogus(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            self.log("loss", loss, reduce_fx="median" if batch_idx == 2 else "mean")
            return loss

    with pytest.raises(ValueError, match="reduce_fx must be one of"):
        make_trainer(max_epochs=1).fit(Bogus(), make_loader(12, 2))


def test_plans_made_in_a_nested_block_end_with_it() -> None:
    """A plan made under the training step's defaults is not used in an enclosing block with others."""
    from trainer.metrics.routing import EPOCH_DEFAULTS, STEP_DEFAULTS
    from trainer.metrics.store import MetricStore

    router = MetricRouter(lambda metrics, step, with_epoch: None, lambda: False)
    store = MetricStore(lambda tensor, op: tensor)
    with router.logging(store, EPOCH_DEFAULTS):
        with router.logging(store, STEP_DEFAULTS):
            router.log("x", torch.tensor(1.0), None, None, False, False, "mean", None)
            assert set(router.plain) == {"x"}
        assert router.plain == {}


def test_the_full_path_runs_once_per_name_and_batch_loop(make_trainer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shortcut is taken: only the first plain call of each name in a batch loop reaches the router."""
    reached: list[str] = []
    full = MetricRouter.log

    def counting(self: MetricRouter, name: str, *args: Any) -> None:
        reached.append(name)
        full(self, name, *args)

    class OneName(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            self.log("loss", loss)
            return loss

    trainer = make_trainer(max_epochs=2, limit_val_batches=0)
    monkeypatch.setattr(MetricRouter, "log", counting)
    trainer._log = trainer.metric_router.log  # bound at construction: bind the counting one
    trainer.fit(OneName(), make_loader(12, 2))
    assert reached == ["loss", "loss"]  # one per epoch's batch loop, of 6 steps each
