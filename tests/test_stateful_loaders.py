"""Training iterables with ``state_dict``/``load_state_dict``: their state in checkpoints, as Lightning keeps it.

A resume loads the saved state into the same iterables and continues from it (nothing dropped on
top), so a fit stopped after some steps and resumed ends with the weights of the uninterrupted fit.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule
from trainer.data.combined import CombinedLoader

DATA = torch.randn(12, 4, generator=torch.Generator().manual_seed(0))


class Stream:
    """Batches of DATA from ``position`` on; with ``stateful`` it saves and loads its position."""

    def __init__(self, start: int = 0, stateful: bool = True) -> None:
        self.position = start
        self.loads = 0
        if stateful:
            self.state_dict = lambda: {"position": self.position}  # type: ignore[method-assign]
            self.load_state_dict = self._load  # type: ignore[method-assign]

    def _load(self, state: dict[str, Any]) -> None:
        self.position, self.loads = state["position"], self.loads + 1

    def __iter__(self) -> Iterator[torch.Tensor]:
        while self.position < len(DATA):
            batch = DATA[self.position : self.position + 1]
            self.position += 1  # the batches handed out: a save after them resumes at the next one
            yield batch

    def __len__(self) -> int:
        return len(DATA)


class Model(TrainModule):
    def __init__(self, loader: Any) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.loader = loader
        self.seen: list[Any] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch)
        flat = batch if isinstance(batch, torch.Tensor) else torch.cat(list(batch))
        return self.layer(flat).pow(2).mean()

    def train_dataloader(self) -> Any:
        return self.loader

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(root: Path, loader: Any, max_steps: int, ckpt: Path | None = None) -> Model:
    torch.manual_seed(1)
    model = Model(loader)
    quiet_trainer(root, max_steps=max_steps).fit(model, ckpt_path=ckpt)
    return model


def test_a_stateful_loader_resumes_from_its_state_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    whole = _fit(tmp_path, Stream(), max_steps=6)
    torch.manual_seed(1)
    first = Model(Stream())
    trainer = quiet_trainer(tmp_path, max_steps=3)
    trainer.fit(first)
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    saved = torch.load(tmp_path / "a.ckpt", weights_only=True)
    assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"position": 3}]  # Lightning's place
    stream = Stream()
    rest = _fit(tmp_path, stream, max_steps=6, ckpt=tmp_path / "a.ckpt")
    assert stream.loads == 1
    # Its own state says where it stands: the three batches are not dropped once more on top.
    assert [torch.equal(a, b) for a, b in zip(rest.seen, whole.seen[3:])] == [True] * 3 and len(rest.seen) == 3
    for a, b in zip(rest.parameters(), whole.parameters()):
        assert torch.equal(a, b)


def test_a_loader_without_state_writes_none_and_is_still_continued(tmp_path: Path) -> None:
    whole = _fit(tmp_path, Stream(stateful=False), max_steps=5)
    first = Model(Stream(stateful=False))
    trainer = quiet_trainer(tmp_path, max_steps=2)
    trainer.fit(first)
    trainer.save_checkpoint(tmp_path / "b.ckpt")
    saved = torch.load(tmp_path / "b.ckpt", weights_only=True)
    assert "combined_loader" not in saved["loops"]["fit_loop"]["state_dict"]
    rest = _fit(tmp_path, Stream(stateful=False), max_steps=5, ckpt=tmp_path / "b.ckpt")
    assert [torch.equal(a, b) for a, b in zip(rest.seen, whole.seen[2:])] == [True] * 3  # dropped, as before


def test_a_collection_saves_each_stateful_member_and_the_others_start_over(tmp_path: Path) -> None:
    first = Model(CombinedLoader([Stream(5), Stream(0, stateful=False), Stream(2)]))
    trainer = quiet_trainer(tmp_path, max_steps=2)
    trainer.fit(first)
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    saved = torch.load(tmp_path / "c.ckpt", weights_only=True)
    assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"position": 7}, {"position": 4}]
    members = [Stream(5), Stream(0, stateful=False), Stream(2)]
    with pytest.warns(UserWarning, match="2 of the 3 training iterables continue from their saved state"):
        rest = _fit(tmp_path, CombinedLoader(members), max_steps=3, ckpt=tmp_path / "c.ckpt")
    expected = [DATA[7:8], DATA[0:1], DATA[4:5]]  # the one without state starts over, as in Lightning
    assert [torch.equal(a, b) for a, b in zip(rest.seen[0], expected)] == [True] * 3
    with pytest.raises(RuntimeError, match="has 1 stateful loaders, but found 2 states"):
        _fit(tmp_path, CombinedLoader([Stream(5), Stream(0, stateful=False)]), max_steps=3, ckpt=tmp_path / "c.ckpt")


def test_an_empty_list_of_training_loaders_trains_nothing(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="no batches"):
        model = _fit(tmp_path, [], max_steps=2)
    assert model.seen == []
