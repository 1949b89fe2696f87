"""``self.log`` semantics: Lightning's defaults, suffixes, weighted epoch means, reductions, metrics."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torchmetrics
from torch.nn import functional as F

from callbacks.base import Callback
from tests.helpers.regression import Regressor, make_dataset, make_loader
from trainer.metrics.store import MetricStore


class LogRecorder(Callback):
    """A logger stand-in: keeps every ``(step, metrics)`` the trainer hands to loggers."""

    def __init__(self) -> None:
        self.records: list[tuple[int, dict[str, float]]] = []

    def on_log_metrics(self, trainer: Any, module: Any, metrics: dict[str, torch.Tensor], step: int) -> None:
        self.records.append((step, {k: float(v) for k, v in metrics.items()}))

    def keys_at(self) -> list[tuple[int, set[str]]]:
        return [(step, set(m)) for step, m in self.records]


def test_lightning_defaults_per_step_in_training_per_epoch_elsewhere(make_trainer: Any) -> None:
    losses: list[float] = []

    class M(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            losses.append(float(loss.detach()))
            self.log("train_loss", loss)
            return loss

        def on_train_epoch_end(self) -> None:
            self.log("epoch_hook", float(self.current_epoch))

    recorder = LogRecorder()
    trainer = make_trainer(max_epochs=2, log_every_n_steps=1, callbacks=[recorder])
    trainer.fit(M(), make_loader(6, 2), make_loader(4, 2))

    # training_step: one value per step, under its own name, no epoch aggregate.
    step_records = [(s, m["train_loss"]) for s, m in recorder.records if "train_loss" in m]
    assert step_records == [(i, pytest.approx(v)) for i, v in enumerate(losses)]
    assert float(trainer.callback_metrics["train_loss"]) == pytest.approx(losses[-1])
    assert not any(k.endswith(("_step", "_epoch")) for k in trainer.callback_metrics)
    # validation_step and epoch-end hooks: one value per epoch, handed over at the epoch's last step.
    assert [s for s, m in recorder.records if "val_loss" in m] == [2, 5]
    assert [(s, m["epoch_hook"]) for s, m in recorder.records if "epoch_hook" in m] == [(2, 0.0), (5, 1.0)]


def test_step_and_epoch_suffixes_and_weighted_mean(make_trainer: Any) -> None:
    """10 samples in batches of 4, 4, 2: the epoch value weights each batch by its size."""

    class M(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("x0", batch[0][:, 0].mean(), on_step=True, on_epoch=True, prog_bar=True)
            return super().training_step(batch, batch_idx)

    recorder = LogRecorder()
    trainer = make_trainer(max_epochs=1, log_every_n_steps=1, callbacks=[recorder])
    trainer.fit(M(), make_loader(10, 4))
    x0 = make_dataset(10).tensors[0][:, 0]
    assert [sorted(m) for _, m in recorder.records] == [["epoch", "x0_step"]] * 3 + [
        ["epoch", "x0_epoch"]
    ]  # Lightning adds epoch
    assert recorder.records[2][1]["x0_step"] == pytest.approx(float(x0[8:].mean()))
    # The plain mean of the three batch means would differ: the last batch has only 2 samples.
    assert float(trainer.callback_metrics["x0_epoch"]) == pytest.approx(float(x0.mean()), abs=1e-6)
    assert float(x0.mean()) != pytest.approx(float(torch.stack([x0[:4].mean(), x0[4:8].mean(), x0[8:].mean()]).mean()))
    assert set(trainer.progress_bar_metrics) == {"x0_step", "x0_epoch"}


def test_explicit_batch_size_and_reductions(make_trainer: Any) -> None:
    class M(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            value = torch.tensor(float(batch_idx + 1))  # 1, 2, 3
            self.log("weighted", value, on_epoch=True, on_step=False, batch_size=batch_idx + 1)
            self.log("total", value, on_epoch=True, on_step=False, reduce_fx="sum")
            self.log("largest", value, on_epoch=True, on_step=False, reduce_fx="max")
            self.log("smallest", value, on_epoch=True, on_step=False, reduce_fx="min")
            self.log("not_shown", value, on_epoch=True, on_step=False)
            return super().training_step(batch, batch_idx)

    trainer = make_trainer(max_epochs=1)
    trainer.fit(M(), make_loader(6, 2))
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert metrics["weighted"] == pytest.approx((1 * 1 + 2 * 2 + 3 * 3) / 6)
    assert metrics["total"] == 6.0
    assert metrics["largest"] == 3.0
    assert metrics["smallest"] == 1.0
    assert metrics["not_shown"] == pytest.approx(2.0)
    assert trainer.progress_bar_metrics == {}


def test_log_dict_logs_every_item(make_trainer: Any) -> None:
    class M(Regressor):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log_dict({"a": x.sum(), "b": y.sum()}, prog_bar=True, reduce_fx="sum")

    metrics = make_trainer().validate(M(), make_loader(6, 4))[0]
    x, y = make_dataset(6).tensors
    assert metrics == {"a": pytest.approx(float(x.sum()), abs=1e-5), "b": pytest.approx(float(y.sum()), abs=1e-5)}


def test_torchmetrics_metric_is_computed_on_all_data_and_reset_each_epoch(make_trainer: Any) -> None:
    class M(Regressor):
        def __init__(self) -> None:
            super().__init__()
            self.val_mse = torchmetrics.MeanSquaredError()
            self.target_sum = torchmetrics.SumMetric()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.target_sum.update(batch[1].sum())
            self.log("target_sum", self.target_sum, on_step=False, on_epoch=True)
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.val_mse.update(self(x), y)
            self.log("val_mse", self.val_mse)

    seen: list[tuple[float, float]] = []
    sums: list[float] = []

    class Check(Callback):
        def on_validation_epoch_end(self, trainer: Any, module: Any) -> None:
            if trainer.sanity_checking:
                return
            x, y = make_dataset(5, seed=1).tensors
            with torch.no_grad():
                hand = float(F.mse_loss(module(x), y))
            seen.append((float(trainer.callback_metrics["val_mse"]), hand))

        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            sums.append(float(trainer.callback_metrics["target_sum"]))

    # The sanity check updates val_mse on one batch; the first real epoch must not include it.
    trainer = make_trainer(max_epochs=2, num_sanity_val_steps=1, callbacks=[Check()])
    trainer.fit(M(), make_loader(6, 4), make_loader(5, 2, seed=1))
    assert len(seen) == 2
    for logged, hand in seen:
        assert logged == pytest.approx(hand, rel=1e-5)
    y_sum = float(make_dataset(6).tensors[1].sum())
    assert sums == [pytest.approx(y_sum, rel=1e-5)] * 2  # reset between epochs: not 2x in epoch 2


def test_a_metric_whose_compute_is_not_a_tensor_is_refused_by_name(make_trainer: Any) -> None:
    """A tuple from ``compute()`` would become one vector under the metric's name; refused as Lightning does."""

    class Pair(torchmetrics.Metric):
        def update(self) -> None:
            pass

        def compute(self) -> Any:
            return torch.tensor(1.0), torch.tensor(2.0)

    class M(Regressor):
        def __init__(self) -> None:
            super().__init__()
            self.pair = Pair()

        def on_train_start(self) -> None:
            self.log("pair", self.pair)

    with pytest.raises(ValueError, match=r"`.compute\(\)` return of the metric logged as 'pair' must be a tensor"):
        make_trainer(max_epochs=1).fit(M(), make_loader(4, 2))


