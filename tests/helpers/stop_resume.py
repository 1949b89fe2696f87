"""Stop a fit in-process at a chosen batch, as kill -9 would, then resume it from ``last.ckpt``.

The exactness tests of accumulation windows, epoch metrics and restored ``callback_metrics`` run
many stop points; a real kill (``tests/test_resume.py``) costs a process start each, an in-process
stop costs nothing. What a killed run leaves is only what is on disk: the stop raises
:class:`Killed` from ``on_train_batch_start`` (before the batch, after every save of the previous
one), nothing is saved on the way out, and the next attempt is a fresh trainer and module that
resume from ``last.ckpt`` (or start over when none was written yet).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from callbacks import Callback, ModelCheckpoint
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule, seed_everything


class Killed(BaseException):
    """Raised to end an attempt at a chosen batch (a ``BaseException``, like ``KeyboardInterrupt``)."""


class KillAt(Callback):
    """Raise :class:`Killed` when training batch number ``at`` (counted from 1 in this attempt) starts."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.seen = 0

    def on_train_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int) -> None:
        self.seen += 1
        if self.seen == self.at:
            raise Killed


def attempts(
    root: Path,
    make: Callable[[], tuple[TrainModule, dict[str, Any]]],
    kills: Sequence[int] = (),
    callbacks: Callable[[], list[Callback]] = list,
    checkpoint: Callable[[Path], ModelCheckpoint] | None = None,
    **trainer_kwargs: Any,
) -> tuple[TrainModule, Trainer]:
    """Run a fit that is stopped at each of ``kills`` (batches of each attempt) and resumed; return the last.

    Args:
        root: the run's directory (checkpoints in ``root/checkpoints``).
        make: builds the module and the ``fit`` keyword arguments (loaders), after the seed is set.
        kills: per attempt, the batch at whose start it is stopped; then a last attempt runs to the end.
        callbacks: builds the extra callbacks of each attempt.
        checkpoint: builds the ``ModelCheckpoint`` (default: ``last.ckpt`` after every optimizer step).
        **trainer_kwargs: ``Trainer`` arguments.
    """
    for at in [*kills, None]:
        seed_everything(7)
        module, fit_kwargs = make()
        ckpt = (checkpoint or _every_step)(root / "checkpoints")
        extra = callbacks() + ([] if at is None else [KillAt(at)])
        t = quiet_trainer(root, [*extra, ckpt], enable_checkpointing=True, **trainer_kwargs)
        last = root / "checkpoints" / "last.ckpt"
        try:
            t.fit(module, ckpt_path=last if last.exists() else None, **fit_kwargs)
        except Killed:
            continue
    return module, t


def _every_step(dirpath: Path) -> ModelCheckpoint:
    return ModelCheckpoint(dirpath=dirpath, every_n_train_steps=1, save_top_k=0, save_last=True)


def max_difference(a: TrainModule, b: TrainModule) -> float:
    """The largest absolute difference between two modules' parameters (0.0: equal)."""
    return max((x - y).abs().max().item() for x, y in zip(a.parameters(), b.parameters()))


def assert_same_state(a: tuple[TrainModule, Trainer], b: tuple[TrainModule, Trainer]) -> None:
    """Weights and optimizer state bitwise equal (``torch.equal``), with the difference in the message."""
    (ma, ta), (mb, tb) = a, b
    diff = max_difference(ma, mb)
    for (name, x), y in zip(ma.state_dict().items(), mb.state_dict().values()):
        assert torch.equal(x, y), f"{name} differs after resume (max weight difference {diff:.3g})"
    sa, sb = ta.optimizers[0].state_dict()["state"], tb.optimizers[0].state_dict()["state"]
    assert sa.keys() == sb.keys()
    for key in sa:
        for field in sa[key]:
            assert torch.equal(torch.as_tensor(sa[key][field]), torch.as_tensor(sb[key][field])), (
                f"optimizer state {key}.{field} differs after resume"
            )
    assert ta.optimizers[0].param_groups[0]["lr"] == tb.optimizers[0].param_groups[0]["lr"]
