"""Records the order in which Lightning 2.6 calls the hooks of a module, a callback and a ModelCheckpoint.

    /path/to/lightning-venv/bin/python tests/data/lightning/record_hook_dispatch.py fit   # or validate, test, predict, resume

Prints the calls as JSON (``cb.`` a callback's, ``ckpt.`` a ModelCheckpoint subclass's, bare the module's),
without the batch-transfer hooks and ``state_dict``/``load_state_dict``; tests/test_lightning_hook_order.py
embeds them. Not part of geartrain.
"""

import json
import sys
import tempfile

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

calls = []
MODULE_HOOKS = [n for n in dir(pl.LightningModule) if n.startswith("on_")] + ["setup", "teardown"]
CB_HOOKS = [n for n in dir(pl.Callback) if n.startswith("on_")] + ["setup", "teardown", "state_dict", "load_state_dict"]


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
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)

    def test_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)

    def predict_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)


class CB(pl.Callback):
    pass


class CK(pl.callbacks.ModelCheckpoint):
    pass


def wrapm(name):
    base = getattr(M, name)

    def hook(self, *a, **k):
        calls.append(name)
        return base(self, *a, **k)

    return hook


def wrapc(name, prefix, cls):
    base = getattr(cls, name)

    def hook(self, *a, **k):
        calls.append(prefix + name)
        return base(self, *a, **k)

    return hook


for n in MODULE_HOOKS:
    setattr(M, n, wrapm(n))
for n in CB_HOOKS:
    setattr(CB, n, wrapc(n, "cb.", CB))
for n in (
    "on_train_epoch_end",
    "on_validation_end",
    "on_save_checkpoint",
    "on_load_checkpoint",
    "state_dict",
    "load_state_dict",
):
    setattr(CK, n, wrapc(n, "ckpt.", pl.callbacks.ModelCheckpoint))

stage = sys.argv[1]
d = tempfile.mkdtemp()
kw = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=d)
if stage == "fit":
    t = pl.Trainer(max_epochs=1, num_sanity_val_steps=1, callbacks=[CB(), CK(dirpath=d)], **kw)
    t.fit(M())
elif stage == "resume":
    t = pl.Trainer(max_epochs=1, callbacks=[CK(dirpath=d, save_last=True)], **kw)
    t.fit(M())
    calls.clear()
    t = pl.Trainer(
        max_epochs=2,
        num_sanity_val_steps=0,
        limit_train_batches=1,
        limit_val_batches=0,
        callbacks=[CB(), CK(dirpath=d + "/2")],
        **kw,
    )
    t.fit(M(), ckpt_path=d + "/last.ckpt")
else:
    t = pl.Trainer(callbacks=[CB()], **kw)
    getattr(t, stage)(M())
SKIP = {"on_before_batch_transfer", "on_after_batch_transfer"}
print(json.dumps([c for c in calls if c not in SKIP and not c.endswith("state_dict")]))
