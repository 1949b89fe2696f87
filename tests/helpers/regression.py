"""Tiny deterministic regressors and their data, for tests that compare with a hand-written loop.

Everything here runs on the CPU on purpose: parity tests compare the trainer with a hand-written
loop bit for bit, which only holds when both run the same kernels on the same device.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer import TrainModule


def make_dataset(n: int = 10, features: int = 4, seed: int = 0) -> TensorDataset:
    """A fixed regression data set: ``n`` samples, ``features`` inputs, one target."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def make_loader(n: int = 10, batch_size: int = 4, seed: int = 0) -> DataLoader[Any]:
    """A DataLoader over :func:`make_dataset` in a fixed order (no shuffling)."""
    return DataLoader(make_dataset(n, seed=seed), batch_size=batch_size, shuffle=False)


def sgd(module: nn.Module) -> torch.optim.Optimizer:
    """SGD with momentum, so optimizer state matters for parity and resume tests."""
    return torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)


class Regressor(TrainModule):
    """A tiny MLP (no dropout: deterministic) with a mean-squared-error loss.

    Args:
        optim_fn: builds what ``configure_optimizers`` returns from the module (default: :func:`sgd`).
        seed: seed of the initial weights, so two instances start identical.
    """

    def __init__(self, optim_fn: Callable[[nn.Module], Any] | None = None, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.optim_fn = optim_fn or sgd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return F.mse_loss(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", F.mse_loss(self(x), y))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> Any:
        return self.optim_fn(self)


def plain_copy(module: nn.Module) -> nn.Module:
    """An independent copy of ``module``'s network for the hand-written reference loop."""
    return copy.deepcopy(module.net)  # type: ignore[arg-type]


def assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    """Bitwise equality of every parameter (names taken from ``a``)."""
    sa, sb = dict(a.named_parameters()), dict(b.named_parameters())
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), f"{name} differs: max |diff| {(sa[name] - sb[name]).abs().max()}"


class Small(TrainModule):
    """One linear layer (3 -> ``width``) trained to shrink its outputs (loss: mean of squares), SGD lr 0.1."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.layer = nn.Linear(3, width)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)
