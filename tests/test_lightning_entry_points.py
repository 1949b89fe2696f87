"""The Trainer's entry points and checkpoint loading as Lightning 2.6's public behaviour has them.

Each case is a difference Lightning's own test suite found (see docs/lightning.md): the exception a
missing ``ckpt_path`` raises, ``strict_loading = False`` honoured when the Trainer restores weights,
torch's wording of a key mismatch, ``load_from_checkpoint`` with an ``hparams_file`` a run never
wrote, ``trainer.max_epochs`` before the first ``fit``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from callbacks import BasePredictionWriter, Callback, EarlyStopping, ModelCheckpoint
from tests.helpers.tiny_mlp import TinyMLP, make_batches
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule
from trainer.errors import CheckpointError, MisconfigurationException


class Wider(TinyMLP):
    """TinyMLP with one more layer its checkpoints from a plain TinyMLP do not hold."""

    def __init__(self) -> None:
        super().__init__(log_loss=False)
        self.extra = nn.Linear(3, 3)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.net.parameters(), lr=0.05)  # the extra layer is not trained


def _fitted(tmp_path: Path, steps: int = 2) -> tuple[TinyMLP, Path]:
    torch.manual_seed(0)
    model = TinyMLP(log_loss=False)
    trainer = quiet_trainer(tmp_path, max_steps=steps)
    trainer.fit(model, make_batches(4))
    path = tmp_path / "fitted.ckpt"
    trainer.save_checkpoint(path)
    return model, path


# ----------------------------------------------------------------------------- a missing checkpoint
@pytest.mark.parametrize("fn", ["fit", "validate", "test", "predict"])
def test_a_missing_ckpt_path_is_a_file_not_found_error(tmp_path: Path, fn: str) -> None:
    trainer = quiet_trainer(tmp_path, max_steps=1)
    missing = tmp_path / "non_existing.ckpt"
    with pytest.raises(FileNotFoundError, match=r"Checkpoint file not found: .*non_existing\.ckpt") as info:
        getattr(trainer, fn)(TinyMLP(), make_batches(1), ckpt_path=str(missing))
    assert isinstance(info.value, CheckpointError)  # geartrain's own type still catches it
    assert "does not exist" in str(info.value)


# ----------------------------------------------------------------------------- strict loading
def test_the_trainer_restores_with_the_modules_strict_loading(tmp_path: Path) -> None:
    fitted, path = _fitted(tmp_path)
    wider = Wider()
    extra = wider.extra.weight.detach().clone()
    with pytest.raises(CheckpointError, match=r'Missing key\(s\) in state_dict: "extra.weight", "extra.bias"'):
        quiet_trainer(tmp_path, max_steps=2).validate(wider, make_batches(1), ckpt_path=path, verbose=False)
    wider.strict_loading = False  # Lightning's Trainer loads with strict=module.strict_loading
    quiet_trainer(tmp_path, max_steps=2).validate(wider, make_batches(1), ckpt_path=path, verbose=False)
    for name, value in fitted.state_dict().items():
        assert torch.equal(wider.state_dict()[name], value), name
    assert torch.equal(wider.extra.weight, extra)  # not in the checkpoint: kept as built


def test_a_fit_resumed_without_strict_loading_trains_as_the_uninterrupted_run(tmp_path: Path) -> None:
    """Resuming a Wider from a TinyMLP's checkpoint ends with the weights a TinyMLP gets from the same resume."""
    _, path = _fitted(tmp_path, steps=2)
    plain = TinyMLP(log_loss=False)
    quiet_trainer(tmp_path, max_steps=4).fit(plain, make_batches(4), ckpt_path=path)
    wider = Wider()
    wider.strict_loading = False
    quiet_trainer(tmp_path, max_steps=4).fit(wider, make_batches(4), ckpt_path=path)
    for name, value in plain.state_dict().items():
        assert torch.equal(wider.state_dict()[name], value), name


def test_a_key_mismatch_reads_as_torchs(tmp_path: Path) -> None:
    _, path = _fitted(tmp_path)
    with pytest.raises(CheckpointError) as info:
        Wider.load_from_checkpoint(path)
    message = str(info.value)
    assert "missing keys (2): extra.bias, extra.weight" in message  # geartrain's summary stays
    assert (
        'Error(s) in loading state_dict for Wider:\n\tMissing key(s) in state_dict: "extra.weight", "extra.bias". '
        in (message)
    )
    torch.save({"state_dict": Wider().state_dict()}, tmp_path / "wider.ckpt")
    with pytest.raises(CheckpointError, match=r'Unexpected key\(s\) in state_dict: "extra.weight", "extra.bias"'):
        TinyMLP.load_from_checkpoint(tmp_path / "wider.ckpt")


# ----------------------------------------------------------------------------- hparams_file
def test_an_hparams_file_that_was_never_written_warns_and_loads(tmp_path: Path) -> None:
    fitted, path = _fitted(tmp_path)
    missing = tmp_path / "lightning_logs" / "version_0" / "hparams.yaml"
    with pytest.warns(RuntimeWarning, match=r"Missing Tags: .*hparams\.yaml"):
        loaded = TinyMLP.load_from_checkpoint(path, hparams_file=missing)
    for name, value in fitted.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name


