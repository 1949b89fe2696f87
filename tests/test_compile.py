"""``Trainer(compile=True)``: forward runs compiled, the module and its checkpoint keys stay as they are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule
from trainer.checkpoint.files import load_checkpoint


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
        self.forward_calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Batches:
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.items = [(torch.randn(16, 8, generator=g), torch.randn(16, 2, generator=g)) for _ in range(4)]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Any:
        return iter(self.items)


@pytest.mark.timeout(240)
def test_compile_trains_like_eager_and_checkpoints_have_plain_keys(tmp_path: Path) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager, compiled = Net(), Net()
    compiled.load_state_dict(eager.state_dict())
    keys = list(compiled.state_dict())
    kwargs: dict[str, Any] = dict(strategy="auto", num_sanity_val_steps=2, max_epochs=2)
    quiet_trainer(**kwargs).fit(eager, train_dataloaders=Batches())
    # aot_eager: dynamo capture and AOT autograd as inductor gets them, without its C++ build (45 s on 2 cores).
    trainer = quiet_trainer(**kwargs, compile=True, compile_kwargs={"backend": "aot_eager", "dynamic": False})
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    trainer.fit(compiled, train_dataloaders=Batches())
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > before  # forward went through dynamo
    assert trainer.module is compiled and list(compiled.state_dict()) == keys
    for a, b in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    state = load_checkpoint(tmp_path / "c.ckpt")
    assert list(state["state_dict"]) == keys  # no "_orig_mod." prefixes


@pytest.mark.timeout(240)
def test_fit_takes_a_torch_compiled_module_as_lightning_does(tmp_path: Path) -> None:
    # Lightning trains trainer.fit(torch.compile(model)); the wrapper is no TrainModule and was refused.
    torch._dynamo.reset()
    torch.manual_seed(0)
    ours, theirs = Net(), Net()
    theirs.load_state_dict(ours.state_dict())
    keys = list(theirs.state_dict())
    settings: dict[str, Any] = {"backend": "aot_eager", "dynamic": False}
    quiet_trainer(max_epochs=1, compile=True, compile_kwargs=settings).fit(ours, train_dataloaders=Batches())
    trainer = quiet_trainer(max_epochs=1)
    torch._dynamo.reset()  # the graph of the same class's forward would be reused
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    trainer.fit(torch.compile(theirs, **settings), train_dataloaders=Batches())
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > before  # with the wrapper's compiler
    assert trainer.module is theirs  # the user's module itself trained, its keys plain
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    assert list(load_checkpoint(tmp_path / "c.ckpt")["state_dict"]) == keys
