"""A checkpoint written on N processes resumes on M mid-epoch and ends where the uninterrupted run ends.

The global batch (``batch_size * processes``) is what a run keeps fixed (docs/data.md); a resume on
another number of processes with ``batch_size = global / processes`` continues on the same batches.
Where a change makes that impossible, the resume says so in one line at the start (rank 0).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

from tests.helpers import global_jobs
from tests.helpers.distributed import spawn
from trainer.checkpoint.resume import InexactResumeWarning, warn_if_batches_differ
from trainer.data.resumable import ResumableBatchSampler

G = global_jobs.GLOBAL


def _assert_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    for key, value in expected.items():
        torch.testing.assert_close(actual[key], value, atol=1e-6, rtol=0, msg=key)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run, a one-process checkpoint at step 3 (mid-epoch), and 2 ranks resuming it."""
    root = tmp_path_factory.mktemp("world")
    out: dict[str, Any] = {"root": root}
    out["ckpt1"] = str(root / "one.ckpt")
    out["whole"] = global_jobs.fit(root / "whole", "auto", G, save_to=out["ckpt1"])
    out["ckpt2"] = str(root / "two.ckpt")
    out["two"] = spawn(global_jobs.resume_on_world, str(root), out["ckpt1"], out["ckpt2"], world_size=2)
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_process_checkpoint_resumes_on_two(runs: dict[str, Any]) -> None:
    assert torch.load(runs["ckpt1"], weights_only=True)["progress"]["batch_in_epoch"] == 3  # mid-epoch
    for rank in runs["two"]:
        assert rank["resumed"]["steps"] == runs["whole"]["steps"] and rank["resumed"]["warnings"] == []
        _assert_close(rank["resumed"]["weights"], runs["whole"]["weights"])
        _assert_close(rank["written"]["weights"], runs["whole"]["weights"])  # and 2 processes uninterrupted


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_process_checkpoint_resumes_on_one(runs: dict[str, Any], tmp_path: Path) -> None:
    resumed = global_jobs.fit(tmp_path, "auto", G, ckpt_path=runs["ckpt2"])
    assert resumed["warnings"] == [] and resumed["steps"] == runs["whole"]["steps"]
    _assert_close(resumed["weights"], runs["whole"]["weights"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_process_checkpoint_resumes_on_four(runs: dict[str, Any]) -> None:
    four = spawn(global_jobs.resume_on_world, str(runs["root"]), runs["ckpt2"], world_size=4)
    for rank in four:
        assert rank["steps"] == runs["whole"]["steps"] and rank["warnings"] == []
        _assert_close(rank["weights"], runs["whole"]["weights"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_changed_global_batch_says_so_in_one_line(runs: dict[str, Any], tmp_path: Path) -> None:
    resumed = global_jobs.fit(tmp_path, "auto", G // 2, ckpt_path=runs["ckpt2"])  # 4 x 1, not 4 x 2
    assert len(resumed["warnings"]) == 1
    line = resumed["warnings"][0]
    assert "\n" not in line and "two.ckpt" in line
    assert "global batch was 8 (batch_size 4 x 2 processes), now 4 (4 x 1); batch_size=8 keeps it" in line
    assert "other batches than the uninterrupted run" in line


class _Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(4))


def _trainer(loader: Any, world: int, accumulate: int = 1) -> Any:
    return SimpleNamespace(
        loaders={"fit": loader}, world_size=world, accumulate_grad_batches=accumulate, is_global_zero=True
    )


def _resumable(batch_sampler: Any) -> DataLoader[Any]:
    return DataLoader(range(12), batch_sampler=ResumableBatchSampler(batch_sampler))


def _saved(kind: str, world: int, batch_size: int | None, accumulate: int = 1) -> dict[str, Any]:
    return {"kind": kind, "world_size": world, "batch_size": batch_size, "accumulate_grad_batches": accumulate}


def test_what_cannot_continue_exactly_is_named() -> None:
    plain = _resumable(BatchSampler(SequentialSampler(range(12)), 2, False))
    cases = [
        (
            _saved("samples", 2, 3),
            _trainer(plain, 4),
            "global batch was 6 (batch_size 3 x 2 processes), now 8 (2 x 4); "
            "6 is not divisible by 4 processes, so no batch_size keeps it",
        ),
        (
            _saved("samples", 4, 2, accumulate=1),
            _trainer(plain, 4, accumulate=2),
            "accumulate_grad_batches was 1, now 2",
        ),
        (
            _saved("batch_sampler", 2, None),
            _trainer(_resumable([[0, 1], [2]]), 4),
            "its own batch sampler, which cannot be resharded from 2 to 4 processes",
        ),
        (
            _saved("iterable", 2, 2),
            _trainer(DataLoader(_Stream(), batch_size=2), 1),
            "an IterableDataset sharded by your code, which cannot be resharded from 2 to 1 processes",
        ),
    ]
    for saved, trainer, expected in cases:
        with pytest.warns(InexactResumeWarning) as record:
            warn_if_batches_differ(Path("x.ckpt"), saved, trainer)
        assert len(record) == 1 and expected in str(record[0].message), str(record[0].message)
    # The same global batch on another number of processes is exact: nothing is said.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_batches_differ(Path("x.ckpt"), _saved("samples", 1, 8), _trainer(plain, 4))
        warn_if_batches_differ(Path("x.ckpt"), _saved("samples", 2, 4), _trainer(plain, 4))
