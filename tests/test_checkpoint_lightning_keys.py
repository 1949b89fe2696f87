"""geartrain's checkpoints carry Lightning's keys, laid out as Lightning 2.6 reads them (issue 23).

Lightning is not a dependency, so Lightning itself reading our files is checked by hand with
``tests/data/check_lightning_reads_ours.py``. Here the same twin runs (``tests/data/geartrain/
make_checkpoints.py`` for geartrain, ``tests/data/lightning/make_checkpoints.py`` for Lightning:
one regression, two epochs) are compared entry by entry: what Lightning's ``_CheckpointConnector``
restores from (``state_dict``, ``optimizer_states``, ``lr_schedulers``, ``loops``, ``callbacks``
by ``state_key``) and what tools read (``epoch``, ``global_step``, ``hyper_parameters``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from tests.helpers.trainers import quiet_trainer
from trainer.checkpoint.files import FORMAT_VERSION, load_checkpoint
from trainer.checkpoint.format import lightning_resume_state
from trainer.checkpoint.reader import read_checkpoint

DATA = Path(__file__).parent / "data"

#: Counters Lightning keeps and geartrain does not (optimizer steps of the epoch so far, scheduler
#: steps): written as 0. Lightning restores nothing from them (its global step is the total).
UNTRACKED = (
    "fit_loop/epoch_loop.automatic_optimization.optim_progress/optimizer/step/current/",
    "fit_loop/epoch_loop.automatic_optimization.optim_progress/optimizer/zero_grad/current/",
    "fit_loop/epoch_loop.scheduler_progress/",
)
#: geartrain's own loop state beside Lightning's (the sampler's order, how batches were formed).
OURS = ("epoch_rng/", "batches/")


def _maker() -> Any:
    spec = importlib.util.spec_from_file_location(
        "make_geartrain_checkpoints", DATA / "geartrain" / "make_checkpoints.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This geartrain's files of the twin run (after 2 epochs; after 6 steps, mid-epoch; 4 epochs' weights)."""
    out = tmp_path_factory.mktemp("geartrain_files")
    _maker().main(out)
    return out


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_a_file_holds_what_lightning_restores_from_as_lightning_writes_it(written: Path) -> None:
    ours = torch.load(written / f"v{FORMAT_VERSION}_epoch2.ckpt", weights_only=True)
    lightning = read_checkpoint(DATA / "lightning" / "epoch2.ckpt")  # the same run, by Lightning 2.6

    assert (ours["epoch"], ours["global_step"]) == (lightning["epoch"], lightning["global_step"]) == (2, 8)
    assert ours["pytorch-lightning_version"] == "2.6.6"  # >= 1.5: Lightning finds callback states by state_key
    assert ours["hyper_parameters"] == lightning["hyper_parameters"]
    assert ours["state_dict"].keys() == lightning["state_dict"].keys()
    for name, value in ours["state_dict"].items():
        assert value.shape == lightning["state_dict"][name].shape and value.dtype == lightning["state_dict"][name].dtype
    # One state per optimizer and scheduler, in torch's own layout (Lightning hands them to load_state_dict).
    assert len(ours["optimizer_states"]) == len(lightning["optimizer_states"]) == 1
    assert ours["optimizer_states"][0]["param_groups"] == lightning["optimizer_states"][0]["param_groups"]
    assert ours["optimizer_states"][0]["state"].keys() == lightning["optimizer_states"][0]["state"].keys()
    assert ours["lr_schedulers"] == lightning["lr_schedulers"]
    assert isinstance(ours["callbacks"], dict)

    # Lightning's loop state: the same entries, the same counters (those geartrain keeps).
    mine, theirs = flat(ours["loops"]), flat(lightning["loops"])
    assert {k for k in mine if not k.startswith(OURS)} == set(theirs)
    for key, value in theirs.items():
        if key.startswith(UNTRACKED):
            assert mine[key] == 0, key
        else:
            assert mine[key] == value and type(mine[key]) is type(value), key
    # Both runs trained the same: the weights agree (to rounding; the order of float ops may differ).
    for name, value in ours["state_dict"].items():
        torch.testing.assert_close(value, lightning["state_dict"][name])


