"""Modules with lazy layers (``nn.LazyLinear``, ``nn.LazyBatchNorm1d``) fed in each way a fit gets its data.

``route`` says how: ``"loader"`` (passed to ``fit``), ``"datamodule"``, ``"module"`` (the module's own
``train_dataloader()``) or ``"example"`` (``example_input_array``, set far from the data's scale, so a
materialising forward that moved batch-norm statistics would show).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers.trainers import quiet_trainer
from trainer import DataModule, TrainModule, seed_everything


def _dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 5, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


def _loader(batch_size: int) -> DataLoader[Any]:
    return DataLoader(_dataset(), batch_size=batch_size, shuffle=True)


class LazyNet(TrainModule):
    def __init__(self, batch_size: int = 8, route: str = "loader") -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LazyLinear(12), nn.LazyBatchNorm1d(), nn.ReLU(), nn.Dropout(0.2), nn.LazyLinear(1))
        self.batch_size, self.route = batch_size, route
        if route == "example":
            self.example_input_array = 100.0 * torch.ones(3, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def train_dataloader(self) -> DataLoader[Any]:
        if self.route != "module":
            raise NotImplementedError  # as a module without the hook
        return _loader(self.batch_size)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class NoForward(LazyNet):
    """A Lightning-style module that calls its layers in ``training_step`` and defines no ``forward``."""

    forward = nn.Module.forward  # type: ignore[assignment]


class Data(DataModule):
    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader[Any]:
        return _loader(self.batch_size)


def fit(route: str, strategy: Any = None, batch_size: int = 8, no_forward: bool = False) -> dict[str, torch.Tensor]:
    """Train 2 epochs from seed 5; the module's state (weights and batch-norm buffers)."""
    seed_everything(5)
    module = (NoForward if no_forward else LazyNet)(batch_size, route)
    options: dict[str, Any] = {"max_epochs": 2}
    if strategy is not None:
        options["strategy"] = strategy
    trainer = quiet_trainer(None, **options)
    if route == "loader" or route == "example":
        trainer.fit(module, _loader(batch_size))
    elif route == "datamodule":
        trainer.fit(module, datamodule=Data(batch_size))
    else:
        trainer.fit(module)
    full = (getattr(v, "full_tensor", lambda v=v: v)() for v in module.state_dict().values())  # FSDP: DTensors
    return {k: v.detach().clone() for k, v in zip(module.state_dict(), full)}


def ranks(strategies: list[str]) -> dict[str, Any]:
    """On each of 2 ranks, per strategy: the fit with the loader given, and with a data module."""
    out: dict[str, Any] = {}
    for strategy in strategies:
        out[strategy] = {route: fit(route, strategy, batch_size=4) for route in ("loader", "datamodule")}
    try:
        fit("datamodule", strategies[0], batch_size=4, no_forward=True)
    except Exception as err:  # the message is what the test reads
        out["no_forward"] = str(err)
    return out
