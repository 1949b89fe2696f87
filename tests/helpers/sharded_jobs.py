"""Per-rank jobs of the sharded-checkpoint tests (importable by spawned ranks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from callbacks import ModelCheckpoint
from strategies import FSDPStrategy
from tests.helpers import jobs
from tests.helpers.trainers import quiet_trainer

BATCH = 4  # per rank


def fit(root: str | Path, max_epochs: int, ckpt_path: str | None = None, strategy: Any = None, **kwargs: Any) -> Any:
    """``BlockNet`` on shuffled data with a ModelCheckpoint keeping the last directory; returns (module, trainer)."""
    module = jobs.BlockNet()
    checkpoint = ModelCheckpoint(dirpath=f"{root}/checkpoints", save_last=True, save_top_k=0, **kwargs)
    trainer = quiet_trainer(
        root,
        [checkpoint],
        strategy=strategy if strategy is not None else FSDPStrategy(),
        enable_checkpointing=True,
        max_epochs=max_epochs,
        accumulate_grad_batches=2,
    )
    trainer.fit(module, DataLoader(jobs.dataset(48), batch_size=BATCH, shuffle=True), ckpt_path=ckpt_path)
    return module, trainer


def full_weights(trainer: Any) -> dict[str, Any]:
    """The full weights (a collective under FSDP: every rank calls it)."""
    return {k: v.clone() for k, v in trainer.strategy.model_state_dict().items()}


def resume_job(root: str) -> dict[str, Any]:
    """2 epochs with sharded saves, resume to 3, and 3 uninterrupted (saving asynchronously); rank 0 returns both."""
    _, first = fit(f"{root}/a", 2)
    saved = {"weights": full_weights(first), "optimizer": full_optimizer(first), "step": first.global_step}
    resumed = first.checkpoint_callback.last_model_path
    _, trainer = fit(f"{root}/b", 3, ckpt_path=resumed)
    resumed_weights = full_weights(trainer)
    _, trainer = fit(f"{root}/c", 3, async_save=True)  # the same run, its checkpoints written in the background
    straight_last = trainer.checkpoint_callback.last_model_path
    out = {"resumed": resumed_weights, "straight": full_weights(trainer), "last": resumed, "saved": saved}
    return {**out, "async_last": straight_last}


def full_optimizer(trainer: Any) -> dict[str, Any]:
    """The full optimizer state in ``optimizer.state_dict()``'s layout (a collective under FSDP)."""
    return trainer.strategy.optimizer_state_dict(trainer.optimizers[0])


def restore_job(ckpt: str, strategy: str, save_to: str | None, root: str) -> dict[str, Any]:
    """Restore ``ckpt`` through ``fit(ckpt_path=...)`` with nothing left to train; return what was loaded.

    With ``save_to``, the restored run is saved there again (a directory of this world size's shards
    under FSDP).
    """
    chosen = FSDPStrategy() if strategy == "fsdp" else strategy
    _, trainer = fit(root, 2, ckpt_path=ckpt, strategy=chosen)
    out = {"weights": full_weights(trainer), "optimizer": full_optimizer(trainer), "step": trainer.global_step}
    if save_to is not None:
        trainer.save_checkpoint(save_to)
    return out
