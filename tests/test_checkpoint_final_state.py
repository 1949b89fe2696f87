"""The final ``last.ckpt`` of a run holds the run's final state (issue #18, item 5).

An ``EarlyStopping``-ended run used to keep, in its final ``last.ckpt``, the callback state from
before the last validation: ``on_fit_end`` did not save again when the step had not changed, and the
checkpoint callback ran before early stopping in the epoch's end hooks. Now ``last.ckpt`` is written
again at the fit's end when a validation pass or an epoch's end came after the last save, and
checkpoint callbacks run last in every hook (as in Lightning).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback, EarlyStopping, ModelCheckpoint
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule
from trainer.checkpoint.files import load_checkpoint


class Flat(TrainModule):
    """Validation loss that never improves after the first epoch: early stopping ends the run."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val/loss", torch.tensor(1.0))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loaders() -> dict[str, Any]:
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(0))
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    return {"train_dataloaders": DataLoader(data, batch_size=4), "val_dataloaders": DataLoader(data, batch_size=8)}


def _early_stopping_state(path: Path, es: EarlyStopping) -> dict[str, Any]:
    state = load_checkpoint(path)["callbacks"][es.state_key]
    return {k: v.item() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def _now(es: EarlyStopping) -> dict[str, Any]:
    return {k: v.item() if isinstance(v, torch.Tensor) else v for k, v in es.state_dict().items()}


@pytest.mark.parametrize("check_on_train_epoch_end", [None, False])
def test_an_early_stopped_runs_last_ckpt_holds_the_state_after_the_last_validation(
    tmp_path: Path, check_on_train_epoch_end: bool | None
) -> None:
    # Saves every 4 steps: the epoch's last batch; the epoch's validation comes after that save.
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4, save_top_k=0, save_last=True)
    es = EarlyStopping(monitor="val/loss", patience=2, check_on_train_epoch_end=check_on_train_epoch_end)
    trainer = quiet_trainer(tmp_path, [ckpt, es], enable_checkpointing=True, max_epochs=20)
    trainer.fit(Flat(), **loaders())
    assert es.stopped_epoch == 2 and trainer.current_epoch < 19  # stopped early
    assert _early_stopping_state(tmp_path / "last.ckpt", es) == _now(es)
    progress = load_checkpoint(tmp_path / "last.ckpt")["progress"]
    assert progress == trainer.progress.state_dict()


def test_an_epoch_end_checkpoint_holds_early_stoppings_count_of_that_epoch(tmp_path: Path) -> None:
    # The default ModelCheckpoint comes first in the list; it still saves after early stopping's check.
    es = EarlyStopping(monitor="val/loss", patience=5)
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []

    class Compare(Callback):
        def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
            if trainer.current_epoch:
                seen.append((_early_stopping_state(trainer.checkpointing.last_path(), es), _now(es)))

    trainer = quiet_trainer(tmp_path, [es, Compare()], enable_checkpointing=True, max_epochs=4)
    assert type(trainer.callbacks[-1]) is ModelCheckpoint
    trainer.fit(Flat(), **loaders())
    assert len(seen) == 3 and all(saved == now for saved, now in seen)
    assert [now["wait_count"] for _, now in seen] == [0, 1, 2]
