"""``seed_everything(workers=True)``: DataLoader workers seeded from (base seed, worker id, rank).

Every test draws from all three generators (torch, Python, NumPy) inside two worker processes.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset
from typing_extensions import override

from strategies import SingleDeviceStrategy
from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule, seed_everything
from trainer.common.rng import WorkerInit
from trainer.data.resumable import add_worker_seeding

Draws = list[tuple[float, float, float]]


class RandomDraws(Dataset[tuple[float, float, float]]):
    """Each item: one draw of torch's, Python's and NumPy's generators, in the worker that loads it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[float, float, float]:
        return float(torch.rand(1)), random.random(), float(np.random.rand())


class RandomStream(IterableDataset[tuple[float, float, float]]):
    """Four draws per worker, as an iterable dataset (where worker seeds matter most)."""

    def __iter__(self) -> Any:
        for _ in range(4):
            yield float(torch.rand(1)), random.random(), float(np.random.rand())


def loader(dataset: Dataset[Any] | None = None, **kwargs: Any) -> DataLoader[Any]:
    return DataLoader(dataset if dataset is not None else RandomDraws(), batch_size=None, num_workers=2, **kwargs)


def draws(batches: Any) -> Draws:
    return [tuple(float(v) for v in item) for item in batches]  # type: ignore[misc]


def run(rank: int, workers: bool = True, dataset: Dataset[Any] | None = None, **kwargs: Any) -> Draws:
    seed_everything(3, workers=workers)
    return draws(add_worker_seeding(loader(dataset, **kwargs), rank))


def test_workers_true_repeats_and_separates_ranks() -> None:
    first, again, other_rank = run(0), run(0), run(1)
    assert first == again  # reproducible
    for mine, theirs in zip(first, other_rank):  # every generator differs, for every item
        assert all(a != b for a, b in zip(mine, theirs))
    assert len(set(first)) == len(first)  # the two workers do not repeat each other


def test_workers_true_seeds_iterable_dataset_workers_by_rank() -> None:
    first, again, other_rank = (
        run(0, dataset=RandomStream()),
        run(0, dataset=RandomStream()),
        run(1, dataset=RandomStream()),
    )
    assert len(first) == 8 and first == again
    assert not set(first) & set(other_rank)


def test_workers_false_leaves_the_loader_alone() -> None:
    seed_everything(3, workers=False)
    original = loader()
    assert add_worker_seeding(original, 1) is original and original.worker_init_fn is None
    # Without worker seeding every rank's workers draw the same values: what workers=True prevents.
    assert run(0, workers=False) == run(1, workers=False)


def test_loaders_without_workers_are_left_alone() -> None:
    seed_everything(3, workers=True)
    single = DataLoader(RandomDraws(), batch_size=None)
    assert add_worker_seeding(single, 1) is single
    assert add_worker_seeding([1, 2], 1) == [1, 2]


def _user_init(worker_id: int) -> None:
    """A user's worker_init_fn: reseeds Python's generator, the same on every rank."""
    random.seed(1000 + worker_id)


def test_a_users_worker_init_fn_is_kept_and_runs_after_the_seeding() -> None:
    seed_everything(3, workers=True)
    seeded = add_worker_seeding(loader(worker_init_fn=_user_init), 0)
    assert isinstance(seeded, DataLoader) and isinstance(seeded.worker_init_fn, WorkerInit)
    assert seeded.worker_init_fn.then is _user_init
    assert add_worker_seeding(seeded, 0) is seeded  # not wrapped twice
    rank0, rank1 = run(0, worker_init_fn=_user_init), run(1, worker_init_fn=_user_init)
    assert [d[1] for d in rank0] == [d[1] for d in rank1]  # the user's reseeding came last and wins
    assert all(a[0] != b[0] and a[2] != b[2] for a, b in zip(rank0, rank1))  # ours ran too


class _Rank(SingleDeviceStrategy):
    """One CPU process that reports ``rank`` as its global rank (as rank ``rank`` of a job would)."""

    def __init__(self, rank: int) -> None:
        super().__init__(device="cpu")
        self._rank = rank

    @property
    @override
    def global_rank(self) -> int:
        return self._rank


class _Passthrough(TrainModule):
    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        return batch


@pytest.mark.parametrize("workers", [True, False])
def test_the_trainer_seeds_its_loaders_workers_by_rank(tmp_path: Path, workers: bool) -> None:
    def predict(rank: int) -> Draws:
        seed_everything(3, workers=workers)
        return draws(quiet_trainer(tmp_path, strategy=_Rank(rank)).predict(_Passthrough(), loader()))

    first, again, other_rank = predict(0), predict(0), predict(1)
    assert first == again
    if workers:
        assert all(a != b for mine, theirs in zip(first, other_rank) for a, b in zip(mine, theirs))
    else:
        assert first == other_rank


def test_isolate_rng_puts_cuda_states_back_as_lightning_does_even_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.common.rng import isolate_rng

    put_back: list[Any] = []
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", put_back.append)
    with isolate_rng(include_cuda=False):
        pass
    assert put_back == []  # CUDA's generators left alone
    with isolate_rng():  # include_cuda=True: one state per device, none on a machine without CUDA
        pass
    assert len(put_back) == 1 and len(put_back[0]) == torch.cuda.device_count()
