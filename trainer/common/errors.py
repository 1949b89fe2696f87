"""Exceptions raised by one room of geartrain and caught by another.

They live in the leaf so that the code raising them (a strategy's launcher, a state-dict loader)
does not have to import the trainer that catches them.
"""

from __future__ import annotations

__all__ = ["CheckpointError", "Preempted"]


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, read, or applied; the message says which file and why."""


class Preempted(Exception):
    """Raised inside the loop after a preemption checkpoint was saved; ``Trainer._run`` catches it.

    The launcher raises it too, when a signal stopped the processes it started (they saved first).
    """
