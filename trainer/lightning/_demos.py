"""Lightning's small demo classes (``lightning.pytorch.demos.boring_classes``), for the programs that use them.

Lightning's documentation builds its command-line examples on them
(``LightningCLI(DemoModel, BoringDataModule)``) and many tests on ``BoringModel``. They compute what
Lightning's do, drawing the same random numbers in the same order, so a program using them ends with
Lightning's weights. Like Lightning's, they are for trying things out, not for real training.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from trainer.datamodule import DataModule
from trainer.module import TrainModule

__all__ = [
    "BoringDataModule",
    "BoringDataModuleNoLen",
    "BoringModel",
    "DemoModel",
    "IterableBoringDataModule",
    "ManualOptimBoringModel",
    "Net",
    "RandomDataset",
    "RandomDictDataset",
    "RandomIterableDataset",
    "RandomIterableDatasetWithLen",
]


class RandomDataset(Dataset[Tensor]):
    """``length`` vectors of ``size`` standard normal numbers, drawn once when it is made."""

    def __init__(self, size: int, length: int) -> None:
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index: int) -> Tensor:
        return self.data[index]

    def __len__(self) -> int:
        return self.len


class RandomDictDataset(RandomDataset):
    """:class:`RandomDataset` whose items are ``{"a": x, "b": x + 2}``."""

    def __getitem__(self, index: int) -> dict[str, Tensor]:  # type: ignore[override]
        a = self.data[index]
        return {"a": a, "b": a + 2}


class RandomIterableDataset(IterableDataset[Tensor]):
    """``count`` vectors of ``size`` standard normal numbers, drawn as they are read; no length."""

    def __init__(self, size: int, count: int) -> None:
        self.count = count
        self.size = size

    def __iter__(self) -> Iterator[Tensor]:
        for _ in range(self.count):
            yield torch.randn(self.size)


class RandomIterableDatasetWithLen(RandomIterableDataset):
    """:class:`RandomIterableDataset` with a length."""

    def __len__(self) -> int:
        return self.count


class BoringModel(TrainModule):
    """One ``Linear(32, 2)`` pulled towards ones; its own random data. Subclass it and change what a test needs."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)

    def loss(self, preds: Tensor, labels: Tensor | None = None) -> Tensor:
        """Mean squared distance to ``labels`` (ones by default): any loss that moves the weights."""
        return F.mse_loss(preds, torch.ones_like(preds) if labels is None else labels)

    def step(self, batch: Any) -> Tensor:
        return self.loss(self(batch))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return {"loss": self.step(batch)}

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        return {"x": self.step(batch)}

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        return {"y": self.step(batch)}

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))

    def test_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))


class ManualOptimBoringModel(BoringModel):
    """:class:`BoringModel` optimised by hand in ``training_step``."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        optimizer = self.optimizers()
        loss = self.step(batch)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss


class _OneLoaderPerStage(DataModule):
    """A loader over ``random_<stage>`` per stage, which the subclass's ``setup`` builds."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.random_train)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.random_val)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.random_test)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.random_predict)


class BoringDataModule(_OneLoaderPerStage):
    """256 random vectors of 32 numbers, drawn when it is made: 64 each for train, val, test and predict."""

    def __init__(self) -> None:
        super().__init__()
        self.random_full = RandomDataset(32, 64 * 4)

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.random_train = Subset(self.random_full, indices=range(64))
        if stage in ("fit", "validate"):
            self.random_val = Subset(self.random_full, indices=range(64, 64 * 2))
        if stage == "test":
            self.random_test = Subset(self.random_full, indices=range(64 * 2, 64 * 3))
        if stage == "predict":
            self.random_predict = Subset(self.random_full, indices=range(64 * 3, 64 * 4))


class BoringDataModuleNoLen(_OneLoaderPerStage):
    """:class:`BoringDataModule` over iterable data sets without a length (512, 128, 256, 64 vectors)."""

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.random_train = RandomIterableDataset(32, 512)
        if stage in ("fit", "validate"):
            self.random_val = RandomIterableDataset(32, 128)
        if stage == "test":
            self.random_test = RandomIterableDataset(32, 256)
        if stage == "predict":
            self.random_predict = RandomIterableDataset(32, 64)


class IterableBoringDataModule(DataModule):
    """Two loaders per stage, one over a sized and one over an iterable data set of vectors of 4."""

    def setup(self, stage: str) -> None:
        def both(length: int) -> list[Dataset[Tensor]]:
            return [RandomDataset(4, length), RandomIterableDataset(4, length)]

        if stage == "fit":
            self.train_datasets = both(16)
        if stage in ("fit", "validate"):
            self.val_datasets = both(32)
        if stage == "test":
            self.test_datasets = both(64)
        if stage == "predict":
            self.predict_datasets = both(128)

    def train_dataloader(self) -> Any:
        return [DataLoader(d) for d in self.train_datasets]

    def val_dataloader(self) -> Any:
        return [DataLoader(d) for d in self.val_datasets]

    def test_dataloader(self) -> Any:
        return [DataLoader(d) for d in self.test_datasets]

    def predict_dataloader(self) -> Any:
        return [DataLoader(d) for d in self.predict_datasets]


class DemoModel(TrainModule):
    """``relu(Linear(32, out_dim))`` trained to make its outputs' sum small, with Adam: the CLI docs' model."""

    def __init__(self, out_dim: int = 10, learning_rate: float = 0.02) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(32, out_dim)
        self.learning_rate = learning_rate

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.l1(x.view(x.size(0), -1)))

    def training_step(self, batch: Any, batch_nb: int) -> Any:
        return self(batch).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.learning_rate)


class Net(nn.Module):
    """A small convolutional classifier of 28x28 grey images into 10 classes (log-probabilities)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.fc2(self.dropout2(F.relu(self.fc1(x))))
        return F.log_softmax(x, dim=1)


# Their public home, where configs name them: jsonargparse finds a class by its short name
# (``--model=BoringModel``) only outside private modules such as this one.
for _name in __all__:
    globals()[_name].__module__ = "trainer.lightning.demos.boring_classes"
