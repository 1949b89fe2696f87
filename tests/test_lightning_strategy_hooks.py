"""Lightning's strategy hooks that user code calls or overrides: ``connect`` by hand, ``lightning_module``,
``load_optimizer_state_dict(checkpoint)`` and ``lightning_restore_optimizer``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from strategies import SingleDeviceStrategy
from tests.helpers.regression import Regressor, make_loader
from tests.helpers.trainers import quiet_trainer


def test_connect_by_hand_makes_the_module_the_trainers() -> None:
    """``trainer.strategy.connect(model)`` before any run: ``trainer.lightning_module`` and ``trainer.model`` are the
    module (Lightning's users then set ``trainer.lightning_module.trainer = trainer`` and call strategy methods)."""
    trainer = quiet_trainer()
    model = Regressor()
    assert trainer.lightning_module is None and trainer.strategy.lightning_module is None
    trainer.strategy.connect(model)
    assert trainer.strategy.lightning_module is model
    assert trainer.lightning_module is model and trainer.model is model
    trainer.lightning_module.trainer = trainer
    assert model.trainer is trainer


class _Recording(SingleDeviceStrategy):
    """Records the checkpoint ``load_optimizer_state_dict`` is given; restores optimizers only when ``restore``."""

    def __init__(self, restore: bool) -> None:
        super().__init__(device="cpu")
        self.restore = restore
        self.given: list[Mapping[str, Any]] = []

    @property
    def lightning_restore_optimizer(self) -> bool:
        return self.restore

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        self.given.append(checkpoint)
        super().load_optimizer_state_dict(checkpoint)


def _resumed(tmp_path: Path, restore: bool) -> tuple[_Recording, dict[str, Any], dict[str, Any]]:
    """Fit one epoch, save, resume at that point under ``_Recording(restore)``: the strategy, the saved
    optimizer state and the resumed trainer's optimizer state."""
    first = quiet_trainer(tmp_path, max_epochs=1)
    first.fit(Regressor(), make_loader())
    path = tmp_path / "one.ckpt"
    first.save_checkpoint(path)
    saved = first.optimizers[0].state_dict()
    strategy = _Recording(restore)
    second = quiet_trainer(tmp_path, max_epochs=1, strategy=strategy)
    second.fit(Regressor(seed=1), make_loader(), ckpt_path=path)  # nothing left to train: the state as restored
    return strategy, saved, second.optimizers[0].state_dict()


def test_load_optimizer_state_dict_gets_the_whole_checkpoint(tmp_path: Path) -> None:
    """The trainer calls Lightning's hook with the whole checkpoint it read; the base restores each optimizer."""
    strategy, saved, resumed = _resumed(tmp_path, restore=True)
    assert len(strategy.given) == 1
    checkpoint = strategy.given[0]
    assert "state_dict" in checkpoint and len(checkpoint["optimizer_states"]) == 1
    assert saved["state"] and resumed["state"].keys() == saved["state"].keys()
    for key, state in saved["state"].items():
        assert torch.equal(resumed["state"][key]["momentum_buffer"], state["momentum_buffer"])


def test_lightning_restore_optimizer_false_leaves_the_optimizers_to_the_strategy(tmp_path: Path) -> None:
    """A strategy whose ``lightning_restore_optimizer`` is False is not asked; the optimizers keep a fresh state."""
    strategy, saved, resumed = _resumed(tmp_path, restore=False)
    assert strategy.given == []
    assert saved["state"] and not resumed["state"]


def test_strategy_optimizers_are_the_trainers_once_connected() -> None:
    """``strategy.optimizers`` (settable, as Lightning's): kept on the strategy until a module with a trainer is
    connected, then read from and written to ``trainer.optimizers``, the one place the run holds them."""
    trainer = quiet_trainer()
    model = Regressor()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer.strategy.optimizers = [sgd]
    assert trainer.strategy.optimizers == [sgd] and trainer.optimizers == []
    trainer.strategy.connect(model)
    model.trainer = trainer
    assert trainer.strategy.optimizers == []
    trainer.strategy.optimizers = [sgd]
    assert trainer.optimizers == [sgd] and trainer.strategy.optimizers == [sgd]
