"""docs/data.md's IterableDataset recipe shards alike however the ranks started, and an empty shard is said.

With ``num_workers > 0`` and loader workers started by ``spawn`` (no process group in them), the
recipe reads the rank from the environment every rank has: under ``strategy="ddp"`` and under
``torchrun`` the two ranks take disjoint halves of the stream. A rank whose share is empty stops the
run on every rank with the empty-training-set warning instead of training 0 steps in silence.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO_ROOT
from tests.helpers.distributed import run_python

pytestmark = pytest.mark.slow  # every test here starts processes

SCRIPT = str(REPO_ROOT / "tests" / "helpers" / "stream_script.py")


def _seen(root: Path) -> tuple[list[int], list[int]]:
    return torch.load(root / "seen-0.pt"), torch.load(root / "seen-1.pt")


@pytest.mark.timeout(300)
def test_the_recipe_gives_disjoint_shards_under_ddp_and_torchrun(tmp_path: Path) -> None:
    torchrun = ["-m", "torch.distributed.run", "--nproc-per-node=2", "--rdzv-backend=c10d",
                "--rdzv-endpoint=127.0.0.1:0"]  # fmt: skip
    with ThreadPoolExecutor(2) as pool:  # both launches at once
        launching = pool.submit(run_python, [SCRIPT, "--root", str(tmp_path / "ddp")], timeout=150)
        joining = pool.submit(run_python, [*torchrun, SCRIPT, "--root", str(tmp_path / "torchrun")], timeout=150)
        launched, joined = launching.result(), joining.result()
    assert launched.returncode == 0, launched.stderr
    assert joined.returncode == 0, joined.stderr
    for root in (tmp_path / "ddp", tmp_path / "torchrun"):
        zero, one = _seen(root)
        assert set(zero) == set(range(0, 32, 2)) and set(one) == set(range(1, 32, 2)), root  # disjoint halves
    assert _seen(tmp_path / "ddp") == _seen(tmp_path / "torchrun")


@pytest.mark.timeout(200)
def test_an_empty_shard_on_one_rank_is_said_as_an_empty_training_set(tmp_path: Path) -> None:
    result = run_python([SCRIPT, "--root", str(tmp_path), "--empty-rank", "1"], timeout=150)
    assert result.returncode == 0, result.stderr
    assert "Trainer.fit stopped: the training dataloader has no batches (rank 1's share of its IterableDataset" in (
        result.stderr
    )
    assert "fit ended: step 0" in result.stderr
    assert _seen(tmp_path) == ([], [])  # no rank trained on anything
