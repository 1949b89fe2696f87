"""Sharded checkpoints written by FSDP ranks: exact resume on the same world size, resharding to others.

Real processes over gloo on the CPU. One 2-rank job trains, saves directories and resumes; the
directories it leaves are then loaded by one process (``single``) and by 4 ranks, whose own
directory 2 ranks load again (2→1, 2→4, 4→2), always compared value for value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import jobs, sharded_jobs
from tests.helpers.distributed import spawn

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("sharded2")
    return spawn(sharded_jobs.resume_job, str(root), world_size=2)


@pytest.mark.timeout(300)
def test_fsdp_resume_from_sharded_directory_equals_uninterrupted_run(two_ranks: list[dict[str, Any]]) -> None:
    resumed, straight = two_ranks[0]["resumed"], two_ranks[0]["straight"]
    assert sorted(resumed) == sorted(jobs.weights(jobs.BlockNet()))
    for name in straight:
        assert torch.equal(resumed[name], straight[name]), name
    last = Path(two_ranks[0]["last"])
    assert last.name == "last.ckpt" and last.is_dir()
    # Each rank wrote its own shard file; nothing gathered one.
    assert sorted(p.name for p in last.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
