"""When validation runs and how many batches each stage uses: val_check_interval,
check_val_every_n_epoch, limit_*_batches, num_sanity_val_steps and fast_dev_run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from callbacks.base import Callback
from tests.helpers.regression import Regressor, make_loader
from trainer import Trainer


class Counter(Callback):
    """Records each validation run as (sanity?, epoch, training batches done, validation batches)."""

    def __init__(self) -> None:
        self.runs: list[tuple[bool, int, int, int]] = []
        self.train_batches: list[tuple[int, int]] = []
        self.test_batches = 0
        self.predict_batches = 0

    def on_validation_start(self, trainer: Trainer, module: Any) -> None:
        self.runs.append((trainer.sanity_checking, trainer.current_epoch, trainer.progress.batch_in_epoch, 0))

    def on_validation_batch_end(self, trainer: Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        sanity, epoch, at, n = self.runs[-1]
        self.runs[-1] = (sanity, epoch, at, n + 1)

    def on_train_batch_end(self, trainer: Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.train_batches.append((trainer.current_epoch, batch_idx))

    def on_test_batch_end(self, trainer: Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.test_batches += 1

    def on_predict_batch_end(self, trainer: Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.predict_batches += 1

    def real_runs(self) -> list[tuple[int, int, int]]:
        return [(epoch, at, n) for sanity, epoch, at, n in self.runs if not sanity]


def fit(make_trainer: Any, train_batches: int = 10, val_batches: int = 3, **kwargs: Any) -> Counter:
    counter = Counter()
    trainer = make_trainer(callbacks=[counter], **kwargs)
    trainer.fit(Regressor(), make_loader(train_batches * 2, 2), make_loader(val_batches * 2, 2))
    return counter


@pytest.mark.parametrize(
    ("interval", "at"),
    [
        pytest.param(None, [10], id="default-epoch-end"),
        pytest.param(0.5, [5, 10], id="half"),
        pytest.param(0.25, [2, 4, 6, 8, 10], id="quarter-plus-epoch-end"),
        pytest.param(1.0, [10], id="one"),
        pytest.param(4, [4, 8], id="every-4-batches-no-extra-run-at-the-epoch-end"),  # Lightning's rule
        pytest.param(5, [5, 10], id="every-5-batches"),
    ],
)
def test_val_check_interval(make_trainer: Any, interval: Any, at: list[int]) -> None:
    counter = fit(make_trainer, max_epochs=2, val_check_interval=interval)
    assert counter.real_runs() == [(epoch, b, 3) for epoch in (0, 1) for b in at]


def test_check_val_every_n_epoch(make_trainer: Any) -> None:
    counter = fit(make_trainer, train_batches=2, max_epochs=5, check_val_every_n_epoch=2)
    assert [epoch for epoch, _, _ in counter.real_runs()] == [1, 3]


@pytest.mark.parametrize(("limit", "train", "val"), [(3, 3, 3), (0.5, 5, 2), (1.0, 10, 5)])
def test_limit_batches(make_trainer: Any, limit: Any, train: int, val: int) -> None:
    counter = fit(make_trainer, val_batches=5, max_epochs=1, limit_train_batches=limit, limit_val_batches=limit)
    assert counter.train_batches == [(0, i) for i in range(train)]
    assert counter.real_runs() == [(0, train, val)]


def test_limit_val_batches_zero_disables_validation(make_trainer: Any) -> None:
    counter = fit(make_trainer, max_epochs=1, limit_val_batches=0, num_sanity_val_steps=2)
    assert counter.runs == []
    assert len(counter.train_batches) == 10


def test_limit_train_batches_zero_trains_nothing(make_trainer: Any) -> None:
    module = Regressor()
    trainer = make_trainer(max_epochs=2, limit_train_batches=0.0, callbacks=[Counter()])
    trainer.fit(module, make_loader(4, 2))
    assert trainer.global_step == 0


@pytest.mark.parametrize(("steps", "expected"), [(0, []), (2, [2]), (-1, [5])])
def test_num_sanity_val_steps(make_trainer: Any, steps: int, expected: list[int]) -> None:
    counter = fit(make_trainer, val_batches=5, max_epochs=1, num_sanity_val_steps=steps)
    assert [n for sanity, _, _, n in counter.runs if sanity] == expected
    assert counter.real_runs() == [(0, 10, 5)]


def test_sanity_check_respects_limit_val_batches(make_trainer: Any) -> None:
    counter = fit(make_trainer, val_batches=5, max_epochs=1, num_sanity_val_steps=-1, limit_val_batches=3)
    assert [n for sanity, _, _, n in counter.runs if sanity] == [3]


@pytest.mark.parametrize(("flag", "n"), [(True, 1), (3, 3)])
def test_fast_dev_run(tmp_path: Path, flag: Any, n: int) -> None:
    counter = Counter()
    root = tmp_path / "root"
    with pytest.warns(UserWarning, match="fast_dev_run: leaving out TensorBoardLogger$"):
        trainer = Trainer(fast_dev_run=flag, default_root_dir=root, callbacks=[counter], enable_progress_bar=False)
    assert trainer.max_epochs == 1
    module = Regressor()
    trainer.fit(module, make_loader(20, 2), make_loader(20, 2))
    assert counter.train_batches == [(0, i) for i in range(n)]
    assert counter.runs == [(False, 0, n, n)]  # no sanity check, one validation of n batches
    assert trainer.global_step == n
    trainer.test(module, make_loader(20, 2))
    trainer.predict(module, make_loader(20, 2))
    assert (counter.test_batches, counter.predict_batches) == (n, n)
    assert not root.exists() or not any(root.iterdir())  # no logs, no checkpoints


def test_fast_dev_run_stops_after_n_steps_even_with_a_longer_epoch_limit(tmp_path: Path) -> None:
    with pytest.warns(UserWarning):
        trainer = Trainer(fast_dev_run=2, max_epochs=10, default_root_dir=tmp_path, enable_progress_bar=False)
    trainer.fit(Regressor(), make_loader(20, 2))
    assert (trainer.global_step, trainer.current_epoch) == (2, 1)  # finished epochs, as Lightning counts


def test_fast_dev_run_keeps_checkpointing_and_early_stopping_doing_nothing(tmp_path: Path) -> None:
    """As Lightning: they stay the trainer's callbacks; no checkpoint is written, no stopping is checked
    (the monitored name is never logged, which would otherwise raise)."""
    from callbacks import EarlyStopping, ModelCheckpoint

    checkpoint, stopping = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val_loss"), EarlyStopping("missing")
    trainer = Trainer(fast_dev_run=2, default_root_dir=tmp_path, callbacks=[checkpoint, stopping], logger=False)
    trainer.fit(Regressor(), make_loader(20, 2), make_loader(20, 2))
    assert trainer.checkpoint_callback is checkpoint and trainer.early_stopping_callback is stopping
    assert trainer.global_step == 2 and not (tmp_path / "ckpt").exists()
    assert (trainer.val_check_interval, trainer.check_val_every_n_epoch, trainer.max_steps) == (1.0, 1, 2)


@pytest.mark.parametrize(("interval", "every"), [(None, 10), (0.25, 2), (3, 3)])
def test_val_check_interval_reads_as_lightnings_and_val_check_batch(
    make_trainer: Any, interval: Any, every: int
) -> None:
    trainer = make_trainer(max_epochs=1, val_check_interval=interval)
    assert trainer.val_check_interval == (1.0 if interval is None else interval)  # Lightning's default: 1.0
    assert trainer.val_check_batch is None  # until fit prepares its loader
    trainer.fit(Regressor(), make_loader(20, 2), make_loader(4, 2))
    assert trainer.val_check_batch == every


def test_a_fraction_without_epoch_gating_is_refused_in_lightnings_words(make_trainer: Any) -> None:
    from trainer.common.errors import MisconfigurationException

    with pytest.raises(MisconfigurationException, match="`val_check_interval` should be an integer or a time-based"):
        make_trainer(val_check_interval=0.5, check_val_every_n_epoch=None)
