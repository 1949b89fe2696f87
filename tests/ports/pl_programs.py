"""Five Lightning programs of the kinds Lightning's examples and tutorials teach, written as Lightning code.

Each uses ``import ... as pl`` style (``pl.LightningModule``, ``pl.callbacks.X``, ``pl.utilities``),
draws random numbers where real projects do, and returns its final weights. The import block below
is the only part that differs from the Lightning program; tests/data/lightning/record_ports.py runs
this very file with Lightning's import block and stores the weights.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

# isort: off
# --- imports: the only lines that differ from the Lightning program ---
import trainer.lightning as pl
from trainer.lightning.utilities import rank_zero_info

# --- end of imports ---
# isort: on


def _points(n: int, seed: int, features: int = 8, classes: int = 3) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=g) * 2
    y = torch.randint(0, classes, (n,), generator=g)
    return TensorDataset(centres[y] + torch.randn(n, features, generator=g), y)


class Augmented(Dataset):
    """Adds noise from the global generator on every read (as image augmentation does)."""

    def __init__(self, base: TensorDataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.base[i]
        return x + 0.1 * torch.randn_like(x), y


class PointsData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        self.train_set = Augmented(_points(96, 0))
        self.val_set = _points(32, 1)
        self.test_set = _points(32, 2)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=16)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=16)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=16)


def _trainer(root: str, **options: Any) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
        **options,
    )


# ---------------------------------------------------------------- 1. fine-tuning with BaseFinetuning
class Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class TransferModel(pl.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.feature_extractor = Backbone()
        self.classifier = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(F.relu(self.feature_extractor(x)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_acc", (self(x).argmax(-1) == y).float().mean())

    def configure_optimizers(self) -> Any:
        params = filter(lambda p: p.requires_grad, self.parameters())
        optimizer = torch.optim.Adam(params, lr=self.hparams.lr)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.7)}


class FeatureExtractorFreezeUnfreeze(pl.callbacks.BaseFinetuning):
    def __init__(self, unfreeze_at_epoch: int = 2) -> None:
        super().__init__()
        self._unfreeze_at_epoch = unfreeze_at_epoch

    def freeze_before_training(self, pl_module: pl.LightningModule) -> None:
        self.freeze(pl_module.feature_extractor)

    def finetune_function(self, pl_module: pl.LightningModule, current_epoch: int, optimizer: Any) -> None:
        if current_epoch == self._unfreeze_at_epoch:
            self.unfreeze_and_add_param_group(
                modules=pl_module.feature_extractor, optimizer=optimizer, initial_denom_lr=10, train_bn=True
            )


def finetuning() -> dict[str, torch.Tensor]:
    """A frozen backbone unfrozen at epoch 2 into its own parameter group; BatchNorm, dropout, a scheduler."""
    pl.seed_everything(21)
    model = TransferModel()
    with tempfile.TemporaryDirectory() as root:
        trainer = _trainer(root, max_epochs=4, callbacks=[FeatureExtractorFreezeUnfreeze()], logger=False)
        trainer.fit(model, datamodule=PointsData())
    return model.state_dict()


# ---------------------------------------------------------------- 2. PPO-style agent: manual optimisation, IterableDataset
class Corridor:
    """A one-dimensional walk to a goal, with noisy moves drawn from torch's global generator."""

    def __init__(self) -> None:
        self.position = 0.0

    def reset(self) -> torch.Tensor:
        self.position = float(torch.rand(()) - 0.5)
        return torch.tensor([self.position, 1.0 - self.position])

    def step(self, action: int) -> tuple[torch.Tensor, float, bool]:
        self.position += (0.2 if action == 1 else -0.2) + 0.05 * float(torch.randn(()))
        done = abs(self.position) > 1.0
        reward = 1.0 if self.position > 1.0 else (-1.0 if done else -0.01)
        return torch.tensor([self.position, 1.0 - self.position]), reward, done


class RolloutBuffer(IterableDataset):
    """Yields (state, action, old log-prob, advantage, return) of fresh rollouts of the current policy."""

    def __init__(self, generate: Any) -> None:
        self.generate = generate

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        return self.generate()


