"""What the fit loop tells the user, in Lightning's words: its warnings and info lines.

Kept out of :mod:`trainer.loops.fit` so the loop reads as the loop. Each says something that may be
a mistake (a ``PossibleUserWarning``) or why the run does not do what was asked yet (an info line on
the ``trainer`` logger, at most once a Trainer, as Lightning's ``WarningCache`` says it once).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from trainer.common.errors import PossibleUserWarning
from trainer.common.rank_zero import rank_zero_info
from trainer.loops.iteration import num_batches

if TYPE_CHECKING:
    import torch

    from trainer.run_state import RunState
    from trainer.trainer import Trainer

__all__ = ["tell_stop_waits", "warn_if_fewer_batches_than_log_interval", "warn_if_in_eval_mode"]


def warn_if_fewer_batches_than_log_interval(trainer: Trainer, state: RunState, loader: Any) -> None:
    """Lightning's warning: with loggers, an epoch shorter than ``log_every_n_steps`` logs no training step."""
    if loader is None or not trainer.loggers or state.loop.fast_dev_run:
        return
    num = num_batches(loader, state.loop.limits["fit"])
    every = state.loop.log_every_n_steps
    if num < every and trainer.is_global_zero:
        warnings.warn(
            f"The number of training batches ({int(num)}) is smaller than the logging interval "
            f"Trainer(log_every_n_steps={every}). Set a lower value for log_every_n_steps if you want to see logs "
            "for the training epoch.",
            PossibleUserWarning,
            stacklevel=3,
        )


def warn_if_in_eval_mode(module: torch.nn.Module) -> None:
    """Say when submodules will train in eval mode (frozen batch norm may be meant; a forgotten ``eval()`` not)."""
    in_eval = [name or type(module).__name__ for name, sub in module.named_modules() if not sub.training]
    if in_eval:
        warnings.warn(
            f"{len(in_eval)} module(s) are in eval mode at the start of training ({', '.join(in_eval[:5])}"
            f"{', ...' if len(in_eval) > 5 else ''}); they stay so. Call .train() on them if that is not meant.",
            PossibleUserWarning,
            stacklevel=2,
        )


def tell_stop_waits(state: RunState) -> None:
    """Lightning's info line, once a Trainer: a stop was asked for (``should_stop``) before ``min_epochs``/``min_steps``.

    The values are the ones given (``None`` when unset), as Lightning prints them.
    """
    if "stop_waits" in state.told:
        return
    state.told.add("stop_waits")
    rank_zero_info(
        f"Trainer was signaled to stop but the required `min_epochs={state.loop.min_epochs or None!r}` or"
        f" `min_steps={state.loop.min_steps or None!r}` has not been met. Training will continue..."
    )
