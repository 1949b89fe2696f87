"""``grad_norm``: each parameter's gradient norm and their total, with Lightning's names and return shape.

A leaf utility (imports nothing of ours), so callbacks can use it. Sharded gradients (FSDP2's
``DTensor``) are gathered into the norm of the full gradient: every rank must call it then.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["full_tensor", "grad_norm"]


def grad_norm(module: nn.Module, norm_type: float | int | str, group_separator: str = "/") -> dict[str, torch.Tensor]:
    """The ``norm_type``-norm of each parameter's gradient, and of all gradients as one vector.

    Lightning's ``lightning.pytorch.utilities.grad_norm``: keys ``grad_{norm_type}_norm{sep}{name}`` per
    parameter with a gradient and ``grad_{norm_type}_norm_total``; values are 0-dim tensors. Call it
    where gradients are complete, e.g. in ``on_before_optimizer_step``
    (``self.log_dict(grad_norm(self, norm_type=2))``); under DDP they are already synchronised there.

    Args:
        module: the module whose parameters' gradients are measured.
        norm_type: the p of the p-norm, cast to float; ``"inf"`` for the largest absolute value.
        group_separator: between the prefix and the parameter's name (TensorBoard groups on ``/``).

    Example:
        >>> layer = nn.Linear(2, 1, bias=False)
        >>> layer.weight.grad = torch.tensor([[3.0, 4.0]])
        >>> {k: float(v) for k, v in grad_norm(layer, 2).items()}
        {'grad_2.0_norm/weight': 5.0, 'grad_2.0_norm_total': 5.0}
    """
    p = float(norm_type)
    if p <= 0:
        raise ValueError(f"`norm_type` must be a positive number or 'inf' (infinity norm). Got norm_type={norm_type!r}")
    norms = {
        f"grad_{p}_norm{group_separator}{name}": full_tensor(torch.linalg.vector_norm(param.grad.detach(), ord=p))
        for name, param in module.named_parameters()
        if param.grad is not None
    }
    if norms:
        # The p-norm of the per-parameter p-norms is the p-norm of all gradients concatenated.
        norms[f"grad_{p}_norm_total"] = torch.linalg.vector_norm(torch.stack(list(norms.values())), ord=p)
    return norms


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as a plain tensor: a ``DTensor`` (FSDP2, tensor parallel) gathered (a collective), else itself."""
    gather = getattr(tensor, "full_tensor", None)
    return gather() if gather is not None else tensor