class PPOAgent(pl.LightningModule):
    def __init__(
        self, steps_per_epoch: int = 64, batch_size: int = 16, clip_ratio: float = 0.2, gamma: float = 0.95
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.actor = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 2))
        self.critic = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1))
        self.env = Corridor()

    def generate_trajectory_samples(self) -> Iterator[tuple[torch.Tensor, ...]]:
        states, actions, logps, rewards, values = [], [], [], [], []
        state = self.env.reset()
        with torch.no_grad():
            for _ in range(self.hparams.steps_per_epoch):
                dist = torch.distributions.Categorical(logits=self.actor(state))
                action = dist.sample()
                states.append(state)
                actions.append(action)
                logps.append(dist.log_prob(action))
                values.append(self.critic(state).squeeze())
                state, reward, done = self.env.step(int(action))
                rewards.append(reward)
                if done:
                    state = self.env.reset()
        returns, running = [], 0.0
        for r in reversed(rewards):
            running = r + self.hparams.gamma * running
            returns.insert(0, running)
        ret = torch.tensor(returns)
        adv = ret - torch.stack(values)
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        yield from zip(states, actions, logps, adv, ret)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        state, action, old_logp, adv, ret = batch
        actor_opt, critic_opt = self.optimizers()
        dist = torch.distributions.Categorical(logits=self.actor(state))
        ratio = torch.exp(dist.log_prob(action) - old_logp)
        clipped = torch.clamp(ratio, 1 - self.hparams.clip_ratio, 1 + self.hparams.clip_ratio) * adv
        actor_loss = -torch.min(ratio * adv, clipped).mean()
        actor_opt.zero_grad()
        self.manual_backward(actor_loss)
        actor_opt.step()
        critic_loss = F.mse_loss(self.critic(state).squeeze(-1), ret)
        critic_opt.zero_grad()
        self.manual_backward(critic_loss)
        critic_opt.step()
        self.log_dict({"actor_loss": actor_loss, "critic_loss": critic_loss}, prog_bar=True)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.actor.parameters(), lr=3e-3), torch.optim.Adam(self.critic.parameters(), lr=1e-2)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RolloutBuffer(self.generate_trajectory_samples), batch_size=self.hparams.batch_size)


def ppo() -> dict[str, torch.Tensor]:
    """Two optimizers stepped by hand on rollouts an IterableDataset generates from the current policy."""
    pl.seed_everything(5)
    model = PPOAgent()
    with tempfile.TemporaryDirectory() as root:
        _trainer(root, max_epochs=5, logger=False, enable_checkpointing=False).fit(model)
    return model.state_dict()


# ---------------------------------------------------------------- 3. classifier tested and predicted from ckpt_path="best"
class LitClassifier(pl.LightningModule):
    def __init__(self, hidden: int = 24, lr: float = 0.02) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Dropout(0.3), nn.Linear(hidden, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y), prog_bar=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_acc", (self(x).argmax(-1) == y).float().mean())

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self(batch[0]).softmax(-1)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def best_checkpoint() -> dict[str, torch.Tensor]:
    """Fit with a monitored ModelCheckpoint, then test and predict from ``ckpt_path="best"``."""
    pl.seed_everything(13)
    model = LitClassifier()
    data = PointsData()
    with tempfile.TemporaryDirectory() as root:
        checkpoint = pl.callbacks.ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=2)
        trainer = _trainer(root, max_epochs=5, callbacks=[checkpoint], logger=False)
        trainer.fit(model, datamodule=data)
        (tested,) = trainer.test(model, datamodule=data, ckpt_path="best", verbose=False)
        predictions = trainer.predict(model, datamodule=data, ckpt_path="best")
        rank_zero_info(f"best: {checkpoint.best_model_score}")
        return {
            **model.state_dict(),
            "test_acc": torch.tensor(tested["test_acc"]),
            "best_score": checkpoint.best_model_score.detach().clone(),
            "predictions": torch.cat(predictions),
        }


