"""A module with a scripted validation metric, fake other ranks and a metric recorder, for callback tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# trainer first: `import strategies` before `trainer` hits a circular import in the foundation.
from trainer import TrainModule  # isort: split

from callbacks import Callback
from strategies import SingleDeviceStrategy


def loaders(n_train: int = 32, n_val: int = 16, batch_size: int = 8, seed: int = 0) -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n_train + n_val, 4, generator=g), torch.randn(n_train + n_val, 1, generator=g)
    train = DataLoader(TensorDataset(x[:n_train], y[:n_train]), batch_size=batch_size)
    val = DataLoader(TensorDataset(x[n_train:], y[n_train:]), batch_size=batch_size)
    return train, val


class Scripted(TrainModule):
    """A linear regressor whose validation logs ``val/score`` = ``scores[epoch]`` (a known sequence)."""

    def __init__(self, scores: Sequence[float] = (), lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters("lr")
        self.layer = nn.Linear(4, 1)
        self.scores = list(scores)
        self.lr = lr

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.layer(x), y), prog_bar=True)
        if self.scores:
            # After fit, current_epoch counts the finished epochs (Lightning): a later validate reads the last.
            self.log("val/score", torch.tensor(self.scores[min(self.current_epoch, len(self.scores) - 1)]))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class NotRankZero(SingleDeviceStrategy):
    """One process that believes it is rank 1 of 2: what a second DDP rank sees of itself."""

    @property
    def global_rank(self) -> int:
        return 1

    @property
    def world_size(self) -> int:
        return 2


class OtherRankStrategy(SingleDeviceStrategy):
    """Simulates a second rank in collectives: ``broadcast`` returns rank 0's value ``rank0_values``,
    and ``reduce`` combines with what the other rank contributes (``other_votes``), in call order."""

    def __init__(self, rank0_values: list[float] | None = None, other_votes: list[float] | None = None) -> None:
        super().__init__(device="cpu")
        self.rank0_values = list(rank0_values or [])
        self.other_votes = list(other_votes or [])
        self.reduce_calls: list[tuple[float, str]] = []

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return self.rank0_values.pop(0) if self.rank0_values else obj

    def reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        self.reduce_calls.append((float(tensor), op))
        other = torch.tensor(self.other_votes.pop(0) if self.other_votes else 0.0)
        assert op == "max"
        return torch.maximum(tensor, other)


class Recorder(Callback):
    """Everything handed to loggers, as (tag, step, value)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, int, float]] = []

    def on_log_metrics(self, trainer: Any, module: Any, metrics: dict[str, torch.Tensor], step: int) -> None:
        self.rows.extend((k, step, float(v)) for k, v in metrics.items())

    def of(self, tag: str) -> list[tuple[int, float]]:
        return [(s, v) for k, s, v in self.rows if k == tag]
