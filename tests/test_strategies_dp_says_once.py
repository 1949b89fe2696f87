"""DataParallel without two GPUs says once that it trains on one device, however many stages run."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from strategies import DataParallelStrategy
from tests.helpers.regression import Regressor, make_loader
from tests.helpers.trainers import quiet_trainer


def test_one_device_is_said_once_over_fit_and_test(tmp_path: Path) -> None:
    strategy = DataParallelStrategy()
    if len(strategy.device_ids) >= 2:
        pytest.skip("two or more GPUs: DataParallel replicates, so there is nothing to say")
    trainer = quiet_trainer(tmp_path, strategy=strategy, max_epochs=1)
    module = Regressor()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's own rule: each warning once per place...
        trainer.fit(module, make_loader(), make_loader())
        warnings.simplefilter("default")  # ... which a library changing the filters resets
        trainer.test(module, make_loader())
    said = [w for w in caught if "DataParallelStrategy" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in said]