def test_metric_logged_per_step_only_is_reset_at_epoch_end(make_trainer: Any) -> None:
    """A metric logged with on_step only still must not keep growing over the whole run."""

    class M(Regressor):
        def __init__(self) -> None:
            super().__init__()
            self.seen = torchmetrics.SumMetric()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.seen(torch.tensor(float(len(batch[0]))))  # forward: updates and caches the batch value
            self.log("seen", self.seen)
            return super().training_step(batch, batch_idx)

    module = M()
    make_trainer(max_epochs=2).fit(module, make_loader(6, 2))
    assert float(module.seen.sum_value) == 0.0  # reset at the end of the last epoch


def test_loggers_receive_step_values_every_n_steps(make_trainer: Any) -> None:
    class M(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            self.log("loss", loss, on_epoch=True)
            self.log("idx", float(batch_idx))
            return loss

    recorder = LogRecorder()
    trainer = make_trainer(max_epochs=1, log_every_n_steps=2, callbacks=[recorder])
    trainer.fit(M(), make_loader(10, 2), make_loader(4, 2))  # 5 steps
    assert recorder.keys_at() == [  # every row carries the epoch, as Lightning's do
        (1, {"loss_step", "idx", "epoch"}),
        (3, {"loss_step", "idx", "epoch"}),
        (4, {"val_loss", "epoch"}),
        (4, {"loss_epoch", "epoch"}),
    ]
    assert [m["idx"] for _, m in recorder.records[:2]] == [1.0, 3.0]
    assert set(trainer.logged_metrics) == {"loss_step", "idx", "val_loss", "loss_epoch"}


def test_log_every_n_steps_zero_never_logs_steps_as_lightning(make_trainer: Any) -> None:
    class M(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            self.log("loss", loss, on_epoch=True)
            return loss

    recorder = LogRecorder()
    trainer = make_trainer(max_epochs=1, log_every_n_steps=0, callbacks=[recorder])
    trainer.fit(M(), make_loader(10, 2))
    assert trainer.log_every_n_steps == 0
    assert recorder.keys_at() == [(4, {"loss_epoch", "epoch"})]  # the epoch's values only


def test_log_every_n_steps_counts_optimizer_steps_under_accumulation(make_trainer: Any) -> None:
    class M(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("idx", float(batch_idx))
            return super().training_step(batch, batch_idx)

    recorder = LogRecorder()
    make_trainer(max_epochs=1, accumulate_grad_batches=2, log_every_n_steps=1, callbacks=[recorder]).fit(
        M(), make_loader(10, 2)
    )
    # 5 batches, steps after batches 1, 3, 4: each record holds the window's last value.
    assert [(s, m["idx"]) for s, m in recorder.records] == [(0, 1.0), (1, 3.0), (2, 4.0)]


def test_sanity_check_values_do_not_leak(make_trainer: Any) -> None:
    state_at_train_start: list[dict[str, Any]] = []

    class M(Regressor):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            super().validation_step(batch, batch_idx)
            if self.trainer.sanity_checking:
                self.log("sanity_only", 1.0, prog_bar=True)

        def on_train_start(self) -> None:
            t = self.trainer
            state_at_train_start.append(
                {"cb": dict(t.callback_metrics), "pb": dict(t.progress_bar_metrics), "lg": dict(t.logged_metrics)}
            )

    recorder = LogRecorder()
    trainer = make_trainer(max_epochs=1, num_sanity_val_steps=2, callbacks=[recorder])
    trainer.fit(M(), make_loader(4, 2), make_loader(6, 2))
    assert state_at_train_start == [{"cb": {}, "pb": {}, "lg": {}}]
    assert "sanity_only" not in trainer.callback_metrics
    assert "sanity_only" not in trainer.progress_bar_metrics
    assert all("sanity_only" not in m for _, m in recorder.records)
    assert len([m for _, m in recorder.records if "val_loss" in m]) == 1  # only the real validation


def test_log_in_predict_raises_a_clear_error(make_trainer: Any) -> None:
    class M(Regressor):
        def predict_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("p", 1.0)
            return None

    with pytest.raises(RuntimeError, match=r"self.log\('p'\).*not supported in predict"):
        make_trainer().predict(M(), make_loader(2, 2))


def test_log_with_nothing_to_record_is_an_error(make_trainer: Any) -> None:
    class M(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("x", 1.0, on_step=False, on_epoch=False)
            return super().training_step(batch, batch_idx)

    with pytest.raises(ValueError, match="on_step and on_epoch are both False"):
        make_trainer(max_epochs=1).fit(M(), make_loader(2, 2))


def test_log_rejects_non_scalars_and_unknown_reductions(make_trainer: Any) -> None:
    class M(Regressor):
        def __init__(self, value: Any, reduce_fx: str = "mean") -> None:
            super().__init__()
            self.value, self.reduce_fx = value, reduce_fx

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("v", self.value, reduce_fx=self.reduce_fx)

    with pytest.raises(ValueError, match=r"needs a scalar.*shape \(2,\)"):
        make_trainer().validate(M(torch.ones(2)), make_loader(2, 2))
    with pytest.raises(ValueError, match="reduce_fx must be one of"):
        make_trainer().validate(M(1.0, "median"), make_loader(2, 2))


def test_metric_sums_accumulate_in_place_and_widen_on_mixed_dtypes() -> None:
    store = MetricStore(lambda t, op: t)
    kwargs: dict[str, Any] = dict(on_step=False, on_epoch=True, prog_bar=True, sync_dist=False)
    store.log("s", torch.tensor(1.5, dtype=torch.bfloat16), reduce_fx="sum", batch_size=lambda: 1, **kwargs)
    store.log("s", torch.tensor(0.25, dtype=torch.float64), reduce_fx="sum", batch_size=lambda: 1, **kwargs)
    store.log("m", torch.tensor(2.0), reduce_fx="mean", batch_size=lambda: 3, **kwargs)
    store.log("m", torch.tensor(4.0), reduce_fx="mean", batch_size=lambda: 1, **kwargs)
    first = store.epoch_values()
    assert first["s"].dtype == torch.float64 and float(first["s"]) == 1.75
    assert float(first["m"]) == pytest.approx(2.5)
    assert store.prog_bar_keys() == {"s", "m"}
    store.log("s", torch.tensor(1.0, dtype=torch.float64), reduce_fx="sum", batch_size=lambda: 1, **kwargs)
    assert float(first["s"]) == 1.75  # an epoch value handed out is not changed by later logging
