"""State dicts and plain data: keys without wrapper prefixes, tolerant loading, checkpoint-safe values.

DataParallel, DDP and ``torch.compile`` prefix state-dict keys (``module.``, ``_orig_mod.``); a
checkpoint written under one strategy must load under any other, so loading maps keys back to the
module's own names. Every strategy loads through here, and the trainer's checkpoint code reads
plain weights and turns hyperparameters into plain data with the same functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.common.errors import CheckpointError

__all__ = ["load_module_state", "plain_state_dict", "strip_wrapper_prefixes", "to_plain"]

_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_forward_module.")


def plain_state_dict(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """``obj`` if it is a plain state dict (str -> tensor), or the one it holds under a usual key."""
    if obj and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        return dict(obj)
    for key in ("state_dict", "model_state_dict", "model"):
        inner = obj.get(key)
        if isinstance(inner, Mapping) and "format" not in obj:
            return plain_state_dict(inner)
    return None


def strip_wrapper_prefixes(state: Mapping[str, Any]) -> dict[str, Any]:
    """Drop the ``module.`` / ``_orig_mod.`` prefixes DataParallel, DDP and torch.compile add to keys."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        changed = True
        while changed:
            changed = False
            for prefix in _WRAPPER_PREFIXES:
                if key.startswith(prefix):
                    key, changed = key[len(prefix) :], True
        out[key] = value
    return out


def load_module_state(module: nn.Module, state: Mapping[str, Any], strict: bool = True) -> None:
    """Load ``state`` into ``module``, ignoring wrapper prefixes; on mismatch, list what differs.

    A key is used as it is when the module has it, else without the prefixes DataParallel, DDP and
    ``torch.compile`` add (``module.``, ``_orig_mod.``, also inside the key), so a module whose own
    attribute is called ``module`` still loads its own state dict.
    """
    own = module.state_dict()
    state = {_match_key(key, own): value for key, value in state.items()}
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in sorted(set(own) & set(state))
        if isinstance(state[k], torch.Tensor) and state[k].shape != own[k].shape
    ]
    if shapes or (strict and (missing or unexpected)):
        lines = [f"The checkpoint does not match {type(module).__name__}:"]
        if missing:
            lines.append(f"  missing keys ({len(missing)}): {', '.join(missing[:20])}")
        if unexpected:
            lines.append(f"  unexpected keys ({len(unexpected)}): {', '.join(unexpected[:20])}")
        if shapes:
            lines.append(f"  shape mismatches ({len(shapes)}): {'; '.join(shapes[:20])}")
        lines += _torch_wording(module, own, state, strict)
        raise CheckpointError("\n".join(lines))
    module.load_state_dict(state, strict=strict)


def _torch_wording(module: nn.Module, own: Mapping[str, Any], state: Mapping[str, Any], strict: bool) -> list[str]:
    """The same mismatch in ``nn.Module.load_state_dict``'s words, which Lightning users' code matches.

    Keys come in torch's order (the module's for missing ones, the checkpoint's for unexpected ones),
    so ``Unexpected key(s) in state_dict: "c.weight", "c.bias"`` reads as torch (and Lightning) print it.
    """
    errors = []
    if strict:
        missing = [f'"{k}"' for k in own if k not in state]
        unexpected = [f'"{k}"' for k in state if k not in own]
        if missing:
            errors.append(f"Missing key(s) in state_dict: {', '.join(missing)}. ")
        if unexpected:
            errors.append(f"Unexpected key(s) in state_dict: {', '.join(unexpected)}. ")
    for key, value in state.items():
        if key in own and isinstance(value, torch.Tensor) and value.shape != own[key].shape:
            errors.append(
                f"size mismatch for {key}: copying a param with shape {value.shape} from checkpoint, "
                f"the shape in current model is {own[key].shape}."
            )
    return [f"Error(s) in loading state_dict for {type(module).__name__}:", *(f"\t{e}" for e in errors)]


def _match_key(key: str, own: Mapping[str, Any]) -> str:
    """``key`` as the module names it: wrapper prefixes dropped one at a time until it matches."""
    candidate = key.replace("._orig_mod.", ".")
    while candidate not in own:
        prefix = next((p for p in _WRAPPER_PREFIXES if candidate.startswith(p)), None)
        if prefix is None:
            return key  # no match: reported under its own name
        candidate = candidate[len(prefix) :]
    return candidate


def to_plain(obj: Any) -> Any:
    """Turn ``obj`` into tensors, numbers, strings and plain containers (others become their repr)."""
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor)):
        return obj
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    try:  # OmegaConf containers
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(obj, (DictConfig, ListConfig)):
            return to_plain(OmegaConf.to_container(obj, resolve=True))
    except ImportError:  # pragma: no cover - hydra is a dependency
        pass
    return repr(obj)
