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


@pytest.mark.timeout(300)
def test_async_save_on_two_ranks_writes_the_final_state(two_ranks: list[dict[str, Any]]) -> None:
    """``ModelCheckpoint(async_save=True)`` under FSDP: DCP's background write holds the run's end state."""
    loaded = jobs.BlockNet.load_from_checkpoint(two_ranks[0]["async_last"])
    for name, value in two_ranks[0]["straight"].items():
        assert torch.equal(loaded.state_dict()[name], value), name
    assert not list(Path(two_ranks[0]["async_last"]).parent.glob(".*"))  # no partial or set-aside directory left


def _assert_same(loaded: dict[str, Any], saved: dict[str, Any]) -> None:
    """Weights, step and every optimizer buffer equal, bit for bit."""
    assert loaded["step"] == saved["step"] > 0
    assert sorted(loaded["weights"]) == sorted(saved["weights"])
    for name, value in saved["weights"].items():
        assert torch.equal(loaded["weights"][name], value), name
    want, got = saved["optimizer"], loaded["optimizer"]
    assert got["param_groups"] == want["param_groups"]
    assert sorted(got["state"]) == sorted(want["state"]) and want["state"]
    for index, buffers in want["state"].items():
        for key, value in buffers.items():
            assert torch.equal(got["state"][index][key], value), (index, key)


@pytest.mark.timeout(300)
def test_two_ranks_directory_loads_in_one_process(two_ranks: list[dict[str, Any]], tmp_path: Path) -> None:
    """2→1: fit(ckpt_path=dir) on one device gets the full weights and optimizer state back."""
    loaded = sharded_jobs.restore_job(two_ranks[0]["last"], "single", None, str(tmp_path))
    _assert_same(loaded, two_ranks[0]["saved"])


@pytest.mark.timeout(400)
def test_reshards_two_to_four_fsdp_and_four_to_two_ddp(two_ranks: list[dict[str, Any]], tmp_path: Path) -> None:
    """2→4 under FSDP (which saves a 4-rank directory), then that 4→2 under DDP: nothing changes on the way."""
    four_dir = tmp_path / "four.ckpt"
    four = spawn(
        sharded_jobs.restore_job, two_ranks[0]["last"], "fsdp", str(four_dir), str(tmp_path / "f"), world_size=4
    )
    _assert_same(four[0], two_ranks[0]["saved"])
    assert len(list(four_dir.glob("*.distcp"))) == 4
    two = spawn(sharded_jobs.restore_job, str(four_dir), "ddp", None, str(tmp_path / "d"), world_size=2)
    for rank in two:
        _assert_same(rank, two_ranks[0]["saved"])
