"""Checkpoint files that are not this run's: never deleted, never replaced, never resumed by mistake.

Before: a crafted checkpoint's bookkeeping (``dirpath: None``, a user's file among ``best_k_models``)
got that file deleted at the first better save; ``save_last`` replaced a user's own ``last.ckpt``;
the default callbacks of two runs in one ``default_root_dir`` shared one folder, and
``ckpt_path="last"`` resumed another run's ``last.ckpt`` from a logger's earlier version.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from callbacks import ModelCheckpoint
from tests.helpers.callback_tools import Scripted, loaders
from tests.helpers.trainers import quiet_trainer


def _fit(
    root: Path, cb: ModelCheckpoint, scores: list[float], ckpt_path: str | Path | None = None, **kw: object
) -> None:
    train, val = loaders()
    trainer = quiet_trainer(root, [cb], max_epochs=len(scores), enable_checkpointing=True, **kw)
    trainer.fit(Scripted(scores), train, val, ckpt_path=ckpt_path)


def test_crafted_bookkeeping_never_gets_a_users_file_deleted(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    options = {"dirpath": ck, "filename": "{epoch}", "monitor": "val/score", "mode": "max", "save_top_k": 2}
    _fit(tmp_path, ModelCheckpoint(**options, save_last=True), [0.1])
    notes, theirs = ck / "notes.txt", ck / "lightning.ckpt"
    notes.write_text("mine")
    torch.save({"state_dict": {}, "pytorch-lightning_version": "2.6.0"}, theirs)  # a user's own checkpoint
    state = torch.load(ck / "last.ckpt", weights_only=True)
    (key,) = [k for k in state["callbacks"] if k.startswith("ModelCheckpoint")]
    state["callbacks"][key].update(
        dirpath=None,
        best_k_models={str(notes): 0.0, str(theirs): 0.05},
        kth_best_model_path=str(notes),
        kth_value=0.0,
    )
    crafted = tmp_path / "crafted.ckpt"
    torch.save(state, crafted)
    # Two better saves: each pushes one of the "kept" files out of the top 2.
    _fit(tmp_path, ModelCheckpoint(**options), [0.1, 0.8, 0.9], ckpt_path=crafted)
    assert notes.read_text() == "mine"
    assert theirs.is_file()
    assert {"epoch=1.ckpt", "epoch=2.ckpt"} <= {p.name for p in ck.iterdir()}


def test_crafted_bookkeeping_never_gets_another_runs_checkpoint_deleted(tmp_path: Path) -> None:
    """A geartrain checkpoint of another run in the same folder is not this run's to delete (its run id differs)."""
    ck = tmp_path / "ck"
    options = {"dirpath": ck, "filename": "{epoch}", "monitor": "val/score", "mode": "max", "save_top_k": 2}
    _fit(tmp_path / "other", ModelCheckpoint(dirpath=tmp_path / "other", save_last=True), [0.1])
    _fit(tmp_path, ModelCheckpoint(**options, save_last=True), [0.1])
    theirs = ck / "another-run.ckpt"
    theirs.write_bytes((tmp_path / "other" / "last.ckpt").read_bytes())
    state = torch.load(ck / "last.ckpt", weights_only=True)
    assert torch.load(theirs, weights_only=True)["run_id"] != state["run_id"]
    (key,) = [k for k in state["callbacks"] if k.startswith("ModelCheckpoint")]
    state["callbacks"][key].update(best_k_models={str(theirs): 0.0}, kth_best_model_path=str(theirs), kth_value=0.0)
    crafted = ck / "crafted.ckpt"
    torch.save(state, crafted)
    _fit(tmp_path, ModelCheckpoint(**options), [0.1, 0.8, 0.9], ckpt_path=crafted)
    assert theirs.is_file()


