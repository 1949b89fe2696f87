"""The errors a user of geartrain may want to catch: mistakes that are theirs to fix.

A config value, a path, a checkpoint, a metric name: each message names what was given (the key,
the file, the metric) and how to fix it. The ``geartrain`` command prints these as a short message
without a traceback and exits with code 1; in Python they are ordinary exceptions.
:class:`UserError` and its subclasses are ``ValueError``\\ s, so code that caught the ``ValueError``
raised before keeps working, and :class:`MisconfigurationException`\\ s (Lightning's name), so Lightning code
catching that catches them. They are defined in the leaf (``trainer.common.errors``), where every
room of geartrain can raise them.

>>> from trainer.errors import UserError, ConfigError
>>> issubclass(ConfigError, ValueError)
True
"""

from __future__ import annotations

from trainer.common.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigError,
    MetricNotLoggedError,
    MisconfigurationException,
    PossibleUserWarning,
    UserError,
)

__all__ = [
    "CheckpointError",
    "CheckpointNotFoundError",
    "ConfigError",
    "MetricNotLoggedError",
    "MisconfigurationException",
    "PossibleUserWarning",
    "UserError",
]
