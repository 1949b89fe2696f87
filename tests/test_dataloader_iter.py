"""Lightning's ``step(self, dataloader_iter)``: the step fetches its own batches (trainer/loops/dataloader_iter.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.nn import functional as F

from callbacks import Callback
from tests.helpers.regression import Regressor, assert_same_weights, make_loader
from trainer import Trainer, TrainModule
from trainer.common.errors import MisconfigurationException


class OneAtATime(Regressor):
    """The plain regressor, written with ``dataloader_iter``: one batch per step, hooks' arguments recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.hook_args: list[tuple[str, Any, int]] = []
        self.val_fetched: list[tuple[int, int]] = []

    def training_step(self, dataloader_iter: Any) -> Any:  # type: ignore[override]
        (x, y), _, _ = next(dataloader_iter)
        self.log("loss", F.mse_loss(self(x), y), batch_size=len(x))
        return F.mse_loss(self(x), y)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.hook_args.append(("start", None if batch is None else len(batch[0]), batch_idx))

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.hook_args.append(("end", len(batch[0]), batch_idx))

    def validation_step(self, dataloader_iter: Any) -> None:  # type: ignore[override]
        (x, y), batch_idx, dataloader_idx = next(dataloader_iter)
        self.val_fetched.append((batch_idx, dataloader_idx))
        self.log("val_loss", F.mse_loss(self(x), y))  # the batch's size is known once fetched


def test_one_batch_per_step_trains_as_the_plain_step(make_trainer: Any) -> None:
    """Same weights bit for bit as ``training_step(batch, batch_idx)``; hooks get the last fetched batch."""
    plain, fetching = Regressor(), OneAtATime()
    make_trainer(max_epochs=2).fit(plain, make_loader(10, 4), make_loader(6, 2))
    trainer = make_trainer(max_epochs=2)
    trainer.fit(fetching, make_loader(10, 4), make_loader(6, 2))
    assert_same_weights(plain, fetching)
    assert trainer.global_step == 6 and "loss" in trainer.callback_metrics
    # before the step: the previous batch (None before the epoch's first); after it: the one fetched
    epoch = [("start", None, 0), ("end", 4, 0), ("start", 4, 0), ("end", 4, 1), ("start", 4, 1), ("end", 2, 2)]
    assert fetching.hook_args == epoch + epoch
    assert fetching.val_fetched == [(0, 0), (1, 0), (2, 0)] * 2
    assert "val_loss" in trainer.callback_metrics


class TwoPerStep(TrainModule):
    """Fetches two batches per step; counts steps, fetches and ``StopIteration`` seen, per stage."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.record: dict[str, list[int]] = {}

    def _step(self, dataloader_iter: Any, stage: str) -> Any:
        counts = self.record.setdefault(stage, [0, 0, 0])  # entered, fetched, raised
        counts[0] += 1
        out = None
        for _ in range(2):
            try:
                (x, _), _, _ = next(dataloader_iter)
            except StopIteration:
                counts[2] += 1
                return None
            counts[1] += 1
            out = self.layer(x).sum()
        return out

    def training_step(self, dataloader_iter: Any) -> Any:  # type: ignore[override]
        return self._step(dataloader_iter, "train")

    def validation_step(self, dataloader_iter: Any) -> Any:  # type: ignore[override]
        return self._step(dataloader_iter, "sanity" if self.trainer.sanity_checking else "validate")

    def test_step(self, dataloader_iter: Any) -> Any:  # type: ignore[override]
        return self._step(dataloader_iter, "test")

    def predict_step(self, dataloader_iter: Any) -> Any:  # type: ignore[override]
        return self._step(dataloader_iter, "predict")

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("limit", [None, 4, 0])
def test_steps_run_until_the_limited_data_is_fetched(make_trainer: Any, limit: int | None) -> None:
    """The loop calls the step until its (limited) data is used up: 8 batches make 4 steps of 2, each stage."""
    data = make_loader(16, 2)
    limits = {f"limit_{s}_batches": limit for s in ("train", "val", "test", "predict")}
    model = TwoPerStep()
    trainer = make_trainer(max_epochs=1, num_sanity_val_steps=2, **limits)
    trainer.fit(model, data, data)
    model.record.pop("sanity", None)
    trainer.test(model, data, verbose=False)
    predictions = trainer.predict(model, data)
    n = 8 if limit is None else limit
    expected = [n // 2, n, 0] if n else None
    for stage in ("train", "validate", "test", "predict"):
        assert model.record.get(stage) == expected, stage
    if n == 0:  # as Lightning: a stage limited to no batch runs no loop, and predict returns None
        assert predictions is None
    else:
        assert predictions is not None and len(predictions) == n // 2


class StopsItself(Regressor):
    """Ends the epoch by letting ``StopIteration`` out after its second step."""

    steps = 0

    def training_step(self, dataloader_iter: Any) -> Any:  # type: ignore[override]
        self.steps += 1
        if self.steps == 3:
            raise StopIteration
        (x, y), _, _ = next(dataloader_iter)
        return F.mse_loss(self(x), y)


def test_stop_iteration_from_the_step_ends_the_epoch(make_trainer: Any) -> None:
    model = StopsItself()
    trainer = make_trainer(max_epochs=1)
    trainer.fit(model, make_loader(12, 2))
    assert (model.steps, trainer.global_step) == (3, 2)


class LogsWithoutSize(Regressor):
    def training_step(self, dataloader_iter: Any) -> Any:  # type: ignore[override]
        (x, y), _, _ = next(dataloader_iter)
        loss = F.mse_loss(self(x), y)
        self.log("loss", loss)
        return loss


def test_log_in_a_fetching_training_step_needs_batch_size(make_trainer: Any) -> None:
    with pytest.raises(MisconfigurationException, match=r"self\.log\(\.\.\., batch_size=\.\.\.\)"):
        make_trainer(max_epochs=1).fit(LogsWithoutSize(), make_loader(4, 2))


def test_accumulation_is_refused(make_trainer: Any) -> None:
    with pytest.raises(ValueError, match="accumulate_grad_batches=2 and micro_batch_size are not supported"):
        make_trainer(max_epochs=1, accumulate_grad_batches=2).fit(OneAtATime(), make_loader(8, 2))


class StopAfter(Callback):
    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, *args: Any) -> None:
        if trainer.global_step == 2:
            trainer.should_stop = True


def test_a_mid_epoch_checkpoint_is_not_resumed(make_trainer: Any, tmp_path: Any) -> None:
    """How far a step fetched ahead is its own state: resuming inside an epoch is refused, by name."""
    trainer = make_trainer(max_epochs=1, callbacks=[StopAfter()])
    trainer.fit(OneAtATime(), make_loader(12, 2))
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    with pytest.raises(ValueError, match="cannot be resumed exactly: resume from one saved at an epoch's end"):
        make_trainer(max_epochs=1).fit(OneAtATime(), make_loader(12, 2), ckpt_path=tmp_path / "mid.ckpt")
    trainer = make_trainer(max_epochs=1)
    trainer.fit(OneAtATime(), make_loader(12, 2))
    trainer.save_checkpoint(tmp_path / "end.ckpt")
    resumed = make_trainer(max_epochs=2)
    resumed.fit(OneAtATime(), make_loader(12, 2), ckpt_path=tmp_path / "end.ckpt")
    assert resumed.global_step == 12
