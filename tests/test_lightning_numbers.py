"""Same numbers as Lightning 2.6: random state, validation schedule and logging behave as Lightning's.

The expected schedules and messages were read off pytorch-lightning 2.6.6 running the same options;
random draws are compared with a loop written out by hand, which draws them in Lightning's order.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback, ModelCheckpoint
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule, seed_everything
from trainer.errors import MisconfigurationException, PossibleUserWarning


class Recorder(TrainModule):
    """Notes ``(epoch, batch index)`` at the start of every validation run."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(2, 1)
        self.validations: list[tuple[int, int]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.batch_idx = batch_idx
        return self.l(batch[0]).sum()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0 and not self.trainer.sanity_checking:
            self.validations.append((self.current_epoch, self.batch_idx))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loaders(n: int) -> tuple[DataLoader[Any], DataLoader[Any]]:
    return DataLoader(TensorDataset(torch.ones(n, 2))), DataLoader(TensorDataset(torch.ones(2, 2)))


# (training batches, Trainer options, (epoch, batch_idx) of every validation): Lightning 2.6.6's.
SCHEDULES = [
    (10, {"val_check_interval": 1 / 3}, [(0, 2), (0, 5), (0, 8), (1, 2), (1, 5), (1, 8)]),
    (9, {"val_check_interval": 1 / 3}, [(0, 2), (0, 5), (0, 8), (1, 2), (1, 5), (1, 8)]),
    (
        10,
        {"val_check_interval": 0.25},
        [(0, 1), (0, 3), (0, 5), (0, 7), (0, 9), (1, 1), (1, 3), (1, 5), (1, 7), (1, 9)],
    ),
    (10, {"val_check_interval": 4}, [(0, 3), (0, 7), (1, 3), (1, 7)]),
    (10, {"val_check_interval": 4, "check_val_every_n_epoch": None}, [(0, 3), (0, 7), (1, 1), (1, 5), (1, 9)]),
    (10, {"val_check_interval": 12, "check_val_every_n_epoch": None}, [(1, 1)]),
    (4, {"check_val_every_n_epoch": 2}, [(1, 3)]),
]


@pytest.mark.parametrize(("n", "options", "expected"), SCHEDULES)
def test_validation_runs_when_lightning_runs_it(n: int, options: dict[str, Any], expected: list[Any]) -> None:
    module = Recorder()
    quiet_trainer(max_epochs=2, **options).fit(module, *_loaders(n))
    assert module.validations == expected


def test_an_int_interval_longer_than_the_epoch_is_refused_as_lightning_refuses_it() -> None:
    with pytest.raises(ValueError, match=r"val_check_interval=12\) must be at most .* \(10\).*check_val_every_n_epoch"):
        quiet_trainer(max_epochs=1, val_check_interval=12).fit(Recorder(), *_loaders(10))
    # no validation at all: nothing to refuse (Lightning's rule too)
    quiet_trainer(max_epochs=1, val_check_interval=12, limit_val_batches=0).fit(Recorder(), *_loaders(10))


# ----------------------------------------------------------------------------- random state
class Noisy(TrainModule):
    """Validation draws from the global generator (as dropout left on, or augmentation, would)."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return (self.l(x + torch.randn_like(x)) ** 2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("noise", torch.rand(()))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _hand_written(epochs: int, batches: int, val_every: int, val_batches: int) -> nn.Linear:
    """The same run by hand: validation's draws are not put back (only the sanity check's are)."""
    seed_everything(3)
    module = Noisy()
    data = torch.arange(batches * 4, dtype=torch.float32).reshape(batches, 1, 4) / 10
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    state = torch.get_rng_state()
    torch.empty((), dtype=torch.int64).random_()  # the sanity check, then the random state put back
    for _ in range(val_batches):
        torch.rand(())
    torch.set_rng_state(state)
    for _ in range(epochs):
        torch.empty((), dtype=torch.int64).random_()  # the loader's iterator draws its workers' seed
        seed = int(torch.empty((), dtype=torch.int64).random_().item())  # RandomSampler its own
        order = torch.randperm(batches, generator=torch.Generator().manual_seed(seed)).tolist()
        for i, j in enumerate(order):
            x = data[j]
            (module.l(x + torch.randn_like(x)) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
            if (i + 1) % val_every == 0:
                torch.empty((), dtype=torch.int64).random_()  # the validation loader's iterator seed
                for _ in range(val_batches):
                    torch.rand(())
    return module.l


def test_validation_draws_from_the_run_and_only_the_sanity_check_is_isolated() -> None:
    seed_everything(3)
    module = Noisy()
    data = torch.arange(6 * 4, dtype=torch.float32).reshape(6, 4) / 10
    train = DataLoader(TensorDataset(data), batch_size=1, shuffle=True)
    val = DataLoader(TensorDataset(torch.zeros(2, 4)), batch_size=1)
    quiet_trainer(max_epochs=3, val_check_interval=3, num_sanity_val_steps=2).fit(module, train, val)
    expected = _hand_written(epochs=3, batches=6, val_every=3, val_batches=2)
    assert torch.equal(module.l.weight, expected.weight)
    assert torch.equal(module.l.bias, expected.bias)


# ----------------------------------------------------------------------------- logging
class Logs(TrainModule):
    def __init__(self, reduce_fx: Any = "mean") -> None:
        super().__init__()
        self.l = nn.Linear(1, 1)
        self.reduce_fx = reduce_fx

    def on_train_start(self) -> None:
        self.log("started", 5.0)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        self.log("v", x.sum(), on_step=False, on_epoch=True, reduce_fx=self.reduce_fx, prog_bar=True)
        return self.l(x).sum()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_step", batch[0].sum(), on_step=True, on_epoch=False)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _fit_logs(reduce_fx: Any) -> Trainer:
    trainer = quiet_trainer(max_epochs=1)
    data = TensorDataset(torch.tensor([[1.0], [4.0], [2.0]]))
    trainer.fit(Logs(reduce_fx), DataLoader(data), DataLoader(data))
    return trainer


@pytest.mark.parametrize(
    ("reduce_fx", "expected"),
    [(max, 4.0), (min, 1.0), (sum, 7.0), ("MAX", 4.0), ("avg", 7 / 3), ("Mean", 7 / 3), (torch.min, 1.0)],
)
def test_reduce_fx_takes_what_lightning_takes(reduce_fx: Any, expected: float) -> None:
    trainer = _fit_logs(reduce_fx)
    assert math.isclose(float(trainer.callback_metrics["v"]), expected, rel_tol=1e-6)


def test_reduce_fx_refuses_others_naming_them() -> None:
    with pytest.raises(ValueError, match=r"reduce_fx must be one of 'mean', 'sum', 'max', 'min'.*got 'median'"):
        _fit_logs("median")


def test_log_in_on_train_start_counts_for_the_first_epoch() -> None:
    assert float(_fit_logs("mean").callback_metrics["started"]) == 5.0


def test_progress_bar_metrics_are_floats() -> None:
    metrics = _fit_logs("mean").progress_bar_metrics
    assert metrics and all(type(v) is float for v in metrics.values())


def test_validation_step_values_reach_logged_metrics() -> None:
    assert "val_step" in _fit_logs("mean").logged_metrics


@pytest.mark.parametrize(
    "hook",
    ["on_validation_end", "on_train_end", "on_fit_start", "setup", "on_sanity_check_start", "on_save_checkpoint"],
)
def test_log_is_refused_where_lightning_refuses_it(hook: str, tmp_path: Path) -> None:
    class LogsThere(Callback):
        pass

    def log_there(self: Any, trainer: Trainer, module: TrainModule, *args: Any, **kwargs: Any) -> None:
        module.log("x", 1.0)

    setattr(LogsThere, hook, log_there)
    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[LogsThere(), ModelCheckpoint()], num_sanity_val_steps=1)
    data = TensorDataset(torch.tensor([[1.0]]))
    with pytest.raises(MisconfigurationException, match=rf"^You can't `self.log\(\)` inside `{hook}`.*self.log\('x'\)"):
        trainer.fit(Logs(), DataLoader(data), DataLoader(data))


@pytest.mark.parametrize(
    "hook",
    [
        "on_before_batch_transfer",
        "transfer_batch_to_device",
        "on_after_batch_transfer",
        "on_validation_model_eval",
        "on_validation_model_train",
        "configure_optimizers",
        "configure_callbacks",
        "lr_scheduler_step",
        "on_save_checkpoint",
    ],
)
def test_log_is_refused_in_the_modules_hooks_where_lightning_refuses_it(hook: str, tmp_path: Path) -> None:
    class LogsThere(Logs):
        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.0)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}

    plain = getattr(LogsThere, hook)

    def log_there(self: Any, *args: Any) -> Any:
        out = plain(self, *args)
        self.log("x", 1.0)
        return out

    setattr(LogsThere, hook, log_there)
    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[ModelCheckpoint()])
    data = TensorDataset(torch.tensor([[1.0]]))
    with pytest.raises(MisconfigurationException, match=rf"^You can't `self.log\(\)` inside `{hook}`"):
        trainer.fit(LogsThere(), DataLoader(data), DataLoader(data))


class LogsPlainWithTransferHook(TrainModule):
    """Logs one plain tensor per step and overrides a batch-transfer hook (where Lightning refuses ``self.log``)."""

    def __init__(self, log_in_hook_at: int | None = None) -> None:
        super().__init__()
        self.l = nn.Linear(1, 1)
        self.log_in_hook_at = log_in_hook_at
        self.plans_seen: list[bool] = []

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self.log_in_hook_at is not None and self.trainer.global_step == self.log_in_hook_at:
            self.log("loss", torch.tensor(0.0))
        return batch

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.plans_seen.append("loss" in self.trainer._plain_log)  # the plan its first call worked out
        loss = self.l(batch[0]).sum()
        self.log("loss", loss.detach())
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_refused_hook_every_step_keeps_the_plain_log_plans(tmp_path: Path) -> None:
    module = LogsPlainWithTransferHook()
    quiet_trainer(tmp_path, max_epochs=1).fit(module, DataLoader(TensorDataset(torch.ones(4, 1))))
    assert module.plans_seen == [False, True, True, True]  # worked out once, not again after every transfer


def test_a_kept_plain_log_plan_does_not_get_past_the_refusal(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    with pytest.raises(MisconfigurationException, match=r"^You can't `self.log\(\)` inside `on_after_batch_transfer`"):
        trainer.fit(LogsPlainWithTransferHook(log_in_hook_at=2), DataLoader(TensorDataset(torch.ones(4, 1))))


def test_log_in_predict_is_refused_in_lightnings_predict_words() -> None:
    class LogsInPredict(Logs):
        def predict_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("x", 1.0)

    with pytest.raises(MisconfigurationException, match="the loop's result collection is not registered yet"):
        quiet_trainer().predict(LogsInPredict(), DataLoader(TensorDataset(torch.tensor([[1.0]]))))


# ----------------------------------------------------------------------------- messages
class _OneEpoch(TrainModule):
    """A one-weight model that stops fitting after its first epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return (self.w * batch[0]).sum()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("v", (self.w * batch[0]).sum())

    def on_train_epoch_end(self) -> None:
        self.trainer.should_stop = True

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_max_epochs_unset_warns_as_lightning_at_fit_and_means_1000() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Lightning says nothing when the Trainer is built, nor to validate
        trainer = Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False, limit_train_batches=1)
        trainer.validate(_OneEpoch(), DataLoader(TensorDataset(torch.ones(2, 1)), batch_size=2), verbose=False)
    assert trainer.max_epochs is None  # as Lightning's: unset until fit takes 1000
    fitted = Trainer(
        logger=False, enable_progress_bar=False, enable_checkpointing=False, max_steps=-1, limit_train_batches=1
    )
    with pytest.warns(PossibleUserWarning, match=r"`max_epochs` was not set. Setting it to 1000 epochs"):
        fitted.fit(_OneEpoch(), DataLoader(TensorDataset(torch.ones(2, 1)), batch_size=2))
    assert fitted.max_epochs == 1000


