"""The same global batches on any number of processes (issue #18): shuffled DDP equals one process.

A loader's ``batch_size`` is per process; ``W`` processes train on global batches of
``batch_size * W``, drawn in the order one process draws with the same seed, each split over the
ranks. So DDP on ``W`` processes equals one process with batch ``batch_size * W``, also with a
short last batch (unequal or empty shards, weighted so the step is one process's) and ``drop_last``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from strategies import DDPStrategy
from strategies.sampling import GlobalBatchSampler
from tests.helpers import global_jobs, jobs
from tests.helpers.distributed import spawn


def _single_process_batches(n: int, batch: int, drop_last: bool, seed: int) -> list[set[int]]:
    torch.manual_seed(seed)
    return [set(b) for b in BatchSampler(RandomSampler(range(n)), batch, drop_last)]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize(("n", "drop_last"), [(37, False), (33, False), (37, True), (24, False)])
def test_ranks_shards_of_each_step_are_the_single_process_batch(world: int, n: int, drop_last: bool) -> None:
    per_rank = 2
    expected = _single_process_batches(n, per_rank * world, drop_last, seed=11)
    shards = []
    for rank in range(world):
        torch.manual_seed(11)  # every rank's generator where one process's was (seed_everything)
        sampler = GlobalBatchSampler(range(n), RandomSampler(range(n)), per_rank, rank, world, drop_last=drop_last)
        shards.append(list(BatchSampler(sampler, per_rank, drop_last=False)))
        assert len(shards[-1]) == len(expected)  # every rank steps as often as one process does
    for step, batch in enumerate(expected):
        parts = [set(shards[rank][step]) for rank in range(world)]
        union = set().union(*parts)
        assert union == batch
        real = [len(p) for p in parts]
        if sum(real) > len(batch):  # a stand-in sample on a rank whose shard is empty: its loss counts 0
            assert step == len(expected) - 1 and len(batch) < world
    # The shares of a short last batch weight each rank's mean loss so the ranks' mean is the batch mean.
    last = len(expected[-1]) if expected else 0
    for rank in range(world):
        sampler = GlobalBatchSampler(range(n), RandomSampler(range(n)), per_rank, rank, world, drop_last=drop_last)
        own = len(range(rank, last, world)) if last < per_rank * world else per_rank
        if sampler.last_batch_share is not None:
            assert sampler.last_batch_share == pytest.approx(own * world / last)


def test_default_training_loaders_get_the_global_batch_sampler() -> None:
    strategy = DDPStrategy(devices=2, device="cpu")  # a planned world of 2; this process is rank 0
    for shuffle, kind in ((True, RandomSampler), (False, SequentialSampler)):
        loader = strategy.process_dataloader(DataLoader(jobs.dataset(37), batch_size=4, shuffle=shuffle), train=True)
        assert isinstance(loader, DataLoader) and isinstance(loader.sampler, GlobalBatchSampler)
        assert isinstance(loader.sampler.sampler, kind) and loader.sampler.shuffle is shuffle
        assert loader.batch_size == 4 and loader.sampler.global_batch_size == 8


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return spawn(global_jobs.ddp_scenarios, str(tmp_path_factory.mktemp("ddp")), world_size=2)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["even", "uneven", "empty_shard", "drop_last", "accumulate"])
def test_ddp_with_shuffle_equals_one_process(two_ranks: list[dict[str, Any]], case: str, tmp_path: Path) -> None:
    n = global_jobs.SIZES.get(case, global_jobs.SIZES["uneven"])
    options = global_jobs.ACCUMULATE if case == "accumulate" else {}
    one = global_jobs.fit(tmp_path, "auto", global_jobs.GLOBAL, n=n, drop_last=case == "drop_last", **options)
    assert not torch.equal(one["weights"]["head.weight"], jobs.BlockNet().head.weight.detach())
    for rank in two_ranks:
        assert rank[case]["steps"] == one["steps"]
        for key, value in one["weights"].items():
            torch.testing.assert_close(rank[case]["weights"][key], value, atol=1e-6, rtol=0, msg=f"{case} {key}")
