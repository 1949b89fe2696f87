"""Records the order in which Lightning 2.6 calls hooks; tests/test_lightning_hook_order.py embeds the output.

    /path/to/lightning-venv/bin/python tests/data/lightning/record_hook_order.py fit             # or fit_acc, validate, test, predict
    /path/to/lightning-venv/bin/python tests/data/lightning/record_hook_order.py dispatch fit    # or validate, test, predict, resume

The first form records a module's hooks, the steps and loaders included. ``dispatch`` records who is
called when: ``cb.`` a callback's hooks, ``ckpt.`` a ModelCheckpoint subclass's, bare the module's
``on_*`` hooks (without the batch-transfer hooks and ``state_dict``/``load_state_dict``).
Prints the calls as JSON. Not part of geartrain.
"""

import json
import sys
import tempfile

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

DISPATCH = sys.argv[1] == "dispatch"
STAGE = sys.argv[-1]
calls = []
STEPS_AND_LOADERS = (
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
ON_HOOKS = [n for n in dir(pl.LightningModule) if n.startswith("on_")]
MODULE_HOOKS = ON_HOOKS + (["setup", "teardown"] if DISPATCH else [n for n in STEPS_AND_LOADERS if n not in ON_HOOKS])
CB_HOOKS = [n for n in dir(pl.Callback) if n.startswith("on_")] + ["setup", "teardown", "state_dict", "load_state_dict"]


def loader(rows):
    return DataLoader(TensorDataset(torch.ones(rows, 2)), batch_size=2)


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
        return o if DISPATCH else {"optimizer": o, "lr_scheduler": torch.optim.lr_scheduler.StepLR(o, 1)}

    def train_dataloader(self):
        return loader(4)

    def val_dataloader(self):
        return loader(2)

    def test_dataloader(self):
        return loader(2)

    def predict_dataloader(self):
        return loader(2)


class CB(pl.Callback):
    pass


class CK(pl.callbacks.ModelCheckpoint):
    pass


def recorded(cls, name, prefix=""):
    base = getattr(cls, name)

    def hook(self, *a, **k):
        calls.append(prefix + name)
        return base(self, *a, **k)

    return hook


for n in MODULE_HOOKS:
    setattr(M, n, recorded(M, n))
for n in CB_HOOKS:
    setattr(CB, n, recorded(CB, n, "cb."))
for n in ("on_train_epoch_end", "on_validation_end", "on_save_checkpoint", "on_load_checkpoint"):
    setattr(CK, n, recorded(pl.callbacks.ModelCheckpoint, n, "ckpt."))
for n in ("state_dict", "load_state_dict"):
    setattr(CK, n, recorded(pl.callbacks.ModelCheckpoint, n, "ckpt."))


def record_module_hooks():
    kw = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    kw["num_sanity_val_steps"] = 0
    if STAGE == "fit":
        pl.Trainer(max_epochs=1, gradient_clip_val=1.0, **kw).fit(M())
    elif STAGE == "fit_acc":
        pl.Trainer(max_epochs=1, accumulate_grad_batches=2, **kw).fit(M())
    else:
        getattr(pl.Trainer(**kw), STAGE)(M())
    return calls


def record_dispatch():
    d = tempfile.mkdtemp()
    kw = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=d)
    if STAGE == "fit":
        pl.Trainer(max_epochs=1, num_sanity_val_steps=1, callbacks=[CB(), CK(dirpath=d)], **kw).fit(M())
    elif STAGE == "resume":
        pl.Trainer(max_epochs=1, callbacks=[CK(dirpath=d, save_last=True)], **kw).fit(M())
        calls.clear()
        again = dict(max_epochs=2, num_sanity_val_steps=0, limit_train_batches=1, limit_val_batches=0)
        pl.Trainer(callbacks=[CB(), CK(dirpath=d + "/2")], **again, **kw).fit(M(), ckpt_path=d + "/last.ckpt")
    else:
        getattr(pl.Trainer(callbacks=[CB()], **kw), STAGE)(M())
    skip = {"on_before_batch_transfer", "on_after_batch_transfer"}
    return [c for c in calls if c not in skip and not c.endswith("state_dict")]


print(json.dumps(record_dispatch() if DISPATCH else record_module_hooks()))
