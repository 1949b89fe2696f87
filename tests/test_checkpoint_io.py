"""Checkpoint files: what the default ModelCheckpoint writes, safe loading, resume, clear errors, RNG state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.helpers.regression import Regressor, assert_same_weights, make_loader, sgd
from tests.helpers.trainers import quiet_trainer
from trainer.checkpoint.files import CheckpointError, load_checkpoint
from trainer.checkpoint.files import write_checkpoint as save_checkpoint


def sgd_with_epoch_decay(m: nn.Module) -> Any:
    opt = sgd(m)
    return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)}


class Remembering(Regressor):
    """Records hyperparameters and adds its own entry to checkpoints."""

    def __init__(self, width: int = 8) -> None:
        super().__init__(sgd_with_epoch_decay)
        self.save_hyperparameters()
        self.loaded: dict[str, Any] = {}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["user"] = {"note": "hello", "epoch": self.current_epoch}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.loaded = checkpoint["user"]


def checkpointing_trainer(root: Path, **kwargs: Any) -> Any:
    return quiet_trainer(root, enable_checkpointing=True, **kwargs)


def test_default_checkpoint_is_a_safe_complete_file(tmp_path: Path) -> None:
    trainer = checkpointing_trainer(tmp_path, max_epochs=2)
    trainer.fit(Remembering(), make_loader(10, 4), make_loader(4, 2))
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["epoch=1-step=6.ckpt", "last.ckpt"]

    ckpt = torch.load(folder / "last.ckpt", weights_only=True)  # no pickled code inside
    expected = {
        "format",
        "version",
        "state_dict",
        "optimizer_states",
        "lr_schedulers",
        "progress",
        "rng",
        "hyper_parameters",
    }
    assert expected <= set(ckpt)
    assert (ckpt["format"], ckpt["version"]) == ("geartrain", 2)
    assert ckpt["hyper_parameters"] == {"width": 8}
    assert ckpt["progress"]["epoch"] == 1 and ckpt["progress"]["global_step"] == 6
    assert ckpt["progress"]["epoch_finished"] is True
    assert ckpt["lr_schedulers"][0]["last_epoch"] == 2
    assert "momentum_buffer" in ckpt["optimizer_states"][0]["state"][0]
    assert ckpt["user"] == {"note": "hello", "epoch": 1}
    for name, value in ckpt["state_dict"].items():
        assert torch.equal(value, trainer.module.state_dict()[name])


def uninterrupted(root: Path, epochs: int) -> Remembering:
    module = Remembering()
    quiet_trainer(root, max_epochs=epochs).fit(module, make_loader(10, 4), make_loader(4, 2))
    return module


@pytest.mark.parametrize("how", ["path", "last"])
def test_resume_at_epoch_boundary_equals_uninterrupted_run(tmp_path: Path, how: str) -> None:
    reference = uninterrupted(tmp_path / "ref", epochs=4)

    root = tmp_path / "run"
    checkpointing_trainer(root, max_epochs=2).fit(Remembering(), make_loader(10, 4), make_loader(4, 2))
    resumed = Remembering()
    trainer = checkpointing_trainer(root, max_epochs=4)
    ckpt_path = root / "checkpoints" / "last.ckpt" if how == "path" else "last"
    trainer.fit(resumed, make_loader(10, 4), make_loader(4, 2), ckpt_path=ckpt_path)

    assert_same_weights(reference.net, resumed.net)
    assert (trainer.global_step, trainer.current_epoch) == (12, 4)  # finished epochs, as Lightning counts
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.05 * 0.7**4)
    assert resumed.loaded == {"note": "hello", "epoch": 1}


def test_validate_with_ckpt_path_loads_the_weights(tmp_path: Path) -> None:
    trained = uninterrupted(tmp_path / "a", epochs=1)
    path = tmp_path / "trained.ckpt"
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(trained, make_loader(10, 4))
    trainer.save_checkpoint(path)
    fresh = Remembering()
    expected = quiet_trainer(tmp_path).validate(trained, make_loader(4, 2))[0]
    assert quiet_trainer(tmp_path).validate(fresh, make_loader(4, 2), ckpt_path=path)[0] == expected
    assert_same_weights(trained.net, fresh.net)


def test_checkpoint_of_another_model_lists_missing_and_unexpected_keys(tmp_path: Path) -> None:
    class Other(Regressor):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1), nn.Linear(1, 1))
            self.head = nn.Linear(1, 1)

    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(Regressor(), make_loader(4, 2))
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    with pytest.raises(CheckpointError, match=r"does not match Other") as info:
        quiet_trainer(tmp_path).validate(Other(), make_loader(4, 2), ckpt_path=tmp_path / "a.ckpt")
    message = str(info.value)
    assert "missing keys (4): head.bias, head.weight, net.3.bias, net.3.weight" in message
    assert "unexpected keys" not in message

    class Narrow(Regressor):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 3), nn.Tanh())

    with pytest.raises(CheckpointError) as info:
        quiet_trainer(tmp_path).validate(Narrow(), make_loader(4, 2), ckpt_path=tmp_path / "a.ckpt")
    message = str(info.value)
    assert "unexpected keys (2): net.2.bias, net.2.weight" in message
    assert "shape mismatches (2): net.0.bias: checkpoint (8,) vs model (3,)" in message


def test_weights_only_checkpoint_cannot_resume(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(Regressor(), make_loader(4, 2))
    trainer.save_checkpoint(tmp_path / "w.ckpt", weights_only=True)
    assert "optimizer_states" not in torch.load(tmp_path / "w.ckpt", weights_only=True)
    with pytest.raises(CheckpointError, match="holds weights only; it cannot resume training"):
        quiet_trainer(tmp_path, max_epochs=2).fit(Regressor(), make_loader(4, 2), ckpt_path=tmp_path / "w.ckpt")


def test_last_before_any_save_warns_and_trains_from_scratch(tmp_path: Path) -> None:
    """As Lightning: a job script may pass ckpt_path="last" from its first start on (set and forget)."""
    reference = Regressor()
    quiet_trainer(tmp_path / "ref", max_epochs=1).fit(reference, make_loader(4, 2))
    module = Regressor()
    trainer = checkpointing_trainer(tmp_path, max_epochs=1)
    with pytest.warns(
        UserWarning, match=r'\.fit\(ckpt_path="last"\) is set, but there is no last checkpoint available'
    ):
        trainer.fit(module, make_loader(4, 2), ckpt_path="last")
    assert trainer.ckpt_path is None and trainer.global_step == 2 and trainer.current_epoch == 1
    assert_same_weights(reference.net, module.net)  # trained from its own initial weights, as without ckpt_path
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()  # the next start resumes from it
    with pytest.warns(UserWarning, match="no last checkpoint available. No checkpoint will be loaded"):
        quiet_trainer(tmp_path / "eval").validate(Regressor(), make_loader(4, 2), ckpt_path="last")
    with pytest.raises(CheckpointError, match="ckpt_path='best': no such checkpoint has been saved yet"):
        checkpointing_trainer(tmp_path / "b").validate(Regressor(), make_loader(4, 2), ckpt_path="best")


class Custom:
    pass


def test_load_refuses_pickles_foreign_files_and_newer_versions(tmp_path: Path) -> None:
    torch.save({"format": "geartrain", "version": 1, "obj": Custom()}, tmp_path / "pickled.ckpt")
    with pytest.raises(CheckpointError, match="holds pickled Python objects"):
        load_checkpoint(tmp_path / "pickled.ckpt")
    torch.save({"weight": torch.ones(1)}, tmp_path / "plain.pt")
    with pytest.raises(CheckpointError, match=r"is not a geartrain checkpoint .*\['weight'\]"):
        load_checkpoint(tmp_path / "plain.pt")
    torch.save({"format": "geartrain", "version": 99}, tmp_path / "future.ckpt")
    with pytest.raises(CheckpointError, match="format version 99, newer than this geartrain reads"):
        load_checkpoint(tmp_path / "future.ckpt")
    (tmp_path / "cut.ckpt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(CheckpointError, match="not a readable torch file"):
        load_checkpoint(tmp_path / "cut.ckpt")
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.ckpt")


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    save_checkpoint({"format": "geartrain", "version": 1, "x": torch.ones(1)}, path)
    with pytest.raises(CheckpointError, match=f"Could not write checkpoint {path}"):
        save_checkpoint({"bad": lambda: None}, path)  # a lambda cannot be serialised
    assert [p.name for p in tmp_path.iterdir()] == ["c.ckpt"]
    assert torch.equal(load_checkpoint(path)["x"], torch.ones(1))


def test_python_rng_state_is_one_tensor_and_older_list_checkpoints_still_restore() -> None:
    import random

    from trainer.common.rng import rng_state, set_rng_state

    random.seed(3)
    state = rng_state()
    expected = [random.random() for _ in range(3)]
    assert isinstance(state["python"][1], torch.Tensor) and state["python"][1].dtype == torch.int64
    set_rng_state(state)
    assert [random.random() for _ in range(3)] == expected
    old_format = {**state, "python": [state["python"][0], state["python"][1].tolist(), state["python"][2]]}
    set_rng_state(old_format)
    assert [random.random() for _ in range(3)] == expected
