"""The loops, as a package: fit (``fit.py``), the one training step (``step.py``), evaluation and
predict (``evaluation.py``), going through dataloaders (``iteration.py``).

Each loop function's docstring is its hook order; read :func:`~trainer.loops.fit.fit_loop` first. The
loops reach the trainer only through its documented attributes (``progress``, ``hooks``,
``metric_router``, ``checkpointing``, ``preemption``, ``loaders``, the options).
"""

from trainer.loops.evaluation import eval_loop, predict_loop
from trainer.loops.fit import fit_loop
from trainer.loops.step import ManualOptimizer, Window

__all__ = ["ManualOptimizer", "Window", "eval_loop", "fit_loop", "predict_loop"]
