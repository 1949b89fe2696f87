"""Reading a monitored metric once per update, shared by ``ModelCheckpoint`` and ``EarlyStopping``."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch

from trainer.common.errors import MetricNotLoggedError, closest

if TYPE_CHECKING:
    from callbacks.base import Callback
    from trainer.trainer import Trainer

#: What a monitor does about a metric that is still missing after a validation pass.
ON_MISSING = ("raise", "warn")


class MonitorNotLoggedWarning(UserWarning):
    """A monitored metric was never logged; the callback stands aside (``missing_monitor="warn"``)."""


class Monitor:
    """Reads ``name`` from ``trainer.callback_metrics`` and tells whether it changed since the last read.

    The trainer stores a new tensor each time a value is logged, so identity tells a fresh value
    from one left over by an earlier epoch (e.g. a validation metric in an epoch without validation,
    ``check_val_every_n_epoch > 1``). A name that is still missing after a validation pass has run
    was never logged: a typo, or a module that logs other metrics. With ``on_missing="raise"``
    :meth:`read` raises :class:`~trainer.errors.MetricNotLoggedError`; with ``"warn"`` it says so
    once (rank 0) and keeps returning ``None``, so the owner stands aside.

    Args:
        owner: the callback, for messages: its class name, and its ``config_key`` for the fix.
        name: the metric key.
        on_missing: ``"raise"`` or ``"warn"``.
        consequence: what standing aside means for the owner, for the ``"warn"`` message.
    """

    def __init__(self, owner: Callback, name: str, on_missing: str = "raise", consequence: str = "") -> None:
        self.callback = owner
        self.owner = type(owner).__name__
        if on_missing not in ON_MISSING:
            raise ValueError(f"{self.owner}: a missing monitor can {' or '.join(ON_MISSING)}, got {on_missing!r}")
        self.name = name
        self.on_missing = on_missing
        self.consequence = consequence
        #: Set by the owner when a (non-sanity) validation pass ended: every metric kind was logged once.
        self.validated = False
        self.seen = False
        #: The one-time message of ``on_missing="warn"`` was given.
        self.told = False
        self._last: torch.Tensor | None = None

    def __eq__(self, other: object) -> bool:
        """Same settings and progress (the owner by class name): a pickled copy equals the original."""
        if not isinstance(other, Monitor):
            return NotImplemented
        fields = ("owner", "name", "on_missing", "consequence", "validated", "seen", "told")
        if any(getattr(self, f) != getattr(other, f) for f in fields):
            return False
        if self._last is None or other._last is None:
            return self._last is other._last
        return bool(torch.equal(self._last, other._last))

    __hash__ = None  # type: ignore[assignment]  # mutable: equal by value

    def read(self, trainer: Trainer) -> torch.Tensor | None:
        """The value if it was logged since the previous read; ``None`` if absent or not updated."""
        value = trainer.callback_metrics.get(self.name)
        if value is None:
            if self.validated:
                self._missing(trainer)
            return None
        if value is self._last:
            return None
        self._last = value
        self.seen = True
        return value

    def _missing(self, trainer: Trainer) -> None:
        logged = sorted(trainer.callback_metrics)
        message = (
            f"{self.owner}(monitor={self.name!r}): that metric was never logged "
            f"(logged: {', '.join(logged) or 'nothing'})"
        )
        if self.on_missing == "raise":
            raise MetricNotLoggedError(f"{message}. {self.fix(logged)}")
        if not self.told and trainer.is_global_zero:
            warnings.warn(f"{message}; {self.consequence}. {self.fix(logged)}", MonitorNotLoggedWarning, stacklevel=2)
        self.told = True

    def warn_if_never_seen(self, trainer: Trainer, consequence: str) -> None:
        """At the end of fit: say (rank 0, once) that a metric never logged had ``consequence``."""
        if not self.seen and not self.told and trainer.is_global_zero:
            warnings.warn(
                f"{self.owner}(monitor={self.name!r}): the metric was never logged during fit, so {consequence}",
                MonitorNotLoggedWarning,
                stacklevel=3,
            )

    def fix(self, logged: list[str]) -> str:
        """How to monitor a metric that exists: the override under ``geartrain``, the argument in Python."""
        suggestion = closest(self.name, logged, cutoff=0.0) or "<metric>"
        key = self.callback.config_key
        if key is not None:
            return f"To monitor another metric: {key}.monitor={suggestion} (and {key}.mode=min or max)"
        return f"To monitor another metric: {self.owner}(monitor={suggestion!r}, mode='min' or 'max')"