# ---------------------------------------------------------------- 4. self-supervised with a stateful online evaluator
class SimSiamLike(pl.LightningModule):
    """Two noisy views of a point pulled together; the labels are never used here."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16))
        self.predictor = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, _ = batch
        z1, z2 = self(x + 0.2 * torch.randn_like(x)), self(x + 0.2 * torch.randn_like(x))
        p1, p2 = self.predictor(z1), self.predictor(z2)
        loss = -(F.cosine_similarity(p1, z2.detach()).mean() + F.cosine_similarity(p2, z1.detach()).mean()) / 2
        self.log("ssl_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class OnlineEvaluator(pl.Callback):
    """Trains a linear probe on detached features with an optimizer it owns; saved in the checkpoint."""

    def __init__(self) -> None:
        self.probe = nn.Linear(16, 3)
        self.optimizer = torch.optim.Adam(self.probe.parameters(), lr=0.01)
        self.seen = 0

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        x, y = batch
        with torch.no_grad():
            features = pl_module(x)
        loss = F.cross_entropy(self.probe(features), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.seen += len(y)
        pl_module.log("probe_loss", loss)

    def state_dict(self) -> dict[str, Any]:
        return {"probe": self.probe.state_dict(), "optimizer": self.optimizer.state_dict(), "seen": self.seen}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.probe.load_state_dict(state_dict["probe"])
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.seen = state_dict["seen"]


def online_evaluator() -> dict[str, torch.Tensor]:
    """Four epochs; the module's weights, the callback's probe, and the probe as last.ckpt holds it."""
    pl.seed_everything(17)
    model, evaluator = SimSiamLike(), OnlineEvaluator()
    with tempfile.TemporaryDirectory() as root:
        checkpoint = pl.callbacks.ModelCheckpoint(dirpath=root, save_last=True)
        _trainer(root, max_epochs=4, callbacks=[evaluator, checkpoint], logger=False).fit(
            model, datamodule=PointsData()
        )
        saved = torch.load(f"{root}/last.ckpt", weights_only=True)["callbacks"]["OnlineEvaluator"]
    probe = {f"probe.{k}": v for k, v in evaluator.probe.state_dict().items()}
    saved_probe = {f"saved_probe.{k}": v for k, v in saved["probe"].items()}
    return {**model.state_dict(), **probe, **saved_probe, "seen": torch.tensor([evaluator.seen, saved["seen"]])}


# ---------------------------------------------------------------- 5. a transformer with an optimizer_step override
class Sequences(Dataset):
    """Copy-task sequences: predict the token three places back."""

    def __init__(self, n: int, seed: int, length: int = 12, vocab: int = 10) -> None:
        self.tokens = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.tokens[i]
        return x, torch.roll(x, 3)


class TinyTransformer(pl.LightningModule):
    def __init__(self, vocab: int = 10, width: int = 16, warmup: int = 10, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.randn(12, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, nhead=2, dim_feedforward=32, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x) + self.position))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x).flatten(0, 1), y.flatten())
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x).flatten(0, 1), y.flatten()))

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        # Linear warm-up of the learning rate over the first steps, then a cosine decay.
        step = self.trainer.global_step
        warm = min(1.0, (step + 1) / self.hparams.warmup)
        decay = 0.5 * (1 + math.cos(math.pi * min(1.0, step / 200)))
        for group in optimizer.param_groups:
            group["lr"] = self.hparams.lr * warm * decay
        optimizer.step(closure=optimizer_closure)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)


def transformer() -> dict[str, torch.Tensor]:
    """Dropout, gradient clipping and accumulation under a hand-written learning-rate schedule."""
    pl.seed_everything(29)
    model = TinyTransformer()
    train = DataLoader(Sequences(128, 0), batch_size=16, shuffle=True)
    val = DataLoader(Sequences(32, 1), batch_size=16)
    with tempfile.TemporaryDirectory() as root:
        trainer = _trainer(root, max_epochs=3, gradient_clip_val=1.0, accumulate_grad_batches=2, logger=False)
        trainer.fit(model, train, val)
    return model.state_dict()


PROGRAMS = {
    "finetuning": finetuning,
    "ppo": ppo,
    "best_checkpoint": best_checkpoint,
    "online_evaluator": online_evaluator,
    "transformer": transformer,
}
