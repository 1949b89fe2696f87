"""``BaseFinetuning`` / ``BackboneFinetuning``: freezing and unfreezing equal a hand-written loop doing the
same bitwise, resuming before, at and after the unfreeze is exact, and Lightning's helpers behave as its."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from callbacks import BackboneFinetuning, BaseFinetuning, Callback
from tests.helpers.regression import make_loader
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer, TrainModule

EPOCHS, UNFREEZE, LR, RATIO, GROWTH = 4, 1, 0.05, 0.1, 3.0


def growth(epoch: int) -> float:
    return GROWTH


class WithBackbone(TrainModule):
    """A backbone and a head; the optimizer takes only what requires gradients (the head, at first)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh())
        self.head = nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.head(self.backbone(x)), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=LR, momentum=0.9)


def reference() -> WithBackbone:
    """Hand-written: frozen backbone; at ``UNFREEZE`` it joins the optimizer at ``LR * RATIO``, its rate then
    grows by ``GROWTH`` each epoch, capped at the head's."""
    module = WithBackbone()
    for p in module.backbone.parameters():
        p.requires_grad = False
    optimizer = module.configure_optimizers()
    backbone_lr = 0.0
    for epoch in range(EPOCHS):
        if epoch == UNFREEZE:
            for p in module.backbone.parameters():
                p.requires_grad = True
            backbone_lr = LR * RATIO
            optimizer.add_param_group({"params": list(module.backbone.parameters()), "lr": backbone_lr})
        elif epoch > UNFREEZE:
            backbone_lr = min(GROWTH * backbone_lr, optimizer.param_groups[0]["lr"])
            optimizer.param_groups[-1]["lr"] = backbone_lr
        for batch in make_loader(n=12, batch_size=4):
            module.training_step(batch, 0).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return module


class SaveAt(Callback):
    def __init__(self, root: Path, steps: set[int]) -> None:
        self.root, self.steps = root, steps

    def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, *args: Any) -> None:
        if trainer.global_step in self.steps:
            trainer.save_checkpoint(self.root / f"step{trainer.global_step}.ckpt")


def _fit(ckpt: Path | None = None, extra: list[Callback] = ()) -> tuple[WithBackbone, BackboneFinetuning]:  # type: ignore[assignment]
    module = WithBackbone()
    finetuning = BackboneFinetuning(unfreeze_backbone_at_epoch=UNFREEZE, lambda_func=growth)
    trainer = quiet_trainer(callbacks=[finetuning, *extra], max_epochs=EPOCHS)
    trainer.fit(module, make_loader(n=12, batch_size=4), ckpt_path=ckpt)  # 3 steps an epoch
    return module, finetuning


def _assert_same(a: nn.Module, b: nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name


def test_backbone_finetuning_equals_a_hand_written_loop_bitwise() -> None:
    module, finetuning = _fit()
    expected = reference()
    _assert_same(module, expected)
    # The backbone learned (it was unfrozen), at the rate the schedule gives: 0.005, 0.015, 0.045.
    assert not torch.equal(module.backbone[0].weight, WithBackbone().backbone[0].weight)
    assert finetuning.previous_backbone_lr == pytest.approx(LR * RATIO * GROWTH**2)
    metadata = finetuning.state_dict()["internal_optimizer_metadata"][0]
    assert [g["params"] for g in metadata] == [
        ["head.weight", "head.bias"],
        ["backbone.0.weight", "backbone.0.bias", "backbone.2.weight", "backbone.2.bias"],
    ]


def test_resume_before_at_and_after_the_unfreeze_is_exact(tmp_path: Path) -> None:
    steps = {2, 3, 5, 7}  # frozen epoch, its end (the next epoch unfreezes), after the unfreeze, one later
    whole, _ = _fit(extra=[SaveAt(tmp_path, steps)])
    for step in sorted(steps):
        resumed, _ = _fit(tmp_path / f"step{step}.ckpt")
        _assert_same(resumed, whole)
        assert all(p.requires_grad for p in resumed.backbone.parameters())


def test_helpers_behave_as_lightnings() -> None:
    net = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3), nn.Sequential(nn.Linear(3, 1)))
    assert [type(m) for m in BaseFinetuning.flatten_modules(net)] == [nn.Linear, nn.BatchNorm1d, nn.Linear]
    BaseFinetuning.freeze(net, train_bn=False)
    assert not any(p.requires_grad for p in net.parameters()) and not net[1].track_running_stats
    assert list(BaseFinetuning.filter_params(net, requires_grad=True)) == []
    BaseFinetuning.make_trainable(net[1])
    assert net[1].track_running_stats and [p.requires_grad for p in net.parameters()] == [0, 0, 1, 1, 0, 0]
    optimizer = torch.optim.SGD(net[1].parameters(), lr=1.0)
    BaseFinetuning.unfreeze_and_add_param_group(net[2], optimizer)  # lr: the first group's / initial_denom_lr
    assert len(optimizer.param_groups) == 2 and optimizer.param_groups[1]["lr"] == pytest.approx(0.1)
    assert optimizer.param_groups[1]["params"] == list(net[2].parameters())


def test_misuse_is_refused_by_name() -> None:
    loader = make_loader(n=8, batch_size=4)
    with pytest.raises(NotImplementedError, match="freeze_before_training"):
        quiet_trainer(callbacks=[BaseFinetuning()], max_epochs=1).fit(WithBackbone(), loader)

    class NoBackbone(WithBackbone):
        def __init__(self) -> None:
            super().__init__()
            self.body = self.backbone
            del self.backbone

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return F.mse_loss(self.head(self.body(x)), y)

    with pytest.raises(ValueError, match="attribute `backbone`"):
        quiet_trainer(callbacks=[BackboneFinetuning()], max_epochs=1).fit(NoBackbone(), loader)


def test_params_already_in_the_optimizer_are_skipped_with_lightnings_warning() -> None:
    layer = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    with pytest.warns(
        UserWarning, match=r"(?s)The provided params to be frozen already exist.*Did you init your optimizer"
    ):
        BaseFinetuning.unfreeze_and_add_param_group(layer, optimizer)
    assert len(optimizer.param_groups) == 1
