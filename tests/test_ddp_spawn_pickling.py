"""``ddp_spawn`` pickles the trainer into its processes: every logger and callback of ours must survive that.

A logger already used before ``fit`` (``logger.log_hyperparams(...)``, as the lightning-hydra-template
does) holds open writers and locks; pickling it must still work (the copy reopens what it needs), or
``strategy="ddp_spawn"`` fails where Lightning's works. (``strategy="ddp"`` pickles nothing.)
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import callbacks as cbs


def _used_loggers(root: Path) -> list[cbs.Callback]:
    loggers: list[cbs.Callback] = [cbs.TensorBoardLogger(str(root / "tb")), cbs.CSVLogger(str(root / "csv"))]
    for logger in loggers:
        logger.log_hyperparams({"lr": 0.1, "layers": 2})  # type: ignore[attr-defined]
        logger.log_metrics({"train/loss": 1.0}, 0)  # type: ignore[attr-defined]
    return loggers


@pytest.mark.parametrize("kind", ["TensorBoardLogger", "CSVLogger"])
def test_a_logger_used_before_fit_survives_pickling(tmp_path: Path, kind: str) -> None:
    logger = next(lg for lg in _used_loggers(tmp_path) if type(lg).__name__ == kind)
    copy = pickle.loads(pickle.dumps(logger))
    assert type(copy) is type(logger) and copy.log_dir == logger.log_dir  # type: ignore[attr-defined]


def test_every_callback_of_ours_survives_pickling(tmp_path: Path) -> None:
    needs = {
        "GradientAccumulationScheduler": ({0: 2},),
        "OnExceptionCheckpoint": (str(tmp_path),),
        "StochasticWeightAveraging": (0.01,),
        "ModelPruning": ("l1_unstructured",),
        "TensorBoardLogger": (str(tmp_path / "tb2"),),
        "CSVLogger": (str(tmp_path / "csv2"),),
    }
    # Abstract, retired (NeptuneLogger raises when built, as Lightning's), or a tracker's (pickled after use in tests/test_loggers_*.py, with a tracker
    # or a fake of its client package).
    unsupported = {"NeptuneLogger", "Logger", "MLFlowLogger", "WandbLogger", "CometLogger", "LitLogger"}
    names = [n for n in dir(cbs) if isinstance(getattr(cbs, n), type) and issubclass(getattr(cbs, n), cbs.Callback)]
    built = [getattr(cbs, n)(*needs.get(n, ())) for n in names if n not in unsupported and n != "Callback"]
    assert len(built) > 15
    for callback in built:
        pickle.loads(pickle.dumps(callback))


@pytest.mark.parametrize("name", ["EarlyStopping", "ModelCheckpoint"])
def test_a_pickled_monitoring_callback_equals_the_original_attribute_by_attribute(name: str) -> None:
    callback = getattr(cbs, name)(monitor="foo")
    assert vars(pickle.loads(pickle.dumps(callback))) == vars(callback)  # as Lightning's test_pickling asks
