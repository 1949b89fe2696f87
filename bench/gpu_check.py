"""Run every strategy and precision on CUDA at world size 1 and print a pass/fail table with steps/s.

    python bench/gpu_check.py [--steps 200]

Rows: single (fp32), dp on one GPU, ddp over nccl (world size 1), amp fp16 (GradScaler), amp bf16,
bf16-true, fsdp (world size 1), model_parallel (a 1x1 mesh, tensor-parallel plan applied in
configure_model). A row passes when training ran, the loss went down and the weights are finite.
Then one summary line compares FSDP bf16-mixed through ``MixedPrecisionPolicy`` with FSDP under
autocast: the bytes one step all-gathers (parameter dtype x count x gathers, forward and backward)
and the measured step time. Without CUDA it prints a message and exits with status 0 (there is nothing to check); CI
machines have no GPU, so this script is run by hand on one.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule, seed_everything

ROWS: list[tuple[str, dict[str, Any]]] = [
    ("single fp32", {"strategy": "single"}),
    ("dp (1 GPU)", {"strategy": "dp"}),
    ("ddp nccl ws=1", {"strategy": "ddp", "devices": 1}),
    ("amp fp16+scaler", {"strategy": "amp", "precision": "16-mixed"}),
    ("amp bf16", {"strategy": "amp", "precision": "bf16-mixed"}),
    ("single bf16-true", {"strategy": "single", "precision": "bf16-true"}),
    ("fsdp ws=1", {"strategy": "fsdp", "devices": 1}),
    ("ddp bf16-mixed", {"strategy": "ddp", "devices": 1, "precision": "bf16-mixed"}),
    ("fsdp bf16 policy", {"strategy": "fsdp", "devices": 1, "precision": "bf16-mixed"}),
    ("model_parallel 1x1", {"strategy": "model_parallel", "devices": 1, "precision": "bf16-mixed"}),
]


class SmallNet(TrainModule):
    """A 4-block MLP regressor; blocks in a ModuleList so FSDP shards them."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(256, 256) for _ in range(4)])
        self.head = nn.Linear(256, 1)
        self.losses: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x).float(), y)
        if batch_idx % 20 == 0:
            self.losses.append(float(loss))  # a sync, every 20 steps only
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def configure_model(self) -> None:
        """Under model_parallel: a Colwise/Rowwise plan over pairs of blocks, FSDP over data-parallel ranks."""
        if self.device_mesh is None or self.device_mesh.ndim != 2:
            return
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        tp, dp = self.device_mesh["tensor_parallel"], self.device_mesh["data_parallel"]
        plan: dict[str, Any] = {
            f"{i}": ColwiseParallel() if i % 2 == 0 else RowwiseParallel() for i in range(len(self.blocks))
        }
        parallelize_module(self.blocks, tp, plan)
        for block in self.blocks:
            fully_shard(block, mesh=dp)
        fully_shard(self.head, mesh=dp)


def autocast_fsdp() -> Any:
    """FSDP as before the policy: float32 parameters all-gathered, autocast in the forward."""
    from strategies import FSDPStrategy

    class AutocastFSDP(FSDPStrategy):
        def _sharded_precision(self, precision: Any) -> Any:
            return precision

    return AutocastFSDP(devices=1, precision="bf16-mixed")


def gathered_bytes(module: nn.Module, dtype: torch.dtype) -> int:
    """Bytes all-gathered per step when every parameter is gathered in ``dtype`` for forward and again
    for backward (``reshard_after_forward=True``); on N ranks each receives (N - 1)/N of it."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * itemsize * sum(p.numel() for p in module.parameters())


def policy_summary(steps: int) -> str:
    """One line: FSDP bf16 through MixedPrecisionPolicy vs autocast, bytes gathered and step time."""
    rates = {}
    for name, options in (("policy", {"strategy": "fsdp", "devices": 1}), ("autocast", {"strategy": autocast_fsdp()})):
        ok, rate, _ = check({**options, "precision": "bf16-mixed"}, steps)
        rates[name] = rate if ok else float("nan")
    policy, autocast = gathered_bytes(SmallNet(), torch.bfloat16), gathered_bytes(SmallNet(), torch.float32)
    return (
        f"fsdp bf16: policy all-gathers {policy / 1e6:.2f} MB/step vs autocast {autocast / 1e6:.2f} MB/step "
        f"({policy / autocast:.2f}x); step time {1e3 / rates['policy']:.2f} ms vs {1e3 / rates['autocast']:.2f} ms"
    )


def check(options: dict[str, Any], steps: int) -> tuple[bool, float, str]:
    seed_everything(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8192, 256, generator=g)
    y = x[:, :8].sum(dim=1, keepdim=True)
    module = SmallNet()
    trainer = Trainer(
        **options,
        max_steps=steps,
        enable_progress_bar=False,
        enable_checkpointing=False,
        logger=False,
        num_sanity_val_steps=0,
    )
    start = time.perf_counter()
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=256, shuffle=True))
    torch.cuda.synchronize()
    rate = steps / (time.perf_counter() - start)
    finite = all(bool(torch.isfinite(p).all()) for p in module.state_dict().values() if p.is_floating_point())
    learned = module.losses[-1] < module.losses[0]
    note = f"loss {module.losses[0]:.3f} -> {module.losses[-1]:.3f}; {trainer.strategy.root_device}"
    return finite and learned, rate, note


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: CUDA is not available on this machine; nothing to check (run it on a GPU machine).")
        return 0
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} GPU(s)")
    print(f"{'row':<18} {'result':<6} {'steps/s':>8}  note")
    failures = 0
    for name, options in ROWS:
        try:
            ok, rate, note = check(options, args.steps)
        except Exception as exc:  # a failing row is reported, the others still run
            ok, rate, note = False, 0.0, f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        failures += not ok
        print(f"{name:<18} {'PASS' if ok else 'FAIL':<6} {rate:>8.1f}  {note}", flush=True)
    try:
        print(policy_summary(args.steps), flush=True)
    except Exception as exc:
        failures += 1
        print(f"fsdp bf16 policy vs autocast: FAIL {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
