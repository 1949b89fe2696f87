"""A small decoder-only transformer that learns to write like Jane Austen, one character at a time.

``geartrain experiment=charlm`` trains it on ``examples/data/charlm_corpus.txt`` (Austen's *Persuasion*,
1817, public domain, 467 KB; origin in ``examples/data/README.md``) in a couple of minutes on a CPU, and
prints generated text at the end.
``experiment=charlm_amp`` trains under bf16/fp16 autocast, ``experiment=charlm_ddp`` with two DDP
processes. :class:`GPT` is the plain PyTorch network; ``bench/gpu_lm.py`` scales it to GPT-2 small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from trainer import DataModule, TrainModule

__all__ = ["DEFAULT_PATH", "GPT", "VOCAB", "CharData", "CharLM", "GPTConfig", "decode", "encode"]

#: Newline plus printable ASCII: the whole vocabulary (the bundled novel uses nothing else).
VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))
#: The bundled corpus.
DEFAULT_PATH = Path(__file__).resolve().parent / "data" / "charlm_corpus.txt"

_INDEX = {c: i for i, c in enumerate(VOCAB)}


def encode(text: str) -> torch.Tensor:
    """Characters to token ids (characters outside the vocabulary become ``?``)."""
    unknown = _INDEX["?"]
    return torch.tensor([_INDEX.get(c, unknown) for c in text], dtype=torch.long)


def decode(ids: torch.Tensor) -> str:
    """Token ids back to text."""
    return "".join(VOCAB[i] for i in ids.tolist())


@dataclass
class GPTConfig:
    """Shape of the network; the defaults are the CPU example's, GPT-2 small is ``(12, 12, 768, 1024)``."""

    vocab_size: int = len(VOCAB)
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a 4x GELU MLP, each residual."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd),
            nn.GELU(),
            nn.Linear(4 * cfg.n_embd, cfg.n_embd),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=2)
        head = c // self.n_head  # heads counted from q's width, which tensor parallelism may split
        q, k, v = (z.view(b, t, z.shape[-1] // head, head).transpose(1, 2) for z in (q, k, v))
        # Flash / memory-efficient attention where the device has it.
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, -1))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, ``n_layer`` blocks, final norm, output head tied to the embedding."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith(("proj.weight", "mlp.2.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_parameters(self) -> int:
        """Parameters, the tied embedding counted once."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, time, vocab)`` for token ids ``(batch, time)``."""
        t = idx.shape[1]
        x = self.drop(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy."""
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, new_tokens: int, temperature: float = 0.8, seed: int = 0) -> torch.Tensor:
        """Append ``new_tokens`` sampled tokens to ``idx`` (seeded, so a run always prints the same text)."""
        generator = torch.Generator(device=idx.device).manual_seed(seed)
        for _ in range(new_tokens):
            logits = self(idx[:, -self.cfg.block_size :])[:, -1, :].float() / temperature
            nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


class CharLM(TrainModule):
    """The GPT as a TrainModule: next-character loss, AdamW with warm-up and cosine decay, a sample at the end.

    Args:
        n_layer, n_head, n_embd, block_size, dropout: the network's shape (:class:`GPTConfig`).
        lr: peak learning rate.
        weight_decay: AdamW decay of the weight matrices (not of biases, norms and embeddings).
        warmup_steps: linear warm-up before the cosine decay (over ``max_steps``, else 1000 steps).
        sample_chars: characters generated and printed when training ends (0 for none).
        prompt: text the sample continues.
    """

    def __init__(
        self,
        n_layer: int = 2,
        n_head: int = 4,
        n_embd: int = 64,
        block_size: int = 64,
        dropout: float = 0.0,
        lr: float = 3e-3,
        weight_decay: float = 0.1,
        warmup_steps: int = 30,
        sample_chars: int = 300,
        prompt: str = "Anne ",
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = GPT(GPTConfig(len(VOCAB), block_size, n_layer, n_head, n_embd, dropout))
        self.lr, self.weight_decay, self.warmup_steps = lr, weight_decay, warmup_steps
        self.sample_chars, self.prompt = sample_chars, prompt
        self.sample = ""  # the text generated at the end of fit

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def _loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("val/loss", self._loss(batch), prog_bar=True, sync_dist=True)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("test/loss", self._loss(batch), sync_dist=True)

    def configure_optimizers(self) -> dict[str, Any]:
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.lr,
            betas=(0.9, 0.95),
        )
        total = self.trainer.max_steps if self.trainer.max_steps > 0 else 1000
        warmup = max(1, min(self.warmup_steps, total // 2))

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_fit_end(self) -> None:
        """Generate and print a sample (rank 0 only; other ranks skip: generation is local)."""
        if self.sample_chars <= 0 or not self.trainer.is_global_zero:
            return
        was_training = self.training
        self.eval()
        start = encode(self.prompt).unsqueeze(0).to(self.device)
        self.sample = decode(self.model.generate(start, self.sample_chars)[0])
        self.train(was_training)
        print(f"--- sample after {self.global_step} steps ---\n{self.sample}\n---")


class _Windows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Non-overlapping ``block_size`` windows of ``ids``; the target is the window shifted by one."""

    def __init__(self, ids: torch.Tensor, block_size: int) -> None:
        self.ids, self.block_size = ids, block_size

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.block_size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.block_size
        chunk = self.ids[start : start + self.block_size + 1]
        return chunk[:-1], chunk[1:]


class CharData(DataModule):
    """The corpus as next-character windows: the first ``1 - val_fraction`` trains, the rest validates.

    Args:
        batch_size: windows per batch (per process under DDP).
        block_size: characters per window (the model's context).
        val_fraction: tail share of the text held out for validation and test.
        path: the corpus file (default: the bundled one).
        num_workers: DataLoader worker processes.
    """

    def __init__(
        self,
        batch_size: int = 32,
        block_size: int = 64,
        val_fraction: float = 0.1,
        path: str | None = None,
        num_workers: int = 0,
    ) -> None:
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        self.batch_size, self.block_size, self.val_fraction = batch_size, block_size, val_fraction
        self.path = Path(path) if path is not None else DEFAULT_PATH
        self.num_workers = num_workers
        self.train_set: _Windows | None = None
        self.val_set: _Windows | None = None

    def setup(self, stage: str) -> None:
        if self.train_set is not None:
            return
        if not self.path.is_file():
            raise FileNotFoundError(f"corpus {self.path} is missing")
        ids = encode(self.path.read_text(encoding="utf-8"))
        split = int(len(ids) * (1 - self.val_fraction))
        self.train_set = _Windows(ids[:split], self.block_size)
        self.val_set = _Windows(ids[split:], self.block_size)

    def train_dataloader(self) -> DataLoader[Any]:
        assert self.train_set is not None, "call setup() first"
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader[Any]:
        assert self.val_set is not None, "call setup() first"
        return DataLoader(self.val_set, batch_size=self.batch_size, num_workers=self.num_workers)

    def test_dataloader(self) -> DataLoader[Any]:
        return self.val_dataloader()
