"""An IterableDataset the user shards by rank trains under DDP (issue #17), with or without a length.

The shards may hold different numbers of batches: the ranks agree before each batch whether all of
them have one, so they stop together (no rank waits in a collective for one that ran out) and the
steps equal one process's on the part every rank streams. Without ``__len__`` the epoch has no total
(the progress bar shows ``?``); a mid-epoch resume re-reads the stream up to where it stopped.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from strategies import DDPStrategy
from tests.helpers import iterable_jobs, jobs
from tests.helpers.distributed import spawn
from tests.helpers.trainers import quiet_trainer

pytestmark = pytest.mark.slow  # every test here starts processes


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[Any, Any]]:
    return spawn(iterable_jobs.ddp_streams, str(tmp_path_factory.mktemp("streams")), world_size=2)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """One process, batch 8, on the samples both ranks stream (rank 0's extra ones are never reached)."""
    module = jobs.BlockNet()
    trainer = quiet_trainer(tmp_path_factory.mktemp("one"), max_epochs=iterable_jobs.EPOCHS)
    trainer.fit(module, DataLoader(iterable_jobs.common_samples(), batch_size=8))
    return jobs.weights(module)


def _assert_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    for key, value in expected.items():
        torch.testing.assert_close(actual[key], value, atol=1e-6, rtol=0, msg=key)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sized", [False, True])
def test_unequal_user_shards_stop_together_and_equal_one_process(
    two_ranks: list[dict[Any, Any]], one_process: dict[str, torch.Tensor], sized: bool
) -> None:
    per_epoch = iterable_jobs.COMMON // 8  # rank 1's shard: 16 samples, 4 batches of 4; rank 0 has 8 batches
    for rank in two_ranks:
        assert rank[sized]["steps"] == per_epoch * iterable_jobs.EPOCHS
        # With __len__, the total is the shortest rank's; without, there is none (progress without a total).
        assert rank[sized]["batches"] == (per_epoch if sized else math.inf)
        _assert_close(rank[sized]["weights"], one_process)


@pytest.mark.timeout(300)
def test_a_stream_resumes_mid_epoch_on_the_same_processes(
    two_ranks: list[dict[Any, Any]], one_process: dict[str, torch.Tensor]
) -> None:
    for rank in two_ranks:
        assert rank["resumed"]["steps"] == iterable_jobs.COMMON // 8 * iterable_jobs.EPOCHS
        _assert_close(rank["resumed"]["weights"], one_process)


def test_evaluation_streams_are_left_as_the_user_sharded_them() -> None:
    strategy = DDPStrategy(devices=2, device="cpu")  # a planned world of 2; this process is rank 0
    loader = DataLoader(iterable_jobs.RankStream(), batch_size=4)
    assert strategy.process_dataloader(loader, train=False) is loader
