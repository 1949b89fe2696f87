"""Lightning's data and module API under 2-process DDP (gloo, CPU): prepare_data once, all_gather, ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.distributed import spawn
from tests.helpers.regression import Regressor, make_loader
from tests.helpers.trainers import quiet_trainer
from trainer.datamodule import DataModule

pytestmark = pytest.mark.slow  # starts processes


class MarkingData(DataModule):
    """``prepare_data`` appends a line to a shared file; ``setup`` records that it ran."""

    def __init__(self, root: str, per_node: bool) -> None:
        super().__init__()
        self.root = root
        self.prepare_data_per_node = per_node
        self.setup_ran = False

    def prepare_data(self) -> None:
        with open(Path(self.root) / "prepared.txt", "a") as f:
            f.write("datamodule\n")

    def setup(self, stage: str) -> None:
        assert (Path(self.root) / "prepared.txt").exists()  # the barrier: rank 1 waits for rank 0's files
        self.setup_ran = True

    def train_dataloader(self) -> Any:
        return make_loader(8, 2)


class Gathering(Regressor):
    def __init__(self, root: str) -> None:
        super().__init__()
        self.root = root
        self.gathered: list[torch.Tensor] = []
        self.grad_ok = False

    def prepare_data(self) -> None:
        with open(Path(self.root) / "prepared.txt", "a") as f:
            f.write("module\n")

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        rank = torch.tensor([float(self.global_rank)])
        self.gathered.append(self.all_gather({"rank": rank})["rank"])
        if batch_idx == 0:
            both = self.all_gather(loss, sync_grads=True)
            self.grad_ok = both.shape == (2,) and both.requires_grad
        return loss


def rank_job(root: str, per_node: bool) -> dict[str, Any]:
    module, data = Gathering(root), MarkingData(root, per_node)
    quiet_trainer(root, strategy="ddp", max_epochs=1).fit(module, datamodule=data)
    return {
        "rank": (module.global_rank, module.local_rank),
        "gathered": module.gathered[0].flatten().tolist(),
        "grad_ok": module.grad_ok,
        "setup_ran": data.setup_ran,
    }


@pytest.mark.timeout(180)
def test_prepare_data_runs_once_per_node_under_ddp(tmp_path: Path) -> None:
    results = spawn(rank_job, str(tmp_path), True, world_size=2)
    assert (tmp_path / "prepared.txt").read_text() == "datamodule\nmodule\n"  # once, data module first
    assert [r["rank"] for r in results] == [(0, 0), (1, 1)]
    assert all(r["setup_ran"] for r in results)  # setup on every rank
    assert all(r["gathered"] == [0.0, 1.0] for r in results)
    assert all(r["grad_ok"] for r in results)
