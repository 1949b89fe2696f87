"""DataParallel's replicas log through ``TrainModule.log``'s public signature, merged once per step.

Two replicas are run by hand on the CPU (``nn.DataParallel`` needs two GPUs): each call of the
strategy's replica runner stands for one GPU's thread.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from strategies.dp import DataParallelStrategy, _ReplicaRunner
from trainer import TrainModule

_KEYS = ("on_step", "on_epoch", "prog_bar", "sync_dist", "reduce_fx", "batch_size")


class _TrainerLog:
    """The part of the Trainer that ``TrainModule.log`` calls, recording what reaches it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, dict[str, object]]] = []
        self._plain_log: dict[str, Any] = {}  # no shortcut: every call reaches _log
        self.barebones = False

    def _log(self, name: str, value: Any, *args: object) -> None:
        self.calls.append((name, float(value), dict(zip(_KEYS, args))))


class _Logs(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        value = batch.sum()
        self.log_dict({"a": value, "b": float(len(batch))}, prog_bar=True)
        self.log("c", value, on_step=False, on_epoch=True, reduce_fx="max", batch_size=5, sync_dist=True)
        if batch_idx < 0:
            raise RuntimeError("asked to fail")
        return self.layer(batch).sum()


@pytest.fixture
def two_replicas(monkeypatch: pytest.MonkeyPatch) -> tuple[DataParallelStrategy, _Logs, _TrainerLog]:
    monkeypatch.setattr(DataParallelStrategy, "device_ids", property(lambda self: [0, 1]))
    strategy, module, trainer = DataParallelStrategy(), _Logs(), _TrainerLog()
    module._trainer = trainer  # type: ignore[assignment]
    strategy.module = module
    return strategy, module, trainer


def test_replica_logs_keep_their_options_and_reach_the_module_log_once(
    two_replicas: tuple[DataParallelStrategy, _Logs, _TrainerLog],
) -> None:
    strategy, module, trainer = two_replicas
    runner = _ReplicaRunner(module, strategy)
    runner("training_step", torch.ones(3, 2), 0)  # replica 0: three samples, sum 6
    runner("training_step", torch.zeros(1, 2), 0)  # replica 1: one sample, sum 0
    assert trainer.calls == [] and "log" not in vars(module)  # recorded, and the shadow removed
    strategy._log_replica_values()
    calls = {name: (value, options) for name, value, options in trainer.calls}
    assert len(trainer.calls) == 3
    assert calls["a"][0] == pytest.approx((3 * 6 + 1 * 0) / 4)  # weighted by the replicas' batch shares
    assert calls["b"][0] == pytest.approx((3 * 3 + 1 * 1) / 4)
    assert calls["a"][1] == dict(
        on_step=None, on_epoch=None, prog_bar=True, sync_dist=False, reduce_fx="mean", batch_size=None
    )
    assert calls["c"][1] == dict(
        on_step=False, on_epoch=True, prog_bar=False, sync_dist=True, reduce_fx="max", batch_size=5
    )
    strategy._log_replica_values()
    assert len(trainer.calls) == 3  # the records were consumed


def test_the_shadowing_log_is_removed_when_the_step_raises(
    two_replicas: tuple[DataParallelStrategy, _Logs, _TrainerLog],
) -> None:
    strategy, module, _ = two_replicas
    with pytest.raises(RuntimeError, match="asked to fail"):
        _ReplicaRunner(module, strategy)("training_step", torch.ones(2, 2), -1)
    assert "log" not in vars(module) and module.log.__func__ is TrainModule.log  # type: ignore[attr-defined]


def test_a_metric_logged_in_a_replica_is_refused(
    two_replicas: tuple[DataParallelStrategy, _Logs, _TrainerLog],
) -> None:
    class Metric:
        def compute(self) -> torch.Tensor:
            return torch.zeros(())

        def reset(self) -> None:
            pass

    strategy, module, _ = two_replicas

    def step(batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        module.log("acc", Metric())
        return batch.sum()

    module.training_step = step  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="DataParallel replica"):
        _ReplicaRunner(module, strategy)("training_step", torch.ones(2, 2), 0)
