"""An empty training set is said, never trained on silently.

Before: ``fit`` on a loader with no batches counted through its epochs, trained nothing, and the
``geartrain`` command ended with exit 0 and "final metrics" as if it had trained. Lightning warns
"`Trainer.fit` stopped: No training batches." and stops; geartrain does the same in Python, naming
the dataset's size and batch size, and the command ends with exit 1 and what to check.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers.cli import run_geartrain
from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule


class Tiny(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_fit_on_an_empty_loader_warns_and_stops(tmp_path: Path) -> None:
    module = Tiny()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = quiet_trainer(tmp_path, max_epochs=3)
    loader = DataLoader(TensorDataset(torch.zeros(3, 2)), batch_size=4, drop_last=True)
    with pytest.warns(UserWarning, match=r"no batches \(a dataset of 3 samples, batch_size=4 with drop_last=True\)"):
        trainer.fit(module, loader)
    assert trainer.global_step == 0 and trainer.current_epoch == 0  # no epochs counted through
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())


def test_limit_train_batches_zero_is_a_choice_not_a_warning(tmp_path: Path, recwarn: pytest.WarningsRecorder) -> None:
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=0)
    trainer.fit(Tiny(), DataLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2))
    assert trainer.global_step == 0
    assert not [w for w in recwarn if "no batches" in str(w.message)]


@pytest.mark.slow
def test_the_command_refuses_an_empty_training_set(tmp_path: Path) -> None:
    (tmp_path / "empty_data.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch.utils.data import DataLoader, TensorDataset
            from trainer import DataModule

            class EmptyTrain(DataModule):
                def __init__(self, **kwargs):
                    super().__init__()

                def train_dataloader(self):
                    return DataLoader(TensorDataset(torch.zeros(0, 64), torch.zeros(0, dtype=torch.long)), batch_size=8)
            """
        )
    )
    result = run_geartrain(
        "data._target_=empty_data.EmptyTrain", "task=fit", "trainer.enable_progress_bar=false", cwd=tmp_path
    )
    assert result.returncode == 1, result.stdout[-2000:]
    assert "the training set gave no batches" in result.stderr and "Traceback" not in result.stderr
    assert "final metrics" not in result.stdout
