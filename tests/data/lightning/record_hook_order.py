"""Records the order in which Lightning 2.6 calls a LightningModule's hooks (tests/test_lightning_hook_order.py).

    /tmp/plvenv/bin/python tests/data/lightning/record_hook_order.py fit   # or fit_acc, validate, test, predict

Prints the list of calls as JSON; the test embeds them. Not part of geartrain.
"""

import json
import sys

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

calls = []
HOOKS = [
    n
    for n in dir(pl.LightningModule)
    if (
        n.startswith("on_")
        or n
        in (
            "setup",
            "teardown",
            "prepare_data",
            "configure_callbacks",
            "configure_model",
            "configure_optimizers",
            "optimizer_step",
            "optimizer_zero_grad",
            "configure_gradient_clipping",
            "lr_scheduler_step",
            "transfer_batch_to_device",
            "training_step",
            "validation_step",
            "test_step",
            "predict_step",
            "train_dataloader",
            "val_dataloader",
            "test_dataloader",
            "predict_dataloader",
            "backward",
        )
    )
]


class M(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(2, 1)

    def training_step(self, b, i):
        return self.l(b[0]).sum()

    def validation_step(self, b, i):
        self.log("v", self.l(b[0]).sum())

    def test_step(self, b, i):
        pass

    def predict_step(self, b, i):
        return self.l(b[0])

    def configure_optimizers(self):
        o = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": o, "lr_scheduler": torch.optim.lr_scheduler.StepLR(o, 1)}

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)

    def test_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)

    def predict_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)


def wrap(name):
    base = getattr(M, name)

    def f(self, *a, **k):
        calls.append(name)
        return base(self, *a, **k)

    return f


for h in HOOKS:
    setattr(M, h, wrap(h))
kw = dict(
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
)
m = M()
stage = sys.argv[1]
if stage == "fit":
    pl.Trainer(max_epochs=1, gradient_clip_val=1.0, **kw).fit(m)
elif stage == "fit_acc":
    pl.Trainer(max_epochs=1, accumulate_grad_batches=2, **kw).fit(m)
else:
    getattr(pl.Trainer(**kw), stage)(m)
print(json.dumps(calls))
