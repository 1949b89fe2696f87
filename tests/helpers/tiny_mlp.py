"""A small classifier on fixed in-memory batches, for tests of the training and evaluation steps.

The same model and data as ``bench/overhead.py`` measures (32 -> 64 -> 10, batches of 64, SGD), kept
here so the tests do not depend on benchmark code: change one without the other if need be.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from trainer import TrainModule

IN, HIDDEN, OUT, BATCH = 32, 64, 10, 64


class TinyMLP(TrainModule):
    """32 -> 64 -> 10 with plain SGD (lr 0.05); with ``log_loss`` it logs ``train/loss`` every step.

    Initial weights come from torch's global RNG: seed it first for two identical instances.
    """

    def __init__(self, log_loss: bool = True) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
        self.log_loss = log_loss

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        if self.log_loss:
            self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Batches:
    """Fixed batches held in memory: a sized iterable, as a DataLoader is."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return iter(self.batches)


def make_batches(n: int, seed: int = 0) -> Batches:
    """``n`` fixed random batches of (inputs, labels), from their own generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return Batches(
        [(torch.randn(BATCH, IN, generator=g), torch.randint(0, OUT, (BATCH,), generator=g)) for _ in range(n)]
    )
