"""Errors that are the user's to fix: a config value, a path, a checkpoint, a metric name.

Each message names what was given (the key, the file, the metric) and how to fix it. The
``geartrain`` command prints these as a short message without a traceback and exits with code 1;
in Python they are ordinary exceptions. They subclass ``ValueError``, so code that caught the
``ValueError`` raised before keeps working. This module imports nothing, so any room may raise them.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["ConfigError", "MetricNotLoggedError", "UserError", "closest"]


class UserError(ValueError):
    """A mistake in what the user asked for; the message names it and the fix."""


class ConfigError(UserError):
    """A config value or key that cannot work; the message names its key (``optim.lr``)."""


class MetricNotLoggedError(UserError, KeyError):
    """A callback or scheduler monitors a metric that was never logged (a typo, or another module's name).

    Also a ``KeyError``, the type this error had before it had its own.
    """

    def __str__(self) -> str:
        # KeyError's str() quotes its argument, as it expects a key; this one carries a sentence.
        return str(self.args[0]) if self.args else ""


def closest(word: str, choices: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The choice most like ``word`` (for "did you mean ...?"), or ``None`` when none is close.

    Example:
        >>> closest("max_epoch", ["max_steps", "max_epochs", "min_epochs"])
        'max_epochs'
        >>> closest("zzz", ["max_steps"]) is None
        True
    """
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return found[0] if found else None
