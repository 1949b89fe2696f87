"""The loops, as a package: fit (``fit.py``), evaluation and predict (``evaluation.py``), going through
a dataloader (``iteration.py``), the one training step (``step.py``) and its optimizer step, the
accumulation window and the non-finite policy (``optimizer_step.py``).

Each loop function's docstring is its hook order; read :func:`~trainer.loops.fit.fit_loop` first. The
loops are called with the trainer and its run state (``fit_loop(trainer, state)``), write to the run
state only, and read the trainer through its documented attributes.
"""

from trainer.loops.evaluation import eval_loop, predict_loop
from trainer.loops.fit import fit_loop
from trainer.loops.optimizer_step import ManualOptimizer, Window

__all__ = ["ManualOptimizer", "Window", "eval_loop", "fit_loop", "predict_loop"]
