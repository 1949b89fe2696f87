"""Fixtures of the test suite; the helpers they use live in ``tests/helpers/``."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.distributed import restored_environment
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer


@pytest.fixture
def make_trainer(tmp_path: Path) -> Callable[..., Trainer]:
    """``make_trainer(**kwargs)``: :func:`~tests.helpers.trainers.quiet_trainer` rooted in this test's tmp_path."""

    def factory(**kwargs: Any) -> Trainer:
        return quiet_trainer(tmp_path, **kwargs)

    return factory


@pytest.fixture
def clean_distributed_env() -> Iterator[None]:
    """Put ``os.environ`` back afterwards and destroy any process group the test created."""
    with restored_environment():
        yield


_DISTRIBUTED_KEYS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


@pytest.fixture(autouse=True)
def _restore_global_state() -> Iterator[None]:
    """Undo what a test did to torch's global switches and the seed environment variables."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    # The distributed variables too: a test that reads a Slurm environment sets MASTER_ADDR, RANK, ...,
    # and a later test's `geartrain` subprocess would inherit them and wait to join a group.
    keys = ("GEARTRAIN_SEED", "GEARTRAIN_SEED_WORKERS", "CUBLAS_WORKSPACE_CONFIG", *_DISTRIBUTED_KEYS)
    env = {k: os.environ.get(k) for k in keys}
    yield
    torch.use_deterministic_algorithms(deterministic)
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


# Scripts that made the files under tests/data (run with pytorch-lightning, not a dependency): not collected.
collect_ignore_glob = ["data/*"]