def test_resumed_run_still_evicts_its_own_earlier_files(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    options = {"dirpath": ck, "filename": "{epoch}", "monitor": "val/score", "mode": "max", "save_top_k": 1}
    _fit(tmp_path, ModelCheckpoint(**options, save_last=True), [0.1])
    _fit(tmp_path, ModelCheckpoint(**options, save_last=True), [0.1, 0.8], ckpt_path=ck / "last.ckpt")
    assert sorted(p.name for p in ck.iterdir()) == ["epoch=1.ckpt", "last.ckpt"]


def test_a_users_last_ckpt_is_kept_and_this_run_writes_last_v1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "last.ckpt").write_text("the user's own file")
    with pytest.warns(UserWarning, match=r"last\.ckpt was not written by this run; it is kept.*last-v1\.ckpt"):
        _fit(tmp_path, ModelCheckpoint(dirpath=".", save_last=True, save_top_k=0), [0.1, 0.2])
    assert (tmp_path / "last.ckpt").read_text() == "the user's own file"
    assert torch.load(tmp_path / "last-v1.ckpt", weights_only=True)["global_step"] == 8
    # "last" is the newest last file of the folder (Lightning's): this run's, which goes on being replaced.
    cb = ModelCheckpoint(dirpath=".", save_last=True, save_top_k=0)
    _fit(tmp_path, cb, [0.1, 0.2, 0.3], ckpt_path="last")
    assert cb.last_model_path == str(tmp_path / "last-v1.ckpt")
    assert torch.load(tmp_path / "last-v1.ckpt", weights_only=True)["global_step"] == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last-v1.ckpt", "last.ckpt"]


def _default_run(root: Path, steps: int, ckpt_path: str | None = None, **kw: object) -> object:
    train, val = loaders()
    trainer = quiet_trainer(root, enable_checkpointing=True, max_steps=steps, **kw)
    trainer.fit(Scripted([0.1]), train, val, ckpt_path=ckpt_path)
    return trainer


def test_two_runs_with_the_default_callbacks_never_share_a_checkpoint_folder(tmp_path: Path) -> None:
    first = _default_run(tmp_path, 4, logger=True)
    with pytest.warns(UserWarning, match="no last checkpoint available"):
        second = _default_run(tmp_path, 8, ckpt_path="last", logger=True)  # Lightning's "last": this run's folder
    versions = tmp_path / "lightning_logs"
    assert first.checkpoint_callback.dirpath == str(versions / "version_0" / "checkpoints")
    assert second.checkpoint_callback.dirpath == str(versions / "version_1" / "checkpoints")
    assert torch.load(versions / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4
    assert torch.load(versions / "version_1" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 8
    # Without a logger: <root>/checkpoints, where the second run keeps the first's last.ckpt.
    plain = tmp_path / "plain"
    _default_run(plain, 4)
    with pytest.warns(UserWarning, match="not written by this run"):
        _default_run(plain, 8)
    assert torch.load(plain / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4
    assert torch.load(plain / "checkpoints" / "last-v1.ckpt", weights_only=True)["global_step"] == 8


def rank_dirpath_job(root: str) -> dict[str, object]:
    """One rank of an FSDP fit whose ``default_root_dir`` differs per rank (a time stamp taken twice)."""
    import os

    from torch.utils.data import DataLoader

    from tests.helpers import jobs

    own_root = Path(root) / f"run-{os.environ['RANK']}"
    trainer = quiet_trainer(own_root, strategy="fsdp", enable_checkpointing=True, max_steps=2)
    trainer.fit(jobs.BlockNet(), DataLoader(jobs.dataset(16), batch_size=4))
    return {"dirpath": trainer.checkpoint_callback.dirpath, "last": trainer.checkpoint_callback.last_model_path}


@pytest.mark.timeout(180)
def test_every_rank_saves_into_rank_zeros_folder(tmp_path: Path) -> None:
    from tests.helpers.distributed import spawn
    from trainer.checkpoint.reader import read_any

    rank0, rank1 = spawn(rank_dirpath_job, str(tmp_path), world_size=2)
    assert rank0 == rank1 and rank0["dirpath"] == str(tmp_path / "run-0" / "checkpoints")
    assert not (tmp_path / "run-1" / "checkpoints").exists()
    shards = sorted(p.name for p in Path(str(rank0["last"])).iterdir() if p.suffix == ".distcp")
    assert shards == ["__0_0.distcp", "__1_0.distcp"], shards
    assert read_any(Path(str(rank0["last"])))["global_step"] == 2


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
