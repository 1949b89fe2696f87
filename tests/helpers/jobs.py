"""Small models, data and per-rank jobs shared by the strategy tests (importable by spawned ranks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies import FSDPStrategy
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule

STEPS = 20  # optimizer steps of the equivalence runs
ACCUMULATE = 2
CLIP = 0.5
GLOBAL_BATCH = 8


class BlockNet(TrainModule):
    """An MLP whose hidden layers sit in an ``nn.ModuleList`` (FSDP shards each one) plus a head."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.blocks = nn.ModuleList([nn.Linear(8, 16), nn.Linear(16, 16)])
        self.head = nn.Linear(16, 3)
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train/loss", loss, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.val_acc.update(logits, y)
        self.log("val/acc", self.val_acc)
        self.log("val/acc_mean", (logits.argmax(-1) == y).float().mean(), sync_dist=True)
        self.log("val/loss", nn.functional.cross_entropy(logits, y), sync_dist=True)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.2, momentum=0.9)


class OverflowOneShard(BlockNet):
    """At step 1, the gradient of ``head.bias[0]`` alone is inf: under FSDP only rank 0's shard holds it."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if self.global_step == 1:
            loss = loss + self.head.bias[0] * float("inf")
        return loss


def dataset(n: int, seed: int = 1) -> TensorDataset:
    """``n`` points in 8 dimensions, 3 classes given by a fixed random linear map."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x @ torch.randn(8, 3, generator=g)).argmax(-1)
    return TensorDataset(x, y)


def weights(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters as detached CPU tensors, by name."""
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def train(strategy: str | Any, per_rank_batch: int, root: str | Path, **kwargs: Any) -> tuple[BlockNet, Trainer]:
    """``STEPS`` optimizer steps of :class:`BlockNet` with accumulation and clipping, no shuffling.

    With no shuffling, rank r of W takes samples r, r+W, ...; each global batch of ``GLOBAL_BATCH``
    is split over the ranks, so W ranks on batch B/W compute the gradient one process does on B.
    """
    module = BlockNet()
    trainer = quiet_trainer(
        root,
        strategy=strategy,
        enable_checkpointing=True,
        max_steps=STEPS,
        accumulate_grad_batches=ACCUMULATE,
        gradient_clip_val=CLIP,
        **kwargs,
    )
    loader = DataLoader(dataset(160), batch_size=per_rank_batch, shuffle=False)
    trainer.fit(module, loader)
    return module, trainer


def rank_job(root: str) -> dict[str, Any]:
    """Everything the 2-rank test checks, run in one pair of processes (each launch costs seconds).

    DDP and FSDP training on half batches, DDP validation on an odd-sized set, and DDP with bf16.
    """
    out: dict[str, Any] = {}
    module, trainer = train("ddp", GLOBAL_BATCH // 2, f"{root}/ddp")
    out["ddp_weights"] = weights(module)
    out["ddp_steps"] = trainer.global_step
    out["ddp_world"] = trainer.world_size
    val_loader = DataLoader(dataset(37, seed=2), batch_size=5)
    out["ddp_val"] = trainer.validate(module, val_loader)[0]

    # state_dict_type="full": the test reads one gathered file (sharded directories have their own tests).
    module, trainer = train(FSDPStrategy(state_dict_type="full"), GLOBAL_BATCH // 2, f"{root}/fsdp")
    out["fsdp_ckpt"] = trainer.checkpoint_callback.last_model_path  # type: ignore[union-attr]
    out["fsdp_val"] = trainer.validate(module, val_loader)[0]

    module = OverflowOneShard()
    trainer = quiet_trainer(
        f"{root}/fp16",
        strategy="fsdp",
        num_sanity_val_steps=2,
        enable_checkpointing=True,
        precision="16-mixed",
        max_steps=3,
    )
    trainer.fit(module, DataLoader(dataset(64), batch_size=4))
    out["fsdp_fp16_skipped"] = trainer.progress.skipped_steps
    out["fsdp_fp16_scale"] = trainer.strategy.precision.scaler.get_scale()  # type: ignore[attr-defined]

    module, trainer = train("ddp", GLOBAL_BATCH // 2, f"{root}/bf16", precision="bf16-mixed", max_epochs=3)
    out["bf16_precision"] = trainer.strategy.precision.name
    out["bf16_loss"] = float(trainer.callback_metrics["train/loss_epoch"])
    return out
