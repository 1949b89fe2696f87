"""A user's sampler or batch sampler under DDP is kept and sharded, as Lightning's DistributedSamplerWrapper.

Also: after a DDP fit that started its own processes, the caller's trainer works on as after a
one-process fit (save_checkpoint, test with ckpt_path, predict).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from strategies import DDPStrategy
from strategies.sampling import ShardedBatchSampler, ShardedSampler
from tests.helpers import sampler_jobs
from tests.helpers.distributed import run_python, spawn
from tests.helpers.jobs import dataset
from tests.helpers.trainers import quiet_trainer

SCRIPT = str(Path(__file__).parent / "helpers" / "after_ddp_script.py")


def test_sharded_sampler_splits_what_the_sampler_yields() -> None:
    order = list(sampler_jobs.subset_sampler())
    shards = [list(ShardedSampler(sampler_jobs.subset_sampler(), rank, 3)) for rank in range(3)]
    assert [len(s) for s in shards] == [3, 3, 3]  # 8 padded to 9 by repeating the start
    assert sorted(i for s in shards for i in s) == sorted(order + order[:1])
    assert [list(ShardedSampler(order, r, 3, pad=False)) for r in range(3)] == [order[r::3] for r in range(3)]
    assert [len(ShardedSampler(order, r, 3, drop_last=True)) for r in range(3)] == [2, 2, 2]
    batches = [list(ShardedBatchSampler(sampler_jobs.BATCHES, r, 2, pad=False)) for r in range(2)]
    assert batches == [sampler_jobs.BATCHES[0::2], sampler_jobs.BATCHES[1::2]]
    assert len(ShardedBatchSampler(sampler_jobs.BATCHES, 1, 2)) == 3  # padded: both ranks take 3 steps


def test_process_dataloader_keeps_a_user_sampler_and_the_default_path() -> None:
    strategy = DDPStrategy(devices=2, device="cpu")  # a planned world of 2; this process is rank 0
    user = strategy.process_dataloader(
        DataLoader(sampler_jobs.Indices(), batch_size=2, sampler=sampler_jobs.subset_sampler()), train=True
    )
    assert isinstance(user, DataLoader) and isinstance(user.sampler, ShardedSampler)
    assert set(user.sampler) <= set(sampler_jobs.SUBSET)  # never an index outside the user's subset
    plain = strategy.process_dataloader(DataLoader(sampler_jobs.Indices(), batch_size=2, shuffle=True), train=True)
    # The default path: a DistributedSampler (geartrain's GlobalBatchSampler, one since issue #18), not the wrapper.
    assert isinstance(plain.sampler, DistributedSampler) and not isinstance(plain.sampler, ShardedSampler)  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ddp_ranks_share_exactly_what_the_user_sampler_yields(tmp_path: Path) -> None:
    ranks = spawn(sampler_jobs.sampler_job, str(tmp_path), world_size=2)
    # A SubsetRandomSampler over 8 of 32 samples: the ranks split its 8 indices, none twice, none outside.
    first, second = (r["sampler"] for r in ranks)
    assert sorted(first + second) == sorted(sampler_jobs.SUBSET) and not set(first) & set(second)
    # The interleaved order: together, step i's two half batches are the batch one process takes.
    order = list(sampler_jobs.subset_sampler())
    assert first == order[0::2] and second == order[1::2]
    # A batch sampler of the user's: whole batches split over the ranks (padded so both take 3 steps).
    seen = [set(r["batch_sampler"]) for r in ranks]
    assert seen[0] | seen[1] == {i for batch in sampler_jobs.BATCHES for i in batch}
    # use_distributed_sampler=False: the loader is left alone, each rank reads the whole subset.
    assert all(sorted(r["untouched"]) == sampler_jobs.SUBSET for r in ranks)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_caller_trainer_works_after_a_ddp_fit_that_started_its_processes(tmp_path: Path) -> None:
    result = run_python([SCRIPT, "--root", str(tmp_path)], timeout=280)
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads((tmp_path / "report.json").read_text())
    assert report["global_step"] == 4 and report["predict_batches"] == 1  # rank 0's share of 2 batches
    ckpt = torch.load(tmp_path / "after.ckpt", weights_only=True)
    weights = torch.load(tmp_path / "weights.pt", weights_only=True)
    assert all(torch.equal(ckpt["state_dict"][k], weights[k]) for k in weights)
    assert ckpt["progress"]["global_step"] == 4 and len(ckpt["rng"]) == 2  # every rank's RNG
    assert ckpt["optimizer_states"][0]["state"]  # momentum buffers from the processes that trained
    # The file resumes in one process, and test(ckpt_path=...) there evaluated those weights.
    from tests.helpers.after_ddp_script import Net

    net = Net()
    trainer = quiet_trainer(tmp_path / "one", max_epochs=2)
    trainer.fit(net, DataLoader(dataset(32), batch_size=4), ckpt_path=tmp_path / "after.ckpt")
    assert trainer.global_step == 12  # 4 restored, 8 more on 32 samples in batches of 4
    fresh = Net()
    fresh.load_state_dict(weights)
    expected = quiet_trainer().test(fresh, DataLoader(dataset(37, seed=2), batch_size=5), verbose=False)
    assert report["test_with_ckpt"][0]["test/loss"] == pytest.approx(expected[0]["test/loss"], abs=1e-6)
