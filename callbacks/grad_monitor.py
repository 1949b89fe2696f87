"""``GradientMonitor``: gradient norms as scalars and weight/gradient histograms, for TensorBoard.

Off by default (add it to ``callbacks``). Every ``log_every_n_steps`` optimizer steps, just before the
step (in ``on_before_optimizer_step``, where the gradients are complete: accumulated, synchronised
across DDP ranks, and unscaled under ``16-mixed``), it hands Lightning's ``grad_norm`` values
(``grad_2.0_norm/<param>``, ``grad_2.0_norm_total``) to every logger and, with ``histograms=True``,
writes ``weights/<param>`` and ``gradients/<param>`` histograms to the loggers that draw them
(TensorBoard's ``add_histogram``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from callbacks.base import Callback
from trainer.common.grad_norm import full_tensor, grad_norm

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["GradientMonitor"]


class GradientMonitor(Callback):
    """Log gradient norms (and optionally histograms) every ``log_every_n_steps`` optimizer steps.

    Args:
        log_every_n_steps: how often, in optimizer steps, counted from the first (``None``: the
            trainer's ``log_every_n_steps``).
        norm_type: the p of the norms (``2.0``; ``"inf"`` for the largest absolute value).
        histograms: also write a histogram of every parameter and of its gradient.
        group_separator: between ``grad_{p}_norm`` and the parameter's name (``/`` groups them in
            TensorBoard).

    Example:
        >>> from callbacks import GradientMonitor
        >>> monitor = GradientMonitor(log_every_n_steps=10, histograms=True)
    """

    def __init__(
        self,
        log_every_n_steps: int | None = None,
        norm_type: float | int | str = 2.0,
        histograms: bool = False,
        group_separator: str = "/",
    ) -> None:
        if log_every_n_steps is not None and (not isinstance(log_every_n_steps, int) or log_every_n_steps < 1):
            raise ValueError(f"GradientMonitor(log_every_n_steps={log_every_n_steps!r}): expected a positive int")
        if float(norm_type) <= 0:
            raise ValueError(f"GradientMonitor(norm_type={norm_type!r}): expected a positive number or 'inf'")
        self.log_every_n_steps = log_every_n_steps
        self.norm_type = float(norm_type)
        self.histograms = histograms
        self.group_separator = group_separator

    @override
    def on_before_optimizer_step(self, trainer: Trainer, pl_module: TrainModule, optimizer: Any) -> None:
        every = self.log_every_n_steps or trainer.log_every_n_steps
        step = trainer.global_step
        if not every or step % every:  # the trainer's 0: never
            return
        # Under 16-mixed the gradients are still scaled here; the precision unscales them at most once a
        # step, so the clipping and the optimizer step that follow see the same values as without us.
        trainer.strategy.precision.unscale_gradients(optimizer)
        norms = grad_norm(pl_module, self.norm_type, self.group_separator)
        if norms:
            trainer.log_metrics(norms, step=step)
        if self.histograms:
            self._histograms(trainer, pl_module, step)

    def _histograms(self, trainer: Trainer, pl_module: TrainModule, step: int) -> None:
        """``weights/<name>`` and ``gradients/<name>`` to every logger whose ``experiment`` draws histograms."""
        values: dict[str, torch.Tensor] = {}
        for name, param in pl_module.named_parameters():
            # Gathered on every rank (a collective under FSDP), written by rank 0 only.
            values[f"weights/{name}"] = full_tensor(param.detach())
            if param.grad is not None:
                values[f"gradients/{name}"] = full_tensor(param.grad.detach())
        for logger in trainer.loggers:
            add_histogram = getattr(getattr(logger, "experiment", None), "add_histogram", None)
            if add_histogram is None:
                continue
            for tag, tensor in values.items():
                add_histogram(tag, tensor.float().cpu(), step)
