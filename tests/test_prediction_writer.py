"""BasePredictionWriter: real dataset indices per batch, shards under DDP joined back into dataset order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import BasePredictionWriter, join_predictions
from trainer import Trainer, TrainModule


class Doubler(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 2)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch[0])


class ShardWriter(BasePredictionWriter):
    def __init__(self, folder: Path, write_interval: str = "epoch") -> None:
        super().__init__(write_interval)
        self.folder = folder
        self.batches: list[tuple[list[int] | None, int]] = []

    def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: Any, batch_indices: Any, batch: Any,
                           batch_idx: int, dataloader_idx: int) -> None:  # fmt: skip
        # The indices name the very samples of the batch: the input rows are the dataset's rows.
        assert torch.equal(batch[0], _inputs()[torch.tensor(batch_indices)])
        self.batches.append((batch_indices, batch_idx))

    def write_on_epoch_end(self, trainer: Any, pl_module: Any, predictions: Any, batch_indices: Any) -> None:
        path = self.folder / f"rank{trainer.global_rank}.pt"
        torch.save({"predictions": predictions, "batch_indices": batch_indices[0]}, path)


def _inputs() -> torch.Tensor:
    return torch.arange(21 * 3, dtype=torch.float32).reshape(21, 3) / 10


def _loader(shuffle: bool = False) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(3)
    return DataLoader(TensorDataset(_inputs()), batch_size=4, shuffle=shuffle, generator=g)


def _trainer(**kwargs: Any) -> Trainer:
    return Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, **kwargs)


def test_batch_indices_are_the_samplers_and_the_epoch_gets_them_all(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = Doubler()
    writer = ShardWriter(tmp_path, "batch_and_epoch")
    expected = _trainer().predict(module, _loader())
    _trainer(callbacks=[writer]).predict(module, _loader(shuffle=True), return_predictions=False)
    indices = [i for i, _ in writer.batches]
    assert sorted(x for batch in indices for x in batch) == list(range(21))  # type: ignore[union-attr]
    assert indices != sorted(indices)  # shuffled: the recorded order is the sampler's, not 0..20
    joined = join_predictions([tmp_path / "rank0.pt"])
    # In the sampler's order again: a row out of place differs by far more than the last bits, which a
    # linear layer may round differently in batches of other rows (the CPU's kernels choose by shape).
    torch.testing.assert_close(joined, torch.cat(expected), rtol=1e-6, atol=1e-6)  # type: ignore[arg-type]


def test_write_interval_is_checked_as_lightnings_misconfiguration() -> None:
    from trainer.errors import MisconfigurationException

    with pytest.raises(ValueError, match="batch_and_epoch"):
        BasePredictionWriter("step")
    with pytest.raises(MisconfigurationException, match=r"`write_interval` should be one of \['batch"):
        BasePredictionWriter("step")


@pytest.mark.slow
def test_ddp_shards_join_into_one_process_predictions_in_order(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = Doubler()
    expected = torch.cat(_trainer().predict(module, _loader()))  # type: ignore[arg-type]
    (tmp_path / "ddp").mkdir()
    trainer = _trainer(strategy="ddp_spawn", devices=2, accelerator="cpu", callbacks=[ShardWriter(tmp_path / "ddp")])
    trainer.predict(module, _loader(), return_predictions=False)
    shards = sorted((tmp_path / "ddp").glob("rank*.pt"))
    assert [p.name for p in shards] == ["rank0.pt", "rank1.pt"]
    sizes = [sum(len(b) for b in torch.load(p, weights_only=True)["batch_indices"]) for p in shards]
    assert sizes == [11, 10]  # 21 samples: uneven shards, no padded duplicate
    torch.testing.assert_close(join_predictions(shards), expected, rtol=1e-6, atol=1e-6)  # order, see above
