"""Whole-process figures: ``from trainer import Trainer`` against ``import torch``, and a one-step ``geartrain`` run.

Each is a fresh ``python`` process (this interpreter, with this checkout on ``PYTHONPATH``), timed
from start to exit, so module imports and interpreter start-up are inside the measurement.
"""

from __future__ import annotations

import tempfile

from bench.core import REPO_ROOT, Result, paired, process_time

__all__ = ["run_import", "run_startup"]

#: What the default job needs whatever runs it: torch, its bundled data (read with NumPy), and an AdamW
#: optimizer, whose construction imports ``torch._dynamo`` (``Optimizer.add_param_group`` is wrapped
#: in ``torch._disable_dynamo``, which imports it on first call: the largest part of the start-up, printed by this benchmark).
_JOB_LIBRARIES = (
    "import numpy, torch; "
    f"d = numpy.load({str(REPO_ROOT / 'examples' / 'data' / 'digits.npz')!r}); d['images'], d['labels']; "
    "torch.optim.AdamW([torch.zeros(1, requires_grad=True)])"
)


def run_import(quick: bool = False, pairs: int = 5) -> list[Result]:
    """``python -c "from trainer import Trainer"`` against ``python -c "import torch"``.

    ``import trainer`` alone imports nothing (the package is lazy), so the figure is what a user's
    script pays: the Trainer, which imports torch.
    """
    a, b, ratio, ratios = paired(
        lambda: process_time(["-c", "from trainer import Trainer"]),
        lambda: process_time(["-c", "import torch"]),
        pairs,
        warmup=0 if quick else 1,
    )
    return [
        Result(
            "from trainer import Trainer vs import torch",
            a,
            b,
            ratio,
            "<= 1.10x",
            ratio <= 1.10,
            "fresh process each; tensorboard, torchmetrics, hydra, rich, sklearn are not imported",
            ratios,
        )
    ]


def run_startup(quick: bool = False, pairs: int = 3) -> list[Result]:
    """``geartrain trainer.max_steps=1`` (the default job, one step) against ``import torch`` + 1.5 s."""
    with tempfile.TemporaryDirectory() as tmp:
        job = [
            "-m",
            "trainer",
            "trainer.max_steps=1",
            f"hydra.run.dir={tmp}/run",
        ]
        a, b, ratio, ratios = paired(
            lambda: process_time(job, cwd=tmp), lambda: process_time(["-c", "import torch"]), pairs, warmup=0
        )
        c, d, ratio2, ratios2 = paired(
            lambda: process_time(job, cwd=tmp), lambda: process_time(["-c", _JOB_LIBRARIES]), pairs, warmup=0
        )
    return [
        Result(
            "start-up: geartrain trainer.max_steps=1",
            a,
            b,
            ratio,
            "<= torch + 1.5 s",
            a - b <= 1.5,
            f"the default digits job (fit one step, then test), whole process; {a - b:.2f} s more than import torch",
            ratios,
        ),
        Result(
            "start-up, against the job's own libraries",
            c,
            d,
            ratio2,
            "<= libs + 1.5 s",
            c - d <= 1.5,
            f"twin: import torch, read the bundled digits, build AdamW (which imports torch._dynamo), "
            f"geartrain's own share {c - d:.2f} s (Hydra, the loop, TensorBoard)",
            ratios2,
        ),
    ]
