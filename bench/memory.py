"""Peak memory of geartrain's training loop against a hand-written loop, and what checkpointing saves.

Run ``python -m bench.memory`` (``--quick`` for a small, fast version). Every measurement is one
fresh Python process (glibc told to give tensors over 128 KiB their own mappings, see ``_measure``)
that imports everything, builds the model and data, resets the kernel's
resident-set high-water mark (``/proc/self/clear_refs``), trains a few steps on the CPU and reports
``VmHWM - VmRSS at the reset``: the extra memory training took. The sides run side by side in
rounds, and the median of the per-round ratios is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule

__all__ = ["main", "run"]

ROOT = Path(__file__).resolve().parent.parent
SIZES = {  # activations dominate: each block keeps ~10 * batch * dim floats for backward
    False: {"dim": 128, "depth": 8, "batch": 2048, "steps": 3},
    True: {"dim": 64, "depth": 4, "batch": 1024, "steps": 2},
}
LOOP_TARGET = 1.02  # geartrain / hand-written peak
CHECKPOINT_TARGET = 0.9  # with / without activation checkpointing


class Block(nn.Module):
    """Residual MLP block, 4x wide inside."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class Net(TrainModule):
    """A stack of :class:`Block` and a regression head."""

    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block(dim) for _ in range(depth)])
        self.head = nn.Linear(dim, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.head(self.blocks(x)), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _memory_kib() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in KiB."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS", "VmHWM")))
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def _reset_peak() -> int:
    """Reset the high-water mark to the current resident set (Linux >= 4.0); return that baseline."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # older kernels: the baseline is then the current RSS and the peak may include imports
    return _memory_kib()[0]


def _warm_up(dim: int) -> None:
    """Page in the code every side will run (forward, backward, AdamW, checkpoint, the trainer).

    Shared-library pages count in the resident set as they are first touched; without this, the
    first step's code loading (tens of MiB of libtorch) would swamp what training itself allocates.
    """
    from torch.utils.checkpoint import checkpoint

    import strategies.single  # noqa: F401  (what Trainer(strategy=...) imports lazily)

    tiny = Net(dim, 1)
    optimizer = tiny.configure_optimizers()
    x = torch.randn(4, dim)
    loss = nn.functional.mse_loss(tiny.head(checkpoint(tiny.blocks, x, use_reentrant=False)), x[:, :1])
    loss.backward()
    tiny.training_step((x, x[:, :1]), 0).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def child(kind: str, dim: int, depth: int, batch: int, steps: int) -> float:
    """One measurement in this process: MiB of peak resident memory above the post-setup baseline."""
    torch.set_num_threads(1)  # fewer per-thread buffers: less noise, and fair on a shared machine
    _warm_up(dim)
    torch.manual_seed(0)
    model = Net(dim, depth)
    x = torch.randn(batch * steps, dim)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=batch)
    base = _reset_peak()
    if kind == "hand":
        optimizer = model.configure_optimizers()
        model.train()
        for i, b in enumerate(loader):
            loss = model.training_step(b, i)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    else:
        from strategies import SingleDeviceStrategy

        trainer = Trainer(
            strategy=SingleDeviceStrategy(device="cpu"),
            max_steps=steps,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            activation_checkpointing=[Block] if kind == "checkpointed" else None,
        )
        trainer.fit(model, loader)
    return (_memory_kib()[1] - base) / 1024.0


def _measure(kinds: list[str], size: dict[str, int]) -> list[float]:
    """Run one child per kind, at the same time (resident memory is per process, so they do not
    disturb each other's figure, and the pair sees the same machine load); return their MiB."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    # A fixed mmap threshold (glibc): tensors above 128 KiB get their own mapping, returned to the
    # system when freed, so the resident set follows live tensors. With glibc's default sliding
    # threshold, freed tensors stay in the heap and the high-water mark mostly measures its reuse.
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
    args = [f"--{k}={v}" for k, v in size.items()]
    with tempfile.TemporaryDirectory() as cwd:
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.memory", "--child", kind, *args],
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for kind in kinds
        ]
        results = []
        try:
            for kind, proc in zip(kinds, procs):
                out, err = proc.communicate(timeout=600)
                if proc.returncode != 0:
                    raise RuntimeError(f"bench.memory child {kind!r} failed:\n{err[-3000:]}")
                results.append(float(json.loads(out.strip().splitlines()[-1])["peak_mib"]))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    return results


def _row(name: str, a: list[float], b: list[float], target: float) -> dict[str, Any]:
    ratio = statistics.median(x / y if y > 0 else float("inf") for x, y in zip(a, b))
    return {
        "name": name,
        "geartrain": round(statistics.median(a), 2),
        "baseline": round(statistics.median(b), 2),
        "ratio": round(ratio, 4),
        "target": target,
        "ok": ratio <= target,
    }


def run(quick: bool) -> list[dict[str, Any]]:
    """Both comparisons; rows ``{name, geartrain, baseline, ratio, target, ok}`` (values in MiB).

    Each round runs three fresh processes side by side (hand-written loop, geartrain, geartrain
    with ``activation_checkpointing=[Block]``), in an order that rotates from round to round. Row 1:
    geartrain vs the hand-written loop; row 2: checkpointing on ("geartrain") vs off ("baseline").
    The ratio is the median over rounds of the per-round ratio.
    """
    size, rounds = SIZES[quick], 1 if quick else 5
    kinds = ["hand", "geartrain", "checkpointed"]
    peaks: dict[str, list[float]] = {kind: [] for kind in kinds}
    for i in range(rounds):
        order = kinds[i % 3 :] + kinds[: i % 3]
        for kind, mib in zip(order, _measure(order, size)):
            peaks[kind].append(mib)
    return [
        _row("peak memory, geartrain fit vs hand-written loop (MiB)", peaks["geartrain"], peaks["hand"], LOOP_TARGET),
        _row(
            "peak memory, activation checkpointing on vs off (MiB)",
            peaks["checkpointed"],
            peaks["geartrain"],
            CHECKPOINT_TARGET,
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    """Command line: print the rows as a table (or, with ``--child``, run one measurement)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small model, one pair per comparison")
    parser.add_argument("--child", choices=["hand", "geartrain", "checkpointed"], help=argparse.SUPPRESS)
    for key, value in SIZES[False].items():
        parser.add_argument(f"--{key}", type=int, default=value, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        peak = child(args.child, args.dim, args.depth, args.batch, args.steps)
        print(json.dumps({"peak_mib": peak}))
        return
    size = SIZES[args.quick]
    print(f"bench.memory: {size}, {1 if args.quick else 5} rounds of fresh processes, CPU")
    for row in run(args.quick):
        print(
            f"{row['name']:<58} {row['geartrain']:>9.2f} {row['baseline']:>9.2f}  ratio {row['ratio']:.3f}"
            f"  (target <= {row['target']})  {'ok' if row['ok'] else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
