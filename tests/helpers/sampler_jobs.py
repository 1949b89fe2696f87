"""What the DDP sampler tests run on each of two ranks: fits that record the sample indices they train on."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, SubsetRandomSampler

from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule

#: The user's subset: 8 of 32 samples, in an order drawn from a seeded generator.
SUBSET = list(range(8, 16))
#: A batch sampler of the user's: uneven batches over 7 chosen samples.
BATCHES = [[0, 1], [5], [9, 10, 11], [20], [30, 31]]


class Indices(Dataset[torch.Tensor]):
    """Sample ``i`` is the float tensor ``[i]``, so a step can tell which samples it trained on."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index)])


class Recorder(TrainModule):
    """Notes every index it trains on; the loss involves its one weight, so DDP has a gradient to sync."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)
        self.seen: list[int] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.extend(int(i) for i in batch[:, 0].tolist())
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def subset_sampler() -> SubsetRandomSampler:
    return SubsetRandomSampler(SUBSET, generator=torch.Generator().manual_seed(7))


def _seen(loader: DataLoader[Any], root: str, **options: Any) -> list[int]:
    module = Recorder()
    trainer = quiet_trainer(root, strategy="ddp", max_epochs=1)
    for name, value in options.items():  # ``use_distributed_sampler`` (a Trainer argument on another branch)
        setattr(trainer, name, value)
    trainer.fit(module, loader)
    return module.seen


def sampler_job(root: str) -> dict[str, list[int]]:
    """The indices this rank trained on: a user's sampler, a user's batch sampler, the sampler left alone."""
    return {
        "sampler": _seen(DataLoader(Indices(), batch_size=2, sampler=subset_sampler()), f"{root}/a"),
        "batch_sampler": _seen(DataLoader(Indices(), batch_sampler=BATCHES), f"{root}/b"),
        "untouched": _seen(
            DataLoader(Indices(), batch_size=4, sampler=subset_sampler()), f"{root}/c", use_distributed_sampler=False
        ),
    }
