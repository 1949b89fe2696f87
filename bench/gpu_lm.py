"""GPU workload: the character-LM transformer at GPT-2 small's shape, bf16 autocast, ``torch.compile``.

``python -m bench.gpu_lm`` trains the ~124M-parameter model (12 layers, 12 heads, width 768, context
1024, vocabulary 50,304) on synthetic token batches held on the device, with geartrain and with a
hand-written loop doing the same (same model, fused AdamW, autocast, compiled forward, loss outside
the compiled region), alternating runs. It reports tokens/s, model FLOPs utilisation (MFU) and the
time ratio. ``--tiny`` shrinks everything so it runs on a CPU in seconds (what the tests do); MFU is
then meaningless and printed only for completeness.

MFU counts the model FLOPs of a training token as ``6 N + 12 L d T`` (N parameters without the
position embedding, L layers, width d, context T: forward and backward of the matmuls plus attention's
scores and weighted sum) and divides the achieved rate by ``--peak-tflops`` (default 989, an H200's
dense bf16 peak).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

from examples.charlm import GPT, GPTConfig
from trainer import Trainer, TrainModule
from trainer.utils import seed_everything

__all__ = ["LMModule", "flops_per_token", "geartrain_run", "hand_run", "main"]

H200_BF16_TFLOPS = 989.0


def flops_per_token(model: GPT) -> float:
    """Training FLOPs per token: ``6 N`` for the weights plus ``12 L d T`` for attention."""
    cfg = model.cfg
    n = model.num_parameters() - model.pos.weight.numel()
    return 6 * n + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size


class LMModule(TrainModule):
    """The GPT as a TrainModule: forward is the network, the loss is computed outside it."""

    def __init__(self, cfg: GPTConfig, lr: float = 6e-4) -> None:
        super().__init__()
        self.model = GPT(cfg)
        self.lr = lr

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(self.model, self.lr)


def make_optimizer(model: GPT, lr: float) -> torch.optim.Optimizer:
    """AdamW, fused on CUDA."""
    fused = next(model.parameters()).is_cuda
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=fused)


class _Batches:
    """The same ``steps`` batches (synthetic token ids, already on the device) every epoch."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Any:
        return iter(self.batches)


def make_batches(cfg: GPTConfig, batch: int, steps: int, device: torch.device) -> _Batches:
    g = torch.Generator(device="cpu").manual_seed(0)
    out = []
    for _ in range(steps):
        tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size + 1), generator=g).to(device)
        out.append((tokens[:, :-1], tokens[:, 1:]))
    return _Batches(out)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Clock:
    """Marks the time (after a device sync) when step ``warmup`` ends and when the last step ends."""

    def __init__(self, device: torch.device, warmup: int) -> None:
        self.device, self.warmup = device, warmup
        self.start = self.end = 0.0

    def step_done(self, step: int, last: bool) -> None:
        if step == self.warmup:
            _sync(self.device)  # one sync at each end of the measured window, none in between
            self.start = time.perf_counter()
        if last:
            _sync(self.device)
            self.end = time.perf_counter()


def geartrain_run(cfg: GPTConfig, batches: _Batches, warmup: int, precision: str, compile: bool) -> float:
    """Seconds for the steps after ``warmup`` with geartrain."""
    from callbacks import Callback

    device = batches.batches[0][0].device
    clock = _Clock(device, warmup)
    steps = len(batches)

    class Timer(Callback):
        def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, i: int) -> None:
            clock.step_done(trainer.global_step, trainer.global_step == steps)

    seed_everything(0)
    module = LMModule(cfg)
    trainer = Trainer(
        strategy="single",
        precision=precision,
        max_steps=steps,
        callbacks=[Timer()],
        enable_progress_bar=False,
        enable_checkpointing=False,
        logger=False,
        num_sanity_val_steps=0,
        compile=compile,
    )
    trainer.fit(module, train_dataloaders=batches)
    return clock.end - clock.start


