"""All-gathered bytes per FSDP step: bf16-mixed through ``MixedPrecisionPolicy`` vs through autocast.

    python -m bench.fsdp_policy [--steps 4]

Two gloo processes train the same 4-block MLP under ``strategy="fsdp"``, ``precision="bf16-mixed"``,
once with geartrain's policy (parameters all-gathered in bfloat16) and once the way FSDP ran before
(float32 parameters all-gathered, autocast in the forward). Each rank counts the bytes FSDP's
all-gathers receive (``torch.distributed.all_gather_single``, which FSDP2 calls) and prints one line.
Bytes, not time: on a shared CPU the gloo times are noise, while the bytes are what a GPU
interconnect pays; ``bench/gpu_check.py`` measures the step time on a GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

__all__ = ["measure", "rank_job"]

WORLD = 2


def _autocast_fsdp() -> Any:
    from strategies import FSDPStrategy

    class AutocastFSDP(FSDPStrategy):
        """FSDP as before the policy: the plugin's autocast kept, float32 parameters gathered."""

        def _sharded_precision(self, precision: Any) -> Any:
            return precision

    return AutocastFSDP(precision="bf16-mixed")


def rank_job(steps: int) -> dict[str, float]:
    """In each rank: bytes all-gathered per step with the policy and with autocast."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    from bench.gpu_check import SmallNet
    from trainer import Trainer

    received = [0]
    original = dist.all_gather_single

    def counting(output: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        received[0] += output.numel() * output.element_size()
        return original(output, *args, **kwargs)

    dist.all_gather_single = counting  # type: ignore[assignment]
    out: dict[str, float] = {}
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64 * steps, 256, generator=g)
    data = TensorDataset(x, x[:, :8].sum(dim=1, keepdim=True))
    for name, strategy in (("policy", "fsdp"), ("autocast", _autocast_fsdp())):
        received[0] = 0
        module = SmallNet()
        trainer = Trainer(
            strategy=strategy,
            precision="bf16-mixed",
            max_steps=steps,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
        )
        trainer.fit(module, DataLoader(data, batch_size=64 // WORLD))
        out[name] = received[0] / steps
    dist.all_gather_single = original
    return out


def measure(steps: int = 4) -> dict[str, float]:
    """Rank 0's bytes per step for both (two processes started as ``Trainer`` starts them), and their ratio (policy / autocast)."""
    from strategies.launch import start_processes

    result: dict[str, float] = start_processes(rank_job, (steps,), WORLD)
    return {**result, "ratio": result["policy"] / result["autocast"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    out = measure(parser.parse_args().steps)
    print(
        f"fsdp bf16-mixed, {WORLD} gloo ranks: policy all-gathers {out['policy'] / 1e6:.3f} MB/step per rank, "
        f"autocast {out['autocast'] / 1e6:.3f} MB/step ({out['ratio']:.2f}x)"
    )


if __name__ == "__main__":
    main()