# ----------------------------------------------------------------------------- max_epochs
class _StopAfterOneEpoch(Callback):
    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        trainer.should_stop = True


@pytest.mark.parametrize(
    ("given", "before", "after"),
    [
        ({}, None, 1000),
        ({"max_steps": 2}, None, -1),
        ({"max_epochs": 3}, 3, 3),
        ({"max_epochs": -1, "max_steps": 2}, -1, -1),
    ],
)
def test_max_epochs_is_unset_until_fit_resolves_it(
    tmp_path: Path, given: dict[str, Any], before: int | None, after: int
) -> None:
    trainer = quiet_trainer(tmp_path, callbacks=[_StopAfterOneEpoch()], limit_train_batches=1, **given)
    assert trainer.max_epochs == before
    trainer.validate(TinyMLP(), make_batches(1), verbose=False)
    assert trainer.max_epochs == before  # validate leaves it, as Lightning's does
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(TinyMLP(), make_batches(1))
    assert trainer.max_epochs == after
    said = [str(w.message) for w in caught if "Setting it to 1000 epochs" in str(w.message)]
    assert len(said) == (after == 1000)


def test_negative_limits_are_refused_in_lightnings_words() -> None:
    with pytest.raises(MisconfigurationException, match=r"`max_epochs` must be a non-negative integer or -1"):
        quiet_trainer(max_epochs=-100)
    with pytest.raises(MisconfigurationException, match=r"`max_steps` must be a non-negative integer or -1"):
        quiet_trainer(max_steps=-2)


# ----------------------------------------------------------------------------- save_checkpoint, "last"
def test_save_checkpoint_before_any_entry_point_is_an_attribute_error(tmp_path: Path) -> None:
    with pytest.raises(AttributeError, match="Saving a checkpoint is only possible if a model is attached"):
        quiet_trainer(tmp_path).save_checkpoint(tmp_path / "checkpoint.ckpt")
    assert not (tmp_path / "checkpoint.ckpt").exists()


def test_ckpt_path_last_without_a_last_file_loads_nothing(tmp_path: Path) -> None:
    """``save_last=False``: "last" names no file, so nothing is loaded (not the newest top-k file)."""
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=False)
    trainer = quiet_trainer(tmp_path, [checkpoint], enable_checkpointing=True, max_epochs=1)
    trainer.fit(TinyMLP(), make_batches(2))
    assert checkpoint.best_model_path and not checkpoint.last_model_path
    with pytest.warns(UserWarning, match="No checkpoint will be loaded"):
        trainer.validate(dataloaders=make_batches(1), ckpt_path="last", verbose=False)
    assert trainer.ckpt_path is None


# ----------------------------------------------------------------------------- metrics per entry point
class _MetricsAtStart(Callback):
    def __init__(self) -> None:
        self.seen: dict[str, list[dict[str, Any]]] = {}

    def _see(self, trainer: Trainer, hook: str) -> None:
        self.seen[hook] = [dict(trainer.callback_metrics), dict(trainer.logged_metrics), trainer.progress_bar_metrics]

    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._see(trainer, "train")

    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not trainer.training and trainer.state.fn == "validate":
            self._see(trainer, "validate")

    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._see(trainer, "test")


def test_each_entry_point_starts_with_no_metrics(tmp_path: Path) -> None:
    seen = _MetricsAtStart()
    trainer = quiet_trainer(tmp_path, [seen], max_steps=2)
    model = TinyMLP()
    model.test_step = model.validation_step  # type: ignore[method-assign]
    trainer.fit(model, make_batches(2), make_batches(1))
    assert {"train/loss", "val/loss"} <= set(trainer.callback_metrics) and "val/loss" in trainer.logged_metrics
    trainer.validate(model, make_batches(1), verbose=False)
    trainer.test(model, make_batches(1), verbose=False)
    assert seen.seen == {hook: [{}, {}, {}] for hook in ("train", "validate", "test")}


# ----------------------------------------------------------------------------- resuming past max_epochs
def test_resuming_a_checkpoint_past_max_epochs_is_refused(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, max_epochs=3)
    trainer.fit(TinyMLP(), make_batches(1))
    trainer.save_checkpoint(tmp_path / "epoch3.ckpt")
    again = quiet_trainer(tmp_path, max_epochs=3)  # as many epochs as done: nothing left to train, no error
    again.fit(TinyMLP(), make_batches(1), ckpt_path=tmp_path / "epoch3.ckpt")
    assert again.global_step == 3
    with pytest.raises(MisconfigurationException, match=r"current_epoch=3, but you have set Trainer\(max_epochs=1\)"):
        quiet_trainer(tmp_path, max_epochs=1).fit(TinyMLP(), make_batches(1), ckpt_path=tmp_path / "epoch3.ckpt")