def hand_run(cfg: GPTConfig, batches: _Batches, warmup: int, precision: str, compile: bool) -> float:
    """Seconds for the steps after ``warmup`` with the hand-written loop."""
    device = batches.batches[0][0].device
    clock = _Clock(device, warmup)
    seed_everything(0)
    model = GPT(cfg).to(device)
    forward: Callable[[torch.Tensor], torch.Tensor] = torch.compile(model) if compile else model
    optimizer = make_optimizer(model, 6e-4)
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    model.train()
    for step, (x, y) in enumerate(batches, start=1):
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = forward(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        clock.step_done(step, step == len(batches))
    return clock.end - clock.start


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the pairs and print the table; returns the figures."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_lm", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--tiny", action="store_true", help="a tiny model on the CPU (smoke test)")
    parser.add_argument("--batch", type=int, default=None, help="sequences per step (default 16; tiny 2)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps (default 30; tiny 3)")
    parser.add_argument("--warmup", type=int, default=None, help="unmeasured first steps (default 10; tiny 1)")
    parser.add_argument("--pairs", type=int, default=None, help="geartrain/hand-written pairs (default 3; tiny 1)")
    parser.add_argument("--precision", default="bf16-mixed", help="geartrain precision name (default bf16-mixed)")
    parser.add_argument("--no-compile", action="store_true", help="eager instead of torch.compile")
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_TFLOPS, help="the device's peak, TFLOP/s")
    args = parser.parse_args(argv)
    tiny = args.tiny
    cfg = GPTConfig(256, 32, 2, 2, 32, 0.0) if tiny else GPTConfig(50304, 1024, 12, 12, 768, 0.0)
    batch = args.batch or (2 if tiny else 16)
    steps = args.steps or (3 if tiny else 30)
    warmup = args.warmup or (1 if tiny else 10)
    pairs = args.pairs or (1 if tiny else 3)
    compile = not args.no_compile and not tiny
    device = torch.device("cpu") if tiny or not torch.cuda.is_available() else torch.device("cuda")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    batches = make_batches(cfg, batch, warmup + steps, device)
    model_flops = flops_per_token(GPT(cfg))
    n_params = GPT(cfg).num_parameters()
    ours: list[float] = []
    theirs: list[float] = []
    for i in range(pairs):
        order = [("ours", geartrain_run), ("theirs", hand_run)]
        for name, fn in order if i % 2 == 0 else order[::-1]:
            seconds = fn(cfg, batches, warmup, args.precision, compile)
            (ours if name == "ours" else theirs).append(seconds)
    tokens = steps * batch * cfg.block_size
    t_ours, t_theirs = statistics.median(ours), statistics.median(theirs)
    ratio = statistics.median(a / b for a, b in zip(ours, theirs))
    result = {
        "params": float(n_params),
        "tokens_per_s": tokens / t_ours,
        "hand_tokens_per_s": tokens / t_theirs,
        "mfu": model_flops * tokens / t_ours / (args.peak_tflops * 1e12),
        "hand_mfu": model_flops * tokens / t_theirs / (args.peak_tflops * 1e12),
        "ratio": ratio,
    }
    print(
        f"{n_params / 1e6:.1f}M parameters, {device.type}, {args.precision}, compile={compile}, batch {batch} x "
        f"{cfg.block_size} tokens, {steps} measured steps after {warmup}, {pairs} pairs, "
        f"peak {args.peak_tflops:g} TFLOP/s{' (tiny: MFU is meaningless)' if tiny else ''}"
    )
    print("| run          | tokens/s   | MFU    | time ratio | target          |")
    print("|--------------|------------|--------|------------|-----------------|")
    print(
        f"| geartrain    | {result['tokens_per_s']:10.0f} | {result['mfu']:6.1%} | {ratio:9.3f}x | MFU >= 40%, <= 1.02x |"
    )
    print(
        f"| hand-written | {result['hand_tokens_per_s']:10.0f} | {result['hand_mfu']:6.1%} |            |                 |"
    )
    return result


if __name__ == "__main__":
    main()
