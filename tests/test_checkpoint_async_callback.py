"""ModelCheckpoint(async_save=True) and last.ckpt as a hard link: same files and tensors as synchronous
saves, links that survive later saves, failed background writes that lose nothing, exact resume."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import trainer.checkpoint.files as ckpt
from callbacks import Checkpoint, ModelCheckpoint
from tests.helpers.callback_tools import Scripted, loaders
from tests.helpers.distributed import spawn
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer
from trainer.checkpoint.files import CheckpointError, load_checkpoint, place_checkpoint

SCORES = [0.5, 0.8, 0.6, 0.9, 0.7, 0.85]  # val/score per epoch; 4 steps per epoch


class WithMomentum(Scripted):
    """Scripted with optimizer and scheduler state worth comparing (momentum buffers, a step count)."""

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)}


def _shuffled_train() -> DataLoader:
    train, _ = loaders()
    return DataLoader(train.dataset, batch_size=8, shuffle=True)


def _fit(root: Path, cb: ModelCheckpoint, scores: list[float]) -> tuple[WithMomentum, Trainer]:
    torch.manual_seed(0)
    module = WithMomentum(scores)
    trainer = quiet_trainer(root, [cb], max_epochs=len(scores))
    trainer.fit(module, _shuffled_train(), loaders()[1])
    return module, trainer


def _names(path: Path) -> set[str]:
    return {p.name for p in path.iterdir()}


def _assert_equal(a: Any, b: Any, where: str = "") -> None:
    """Nested dicts/lists of tensors and plain values are equal (tensors bitwise)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            _assert_equal(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _links_work(folder: Path) -> bool:
    """Whether ``folder``'s filesystem makes hard links (where not, last.ckpt is a copy)."""
    probe = folder / ".link-probe"
    probe.write_bytes(b"")
    try:
        os.link(probe, folder / ".link-probe-2")
    except OSError:
        return False
    finally:
        for p in (probe, folder / ".link-probe-2"):
            p.unlink(missing_ok=True)
    return True


def _checkpoint(path: Path, **kwargs: Any) -> ModelCheckpoint:
    return ModelCheckpoint(
        dirpath=path, filename="{epoch}", monitor="val/score", mode="max", save_top_k=2, save_last=True, **kwargs
    )


def test_async_saves_give_the_same_files_and_tensors_as_synchronous_ones(tmp_path: Path) -> None:
    sync_cb, async_cb = _checkpoint(tmp_path / "sync"), _checkpoint(tmp_path / "async", async_save=True)
    _fit(tmp_path / "a", sync_cb, SCORES)
    _fit(tmp_path / "b", async_cb, SCORES)
    assert _names(tmp_path / "sync") == _names(tmp_path / "async") == {"epoch=3.ckpt", "epoch=5.ckpt", "last.ckpt"}
    for name in _names(tmp_path / "sync"):
        sync, asynchronous = load_checkpoint(tmp_path / "sync" / name), load_checkpoint(tmp_path / "async" / name)
        for key in ("state_dict", "optimizer_states", "lr_schedulers", "progress", "rng", "loops"):
            _assert_equal(sync[key], asynchronous[key], f"{name}:{key}")
        (sync_state,) = sync["callbacks"].values()
        (async_state,) = asynchronous["callbacks"].values()
        assert Path(sync_state["best_model_path"]).name == Path(async_state["best_model_path"]).name
        assert sorted(Path(p).name for p in async_state["best_k_models"]) == sorted(
            Path(p).name for p in sync_state["best_k_models"]
        )
    assert Path(async_cb.best_model_path).name == "epoch=3.ckpt"
    assert async_cb.best_model_score == pytest.approx(0.9)
    assert not [p for p in (tmp_path / "async").iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("async_save", [False, True])
def test_last_is_a_hard_link_and_a_later_save_never_writes_into_it(tmp_path: Path, async_save: bool) -> None:
    root = tmp_path / "ck"
    links = _links_work(tmp_path)
    # Epoch 1 is the best and is last.ckpt too; epochs 2 and 3 rank lower, so only last.ckpt is
    # rewritten, twice, while epoch=1.ckpt shares the inode last.ckpt had.
    cb = ModelCheckpoint(
        dirpath=root, filename="{epoch}", monitor="val/score", mode="max", save_last=True, async_save=async_save
    )
    seen: list[tuple[int, int]] = []

    # Runs after cb's save at each epoch end (checkpoint callbacks run last, in their given order):
    # record the inodes once written.
    class Probe(Checkpoint):
        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            trainer.wait_for_checkpoints()
            best = Path(cb.best_model_path)
            seen.append((best.stat().st_ino, (root / "last.ckpt").stat().st_ino))

    torch.manual_seed(0)
    trainer = quiet_trainer(tmp_path, [cb, Probe()], max_epochs=4)
    trainer.fit(WithMomentum([0.5, 0.9, 0.1, 0.2]), _shuffled_train(), loaders()[1])
    # Epochs 0 and 1: last.ckpt is the top-k file (a copy where this filesystem has no hard links).
    assert (seen[0][0] == seen[0][1] and seen[1][0] == seen[1][1]) is links
    assert seen[2][0] != seen[2][1] and seen[3][0] != seen[3][1]  # replaced by a new file, not written into
    assert _names(root) == {"epoch=1.ckpt", "last.ckpt"}  # epoch=0.ckpt evicted after epoch=1.ckpt landed
    assert load_checkpoint(root / "epoch=1.ckpt")["progress"]["epoch"] == 1
    assert load_checkpoint(root / "last.ckpt")["progress"]["global_step"] == 16
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]


def test_place_checkpoint_copies_where_links_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source, target = tmp_path / "a.ckpt", tmp_path / "last.ckpt"
    source.write_bytes(b"new state")
    target.write_bytes(b"old state")

    def no_links(src: Any, dst: Any) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    place_checkpoint(source, target)
    assert target.read_bytes() == b"new state" and target.stat().st_ino != source.stat().st_ino
    assert _names(tmp_path) == {"a.ckpt", "last.ckpt"}
    with pytest.raises(CheckpointError, match=r"last\.ckpt"):
        place_checkpoint(tmp_path / "missing.ckpt", target)
    assert target.read_bytes() == b"new state"


@pytest.mark.parametrize("epochs", [2, 3], ids=["raised-at-fit-end", "raised-by-the-next-save"])
def test_a_failed_background_write_raises_and_keeps_the_previous_best(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, epochs: int
) -> None:
    real = ckpt._write_atomically
    calls = {"n": 0}

    def failing(path: Path, write: Any, sync_dir: bool = True) -> Path:
        calls["n"] += 1
        if calls["n"] == 2:  # epoch 1's file, in the writer thread; it would evict epoch=0.ckpt
            raise CheckpointError(f"Could not write checkpoint {path}: disk full")
        return real(path, write, sync_dir)

    monkeypatch.setattr(ckpt, "_write_atomically", failing)
    root = tmp_path / "ck"
    cb = ModelCheckpoint(
        dirpath=root, filename="{epoch}", monitor="val/score", mode="max", save_last=True, async_save=True
    )
    with pytest.raises(CheckpointError, match=r"epoch=1\.ckpt: disk full"):
        _fit(tmp_path, cb, [0.5, 0.9, 0.95][:epochs])
    assert calls["n"] == 2  # nothing was written after the failure
    assert _names(root) == {"epoch=0.ckpt", "last.ckpt"}
    for name in ("epoch=0.ckpt", "last.ckpt"):
        assert load_checkpoint(root / name)["progress"]["epoch"] == 0
    # The bookkeeping names only files on disk.
    assert cb.best_model_path == str(root / "epoch=0.ckpt")
    assert cb.best_model_score == pytest.approx(0.5)
    assert list(cb.best_k_models) == [str(root / "epoch=0.ckpt")]


def test_resume_from_an_async_last_ckpt_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    scores = [0.1, 0.2, 0.3, 0.4]
    reference, ref_trainer = _fit(tmp_path / "ref", ModelCheckpoint(dirpath=tmp_path / "ref_ck", save_top_k=0), scores)

    root = tmp_path / "ck"
    cb = _checkpoint(root, async_save=True)
    _fit(tmp_path, cb, scores[:2])
    torch.manual_seed(123)  # whatever the process did meanwhile: the checkpoint's RNG states win
    resumed_module = WithMomentum(scores)
    trainer = quiet_trainer(tmp_path, [_checkpoint(root, async_save=True)], max_epochs=4)
    trainer.fit(resumed_module, _shuffled_train(), loaders()[1], ckpt_path=root / "last.ckpt")

    for key, value in reference.state_dict().items():
        assert torch.equal(value, resumed_module.state_dict()[key]), key
    _assert_equal(ref_trainer.optimizers[0].state_dict(), trainer.optimizers[0].state_dict(), "optimizer")
    assert trainer.global_step == ref_trainer.global_step == 16


def test_async_save_returns_before_the_file_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = ckpt.write_checkpoint
    release = threading.Event()

    def held(state: Any, path: Any, *rest: Any) -> Path:
        release.wait(timeout=30)  # the write cannot finish before the training loop has moved on
        return real(state, path, *rest)

    monkeypatch.setattr(ckpt, "write_checkpoint", held)
    root = tmp_path / "ck"
    cb = ModelCheckpoint(dirpath=root, filename="{epoch}", save_last=True, async_save=True)
    pending: list[bool] = []

    # Runs after cb's save (checkpoint callbacks run last, in their given order): training continues
    # while the write is held.
    class Probe(Checkpoint):
        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            pending.append(not (root / "epoch=0.ckpt").exists() and not (root / "last.ckpt").exists())
            release.set()

    torch.manual_seed(0)
    trainer = quiet_trainer(tmp_path, [cb, Probe()], max_epochs=1)
    trainer.fit(WithMomentum([0.5]), _shuffled_train(), loaders()[1])
    assert pending == [True]
    assert _names(root) == {"epoch=0.ckpt", "last.ckpt"}  # and fit returned only once both were there
    assert ((root / "epoch=0.ckpt").stat().st_ino == (root / "last.ckpt").stat().st_ino) is _links_work(tmp_path)


def ddp_job(root: str) -> dict[str, Any]:
    """One rank of a 2-process DDP fit with an asynchronous ModelCheckpoint (run by :func:`spawn`)."""
    folder = Path(root) / "ck"
    cb = _checkpoint(folder, async_save=True)
    torch.manual_seed(0)
    train, val = loaders()
    trainer = quiet_trainer(root, [cb], strategy="ddp", max_epochs=len(SCORES))
    trainer.fit(WithMomentum(SCORES), train, val)
    files = sorted(p.name for p in folder.iterdir()) if trainer.is_global_zero else []
    return {"state": cb.state_dict(), "files": files, "last_step": trainer.global_step, "world": trainer.world_size}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ddp_rank_zero_writes_in_the_background_and_ranks_agree(tmp_path: Path) -> None:
    rank0, rank1 = spawn(ddp_job, str(tmp_path), world_size=2)
    assert rank0["world"] == rank1["world"] == 2
    assert rank0["files"] == ["epoch=3.ckpt", "epoch=5.ckpt", "last.ckpt"]
    assert rank0["state"] == rank1["state"]  # the same bookkeeping on every rank
    assert Path(rank0["state"]["best_model_path"]).name == "epoch=3.ckpt"
    last = load_checkpoint(tmp_path / "ck" / "last.ckpt")
    assert last["progress"]["global_step"] == rank0["last_step"] == rank1["last_step"]