def test_early_stopping_checks_through_lightnings_method(tmp_path: Path) -> None:
    """Lightning's tests count ``EarlyStopping._run_early_stopping_check`` calls: one per check."""
    stopper = EarlyStopping(monitor="val/loss")
    calls: list[int] = []
    original = stopper._run_early_stopping_check
    stopper._run_early_stopping_check = lambda trainer: calls.append(trainer.current_epoch) or original(trainer)  # type: ignore[method-assign]
    quiet_trainer(tmp_path, [stopper], max_epochs=3).fit(TinyMLP(), make_batches(1), make_batches(1))
    assert calls == [0, 1, 2] and stopper.stopped_epoch == 0


def test_a_checkpoint_callback_beside_enable_checkpointing_false_is_refused(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path)
    with pytest.raises(MisconfigurationException, match="`enable_checkpointing=False` but found `ModelCheckpoint`"):
        Trainer(default_root_dir=tmp_path, enable_checkpointing=False, callbacks=[checkpoint], logger=False)
    given = Trainer(default_root_dir=tmp_path, callbacks=[checkpoint], logger=False)  # the default: the one given
    assert given.checkpoint_callbacks == [checkpoint]


# ----------------------------------------------------------------------------- a checkpoint at a URL
@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """``tmp_path / "served"`` behind a local HTTP server (its base URL); torch hub's cache in ``tmp_path``."""
    import functools
    import http.server
    import threading

    folder = tmp_path / "served"
    folder.mkdir()
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_checkpoint_at_an_http_url_loads_as_the_local_file(served: tuple[Path, str], tmp_path: Path) -> None:
    folder, base = served
    fitted, path = _fitted(tmp_path)
    (folder / "fitted.ckpt").write_bytes(path.read_bytes())
    url = f"{base}/fitted.ckpt"
    loaded = TinyMLP.load_from_checkpoint(url)
    for name, value in fitted.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    from_file, from_url = TinyMLP(log_loss=False), TinyMLP(log_loss=False)
    quiet_trainer(tmp_path, max_steps=4).fit(from_file, make_batches(4), ckpt_path=path)
    resumed = quiet_trainer(tmp_path, max_steps=4)
    resumed.fit(from_url, make_batches(4), ckpt_path=url)  # resumes exactly, as from the file
    assert resumed.global_step == 4
    for name, value in from_file.state_dict().items():
        assert torch.equal(from_url.state_dict()[name], value), name
    with pytest.raises(CheckpointError, match="could not be downloaded"):
        TinyMLP.load_from_checkpoint(f"{base}/missing.ckpt")


def test_default_root_dir_is_a_string_with_home_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for given in ("~/runs", Path("~/runs"), "~/runs/../runs/"):
        assert Trainer(default_root_dir=given, logger=False).default_root_dir == str(tmp_path / "runs")
    trainer = quiet_trainer("~/runs", [ModelCheckpoint()], max_steps=1)
    trainer.fit(TinyMLP(), make_batches(1))
    assert (tmp_path / "runs" / "checkpoints" / "epoch=0-step=1.ckpt").is_file()


# ----------------------------------------------------------------------------- predict
class _Rows(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.ones(3, 32))


class _IndicesSeen(BasePredictionWriter):
    def __init__(self) -> None:
        super().__init__("batch_and_epoch")
        self.per_batch: list[Any] = []
        self.at_epoch_end: list[Any] = []

    def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: Any, batch_indices: Any, *_: Any) -> None:
        self.per_batch.append(batch_indices)

    def write_on_epoch_end(self, trainer: Any, pl_module: Any, predictions: Any, batch_indices: Any) -> None:
        self.at_epoch_end = batch_indices


def test_an_iterable_dataset_gives_the_prediction_writer_no_indices(tmp_path: Path) -> None:
    seen = _IndicesSeen()
    predictions = quiet_trainer(tmp_path, [seen]).predict(TinyMLP(), torch.utils.data.DataLoader(_Rows()))
    assert predictions is not None and len(predictions) == 3
    assert seen.per_batch == [None, None, None] and seen.at_epoch_end == [[[], [], []]]


# ----------------------------------------------------------------------------- deferred step saves
class _Scored(TinyMLP):
    """Logs ``score`` from a script, one value per validation pass."""

    def __init__(self, scores: list[float]) -> None:
        super().__init__(log_loss=False)
        self.scores = scores
        self.passes = 0

    def on_validation_epoch_end(self) -> None:
        self.log("score", self.scores[self.passes])
        self.passes += 1


def test_a_step_save_waits_for_the_validation_that_logs_its_monitor(tmp_path: Path) -> None:
    """Lightning 2.6: saves due by step wait for the next validation when the monitor is missing or stale."""
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path, monitor="score", mode="max", every_n_train_steps=1, every_n_epochs=0,
        save_on_train_epoch_end=False, save_weights_only=True,
    )  # fmt: skip
    trainer = quiet_trainer(tmp_path, [checkpoint], max_epochs=1, val_check_interval=0.5)
    trainer.fit(_Scored([0.1, 0.9]), make_batches(4), make_batches(1))
    assert checkpoint.best_model_score is not None and float(checkpoint.best_model_score) == pytest.approx(0.9)
    assert checkpoint.best_model_path.endswith("epoch=0-step=4.ckpt")  # saved after the second pass, not before
