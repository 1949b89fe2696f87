"""The files ``Trainer.fit(ckpt_path="last")`` passes through until it reads the checkpoint file.

Run ``python -m bench.checkpoint_walk``: it trains a tiny model for one epoch with ``last.ckpt``
saved, then fits again with ``ckpt_path="last"`` under ``sys.setprofile`` and prints the walk: the
call chain from ``Trainer.fit`` to the checkpoint connector (the ancestors), then every call of ours
made while resolving ``"last"`` and restoring, up to ``torch.load`` of the file; consecutive calls in
one file are one step. It says how many files the walk enters and how often it goes back to a file
it had left.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OURS = tuple(str(ROOT / p) + "/" for p in ("trainer", "strategies", "callbacks"))
ENTRY = {("connector.py", "resolve"), ("connector.py", "restore"), ("connector.py", "restart_path")}


def walk(ckpt_root: Path) -> list[str]:
    """The files entered, in order (consecutive calls in one file are one step)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from callbacks import ModelCheckpoint
    from trainer import Trainer, TrainModule

    class Line(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)

    def trainer(epochs: int) -> Trainer:
        cb = ModelCheckpoint(dirpath=ckpt_root, save_last=True, save_top_k=0)
        return Trainer(
            max_epochs=epochs,
            callbacks=[cb],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            strategy="single",
        )

    trainer(1).fit(Line(), data)
    stack: list[str] = []
    seq: list[str] = []
    state: dict[str, Any] = {"entered": -1, "done": False, "chain": False}

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if state["done"]:
            return
        file = frame.f_code.co_filename
        if event == "call":
            if file.endswith("torch/serialization.py") and frame.f_code.co_name == "load" and state["entered"] >= 0:
                state["done"] = True
                return
            if not file.startswith(OURS):
                return
            rel = str(Path(file).relative_to(ROOT))
            stack.append(rel)
            if state["entered"] < 0 and (Path(file).name, frame.f_code.co_name) in ENTRY:
                state["entered"] = len(stack) - 1
                # The chain from Trainer.fit down to here the first time; later, the step from the caller.
                seq.extend(stack if not state["chain"] else stack[-1:])
                state["chain"] = True
            elif state["entered"] >= 0:
                seq.append(rel)
        elif event == "return" and file.startswith(OURS) and stack:
            stack.pop()
            if state["entered"] >= 0 and len(stack) <= state["entered"]:
                # Back in the caller of the entry point: the walk continues from there.
                if stack:
                    seq.append(stack[-1])
                state["entered"] = -1

    sys.setprofile(profile)
    try:
        trainer(2).fit(Line(), data, ckpt_path="last")
    finally:
        sys.setprofile(None)
    steps = [f for i, f in enumerate(seq) if i == 0 or f != seq[i - 1]]
    return steps


def main() -> None:
    """Print the walk, then the number of files, of steps, and of returns to a file already left."""
    with tempfile.TemporaryDirectory() as tmp:
        steps = walk(Path(tmp))
    left: dict[str, int] = {}
    seen: set[str] = set()
    for i, f in enumerate(steps):
        if f in seen and steps[i - 1] != f:
            left[f] = left.get(f, 0) + 1
        seen.add(f)
    for f in steps:
        print(f)
    print(f"{len(set(steps))} files, {len(steps)} steps, returns per file: {left or 'none'}")


if __name__ == "__main__":
    main()