def test_max_epochs_or_max_steps_set_does_not_warn() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Trainer(max_steps=3, logger=False, enable_progress_bar=False, enable_checkpointing=False)
        Trainer(max_epochs=-1, logger=False, enable_progress_bar=False, enable_checkpointing=False)


def test_lightnings_info_lines_for_one_and_one_point_zero(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    quiet_trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1.0, val_check_interval=1)
    assert caplog.messages == [
        "`Trainer(limit_train_batches=1)` was configured so 1 batch per epoch will be used.",
        "`Trainer(limit_val_batches=1.0)` was configured so 100% of the batches will be used.",
        "`Trainer(val_check_interval=1)` was configured so validation will run after every batch.",
    ]


def test_callbacks_log_through_the_module_where_lightning_allows_it() -> None:
    """Lightning's ``Callback`` has no ``log``; ``pl_module.log`` from its hooks works as from the module's."""

    class Logs(Callback):
        def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
            pl_module.log("from_train_start", 2.0)

        def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
            pl_module.log("from_epoch_end", 3.0)

    trainer = quiet_trainer(max_epochs=1, callbacks=[Logs()])
    trainer.fit(Recorder(), *_loaders(2))
    assert not hasattr(Callback, "log")
    assert float(trainer.callback_metrics["from_train_start"]) == 2.0
    assert float(trainer.callback_metrics["from_epoch_end"]) == 3.0
