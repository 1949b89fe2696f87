"""Training loaders that keep their own position: their state in checkpoints, as Lightning keeps it.

A training iterable (the one given, or one of a collection) with ``state_dict()`` and
``load_state_dict()`` (Lightning's ``_Stateful``: a torchdata ``StatefulDataLoader``, a user's
iterable) has its state saved in every checkpoint where Lightning keeps it,
``loops["fit_loop"]["state_dict"]["combined_loader"]`` (one entry per stateful iterable, in the
collection's flattened order), and loaded back into the same iterables when a fit resumes from it.

Such a loader resumes from its own state: the trainer does not also drop the batches already
trained, as it does for an iterable without state (``trainer/loops/iteration.py``). In a collection
that mixes both, the iterables without state start their epoch over, as in Lightning; a warning says
so. Under DDP the file holds rank 0's states, and every rank loads them (Lightning's rule).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from trainer.data.loaders import InCollection, ZipLoaders
from trainer.data.resumable import ResumableBatchSampler

__all__ = ["LOADER_STATES", "checkpoint_loops", "is_stateful", "load_states", "saved_states"]

#: The key of the stateful iterables' states in the fit loop's ``state_dict`` (Lightning's).
LOADER_STATES = "combined_loader"


def is_stateful(obj: Any) -> bool:
    """Lightning's test of a stateful iterable: it has ``state_dict`` and ``load_state_dict`` methods."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _members(loader: Iterable[Any] | None) -> list[Any]:
    """The iterables of a prepared training loader, in the collection's flattened order."""
    if loader is None:
        return []
    if isinstance(loader, (ZipLoaders, InCollection)):
        return list(loader.loaders)
    return [loader]


def checkpoint_loops(loader: Iterable[Any] | None) -> dict[str, Any]:
    """What the training ``loader`` adds to a checkpoint's ``loops`` entry: the sampler's epoch order
    (``epoch_rng``) and the stateful iterables' states (:data:`LOADER_STATES`), each when there is one."""
    loops: dict[str, Any] = {}
    sampler = getattr(loader, "batch_sampler", None)
    if isinstance(sampler, ResumableBatchSampler) and sampler.epoch_rng is not None:
        loops["epoch_rng"] = sampler.epoch_rng
    states = [member.state_dict() for member in _members(loader) if is_stateful(member)]
    if states:
        loops[LOADER_STATES] = states
    return loops


def saved_states(loops: dict[str, Any]) -> list[dict[str, Any]]:
    """The stateful iterables' states in a checkpoint's ``loops`` entry (Lightning's place; [] if none)."""
    return list((loops.get("fit_loop") or {}).get("state_dict", {}).get(LOADER_STATES) or [])


def load_states(loader: Iterable[Any], states: list[dict[str, Any]], mid_epoch: bool) -> bool:
    """Load ``states`` into the stateful iterables of ``loader``; whether any was loaded.

    ``mid_epoch``: the resume continues an epoch (its iterables without state start it over: warned).
    Raises Lightning's ``RuntimeError`` when the number of stateful iterables differs from the saved one.
    """
    if not states:
        return False
    members = _members(loader)
    stateful = [member for member in members if is_stateful(member)]
    if len(stateful) != len(states):
        raise RuntimeError(
            f"The CombinedLoader has {len(stateful)} stateful loaders, but found {len(states)} states in the "
            "checkpoint. Please make sure you define the same dataloaders that were used when saving the "
            "checkpoint (the iterables with state_dict() and load_state_dict(), in the same order)."
        )
    for member, state in zip(stateful, states):
        member.load_state_dict(state)
    if mid_epoch and len(stateful) < len(members):
        warnings.warn(
            f"Resuming inside an epoch: {len(stateful)} of the {len(members)} training iterables continue from "
            "their saved state; the others have no state_dict()/load_state_dict() and start the epoch over, as "
            "in Lightning. Give them both methods to continue them where they stopped.",
            stacklevel=3,
        )
    return True
