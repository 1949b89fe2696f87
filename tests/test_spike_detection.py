"""``SpikeDetection``: which losses are spikes, the file of batches to skip, and one decision over ranks."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import types
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import callbacks.spike
from callbacks import SpikeDetection
from callbacks.spike import TrainingSpikeException
from strategies import DDPStrategy
from tests.helpers.distributed import spawn
from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule

#: Losses 1, 1/2, 1/3, ... (each an improvement) with ``spike`` at batch 4.
N_BATCHES = 8


class ScriptedLoss(TrainModule):
    """Returns ``w * value`` with ``w`` a parameter equal to one: the loss is the scripted value."""

    def __init__(self, spike: float | None, spike_rank: int = 0) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))
        self.spike, self.spike_rank = spike, spike_rank

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        with torch.no_grad():
            self.w.fill_(1.0)
        value = 1.0 / (batch_idx + 1)
        if batch_idx == 4 and self.spike is not None and self.trainer.global_rank == self.spike_rank:
            value = self.spike
        return self.w * value

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def _data() -> list[torch.Tensor]:
    return [torch.zeros(1) for _ in range(N_BATCHES)]


def _fit(tmp_path: Path, spike: float | None, **kwargs: Any) -> SpikeDetection:
    detector = SpikeDetection(exclude_batches_path=tmp_path, **kwargs)
    quiet_trainer(tmp_path, [detector], max_epochs=1).fit(ScriptedLoss(spike), _data())
    return detector


@pytest.mark.parametrize("spike", [5.0, math.inf, math.nan])
def test_a_spike_stops_training_and_records_the_batch_and_the_one_before(tmp_path: Path, spike: float) -> None:
    with pytest.raises(TrainingSpikeException, match="Training spike detected in batch 4") as caught:
        _fit(tmp_path, spike)
    assert caught.value.batch_idx == 4
    assert json.loads((tmp_path / "skip_batches.json").read_text()) == [3, 4]


def test_improvements_and_small_rises_are_no_spikes(tmp_path: Path) -> None:
    detector = _fit(tmp_path, None)
    assert not (tmp_path / "skip_batches.json").exists()
    assert detector.last_val == pytest.approx(1 / N_BATCHES)
    # A rise (1/4 -> 1/3) by less than rtol * mean (mean of 1, 1/2, 1/3, 1/4: about 0.52) is no spike.
    _fit(tmp_path, 1.0 / 3, rtol=2.0)


def test_finite_only_false_lets_non_finite_losses_pass_without_entering_the_mean(tmp_path: Path) -> None:
    detector = _fit(tmp_path, math.nan, finite_only=False, window=N_BATCHES)
    assert not (tmp_path / "skip_batches.json").exists()
    assert detector.running_mean == pytest.approx(sum(1 / (i + 1) for i in range(N_BATCHES) if i != 4) / 7)


def test_atol_sets_the_smallest_spike(tmp_path: Path) -> None:
    _fit(tmp_path, 1.0, atol=10.0)  # 1.0 rises far above the mean, but by less than atol
    with pytest.raises(TrainingSpikeException):
        _fit(tmp_path, 20.0, atol=10.0)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="Has to be min or max, found high"):
        SpikeDetection(mode="high")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"window=0"):
        SpikeDetection(window=0)


def test_the_exception_is_fabrics_when_fabric_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    class FabricSpike(RuntimeError):
        pass

    fake = types.ModuleType("lightning_fabric.utilities.spike")
    fake.TrainingSpikeException = FabricSpike  # type: ignore[attr-defined]
    for name in ("lightning_fabric", "lightning_fabric.utilities"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    spec = importlib.util.spec_from_file_location("spike_with_fabric", callbacks.spike.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert issubclass(module.TrainingSpikeException, FabricSpike)
    assert not issubclass(TrainingSpikeException, FabricSpike)


def rank_job(root: str, spike_rank: int) -> dict[str, Any]:
    detector = SpikeDetection(exclude_batches_path=root)
    ddp = DDPStrategy(devices=2, device="cpu", timeout=timedelta(seconds=60))
    trainer = quiet_trainer(root, [detector], strategy=ddp, max_epochs=1, use_distributed_sampler=False)
    try:
        trainer.fit(ScriptedLoss(5.0, spike_rank), _data())
    except TrainingSpikeException as exc:
        return {"stopped_at": exc.batch_idx, "bad": detector.bad_batches}
    return {"stopped_at": None}


def test_under_ddp_a_spike_on_one_rank_stops_every_rank(tmp_path: Path) -> None:
    ranks = spawn(rank_job, str(tmp_path), 1, world_size=2)
    assert ranks == [{"stopped_at": 4, "bad": [3, 4]}] * 2
    assert json.loads((tmp_path / "skip_batches.json").read_text()) == [3, 4]  # written by rank 0