@pytest.mark.parametrize(
    ("name", "progress"),
    [
        ("epoch2", {"epoch": 1, "global_step": 8, "batch_in_epoch": 4, "epoch_finished": True}),
        ("step6", {"epoch": 1, "global_step": 6, "batch_in_epoch": 2}),
    ],
)
def test_lightnings_reading_of_the_loops_is_geartrains_progress(
    written: Path, name: str, progress: dict[str, Any]
) -> None:
    """Read as Lightning reads it (loops only, geartrain's entries removed), a file resumes where geartrain's does."""
    ours = torch.load(written / f"v{FORMAT_VERSION}_{name}.ckpt", weights_only=True)
    assert {k: ours["progress"][k] for k in progress} == progress
    as_lightning = {k: v for k, v in ours.items() if k not in ("format", "version", "progress")}
    assert lightning_resume_state(as_lightning)["progress"] == progress
    assert (ours["epoch"], ours["global_step"]) == ((2, 8) if name == "epoch2" else (1, 6))


def test_a_weights_only_file_has_lightnings_keys_too(tmp_path: Path) -> None:
    maker = _maker()
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(maker.Regression(), DataLoader(maker.data(), batch_size=4))
    trainer.save_checkpoint(tmp_path / "w.ckpt", weights_only=True)
    state = torch.load(tmp_path / "w.ckpt", weights_only=True)
    assert {"epoch", "global_step", "pytorch-lightning_version", "state_dict", "loops", "hyper_parameters"} <= set(
        state
    )
    assert "optimizer_states" not in state and "lr_schedulers" not in state  # as Lightning's weights_only
    assert set(state["loops"]) == {"fit_loop", "validate_loop", "test_loop", "predict_loop"}


@pytest.mark.parametrize("version", [1, FORMAT_VERSION])
def test_files_of_every_format_version_load_and_resume_exactly(tmp_path: Path, version: int) -> None:
    """The committed files of each version (version 1: ``optimizers``/``hparams``) keep loading and resuming."""
    maker = _maker()
    folder = DATA / "geartrain"
    state = load_checkpoint(folder / f"v{version}_epoch2.ckpt")
    assert "optimizers" not in state and "hparams" not in state  # read in the current layout
    assert (state["epoch"], state["global_step"]) == (2, 8)
    model = maker.Regression.load_from_checkpoint(folder / f"v{version}_epoch2.ckpt")
    assert dict(model.hparams) == {"in_dim": 4, "out_dim": 2, "lr": 0.1, "tags": ("a", 1)}

    expected = torch.load(folder / f"v{version}_epoch4_weights.pt", weights_only=True)
    resumed = maker.Regression()
    trainer = quiet_trainer(tmp_path, max_epochs=4)
    loader = DataLoader(maker.data(), batch_size=4, shuffle=False)
    trainer.fit(resumed, loader, ckpt_path=folder / f"v{version}_epoch2.ckpt")
    assert trainer.global_step == 16
    for name, value in resumed.state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_a_callback_with_an_empty_state_has_no_entry_as_in_lightning(tmp_path: Path) -> None:
    """Lightning keeps a callback's ``state_dict()`` only when it holds something; an override returning nothing (None)
    is left out too, so no ``load_state_dict(None)`` follows on resume or after a ``ddp_spawn`` run."""
    from callbacks import Callback
    from tests.helpers.regression import Regressor, make_loader

    class Empty(Callback):
        pass

    class ReturnsNothing(Callback):
        def state_dict(self) -> Any:
            return None

    class Holds(Callback):
        def state_dict(self) -> dict[str, Any]:
            return {"n": 1}

    holds = Holds()
    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[Empty(), ReturnsNothing(), holds])
    trainer.fit(Regressor(), make_loader())
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    assert torch.load(tmp_path / "c.ckpt", weights_only=True)["callbacks"] == {holds.state_key: {"n": 1}}
