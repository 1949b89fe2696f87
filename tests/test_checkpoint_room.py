"""Checkpointing is one room (docs/architecture.md, "Following ``ckpt_path="last"``"): following
``Trainer.fit(ckpt_path="last")`` to the file read stays short, and checkpoint bytes reach and leave
the disk in ``trainer/checkpoint/`` (and, for a sharded directory's shards, the strategies' DCP
calls), never in a callback.

These read the walk ``bench/checkpoint_walk.py`` measures, and the source as text.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO_ROOT

#: Where ``torch.save``/``torch.load`` of checkpoint content may be called outside trainer/checkpoint/: nowhere.
_TORCH_IO_OUTSIDE: set[str] = set()
#: Files that save or load what is not a checkpoint: prediction shards, a spawned rank's result.
_NOT_CHECKPOINTS = {"callbacks/prediction_writer.py", "strategies/launch.py"}


def test_following_ckpt_path_last_enters_at_most_six_files(tmp_path: Path) -> None:
    from bench.checkpoint_walk import walk

    steps = walk(tmp_path)
    assert steps[0] == "trainer/trainer.py" and steps[-1] == "trainer/checkpoint/reader.py", steps
    assert len(set(steps)) <= 6, steps
    returns = {f: sum(1 for i, g in enumerate(steps) if g == f and i and f in steps[:i]) for f in set(steps)}
    assert max(returns.values()) <= 2, steps
    # The "last" lookup is the resolver's, and the set-aside and path checks the reader's.
    assert not [f for f in steps if f.startswith("callbacks/") or f == "trainer/attributes.py"], steps
    assert "strategies/sharded_checkpoint.py" not in steps, steps


def _torch_io_calls(path: Path) -> list[str]:
    return [
        f"{path.relative_to(REPO_ROOT)}:{node.lineno} torch.{node.func.attr}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("save", "load")
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "torch"
    ]


def test_only_the_checkpoint_room_writes_or_reads_checkpoint_bytes() -> None:
    room = REPO_ROOT / "trainer" / "checkpoint"
    outside = [
        p
        for package in ("callbacks", "strategies", "trainer")
        for p in sorted((REPO_ROOT / package).rglob("*.py"))
        if room not in p.parents
    ]
    allowed = _TORCH_IO_OUTSIDE | _NOT_CHECKPOINTS
    calls = [c for p in outside for c in _torch_io_calls(p) if c.split(":")[0] not in allowed]
    assert calls == [], "checkpoint files are written by trainer/checkpoint/files.py and read by reader.py"


def test_the_set_aside_name_is_spelled_once() -> None:
    """``.<name>.old`` is the format's name, defined in one place (the format, which every writer imports)."""
    spelled = [
        f"{p.relative_to(REPO_ROOT)}:{node.lineno}"
        for package in ("callbacks", "strategies", "trainer")
        for p in sorted((REPO_ROOT / package).rglob("*.py"))
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith(".old")
    ]
    assert [where.split(":")[0] for where in spelled] == ["trainer/checkpoint/format.py"], spelled


def test_a_subclass_that_overrides_find_last_checkpoints_is_asked(tmp_path: Path) -> None:
    """The resolver finds a callback's last files itself, but Lightning's method stays the user's to override."""
    from callbacks import ModelCheckpoint
    from tests.helpers.tiny_mlp import TinyMLP, make_batches
    from tests.helpers.trainers import quiet_trainer

    first = ModelCheckpoint(dirpath=tmp_path / "a", filename="{epoch}", save_top_k=-1, save_last=True)
    quiet_trainer(tmp_path, [first], enable_checkpointing=True, max_epochs=2).fit(TinyMLP(), make_batches(2))
    wanted = str(tmp_path / "a" / "epoch=0.ckpt")  # not a "last" file: only the override can name it

    class Chosen(ModelCheckpoint):
        def _find_last_checkpoints(self, trainer: object) -> set[str]:
            return {wanted}

    trainer = quiet_trainer(tmp_path, [Chosen(dirpath=tmp_path / "b")], enable_checkpointing=True, max_epochs=2)
    trainer.fit(TinyMLP(), make_batches(2), ckpt_path="last")
    assert trainer.ckpt_path == wanted
    assert ModelCheckpoint(dirpath=tmp_path / "a")._find_last_checkpoints(trainer) == {
        str(tmp_path / "a" / "last.ckpt")
    }
