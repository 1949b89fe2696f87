"""Reading a monitored metric once per update, shared by ``ModelCheckpoint`` and ``EarlyStopping``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from trainer.trainer import Trainer


class Monitor:
    """Reads ``name`` from ``trainer.callback_metrics`` and tells whether it changed since the last read.

    The trainer stores a new tensor each time a value is logged, so identity tells a fresh value
    from one left over by an earlier epoch (e.g. a validation metric in an epoch without validation,
    ``check_val_every_n_epoch > 1``). A name that is still missing after a validation pass has run
    was never logged: that is a typo, and :meth:`read` raises.

    Args:
        owner: the callback's name, for error messages.
        name: the metric key.
    """

    def __init__(self, owner: str, name: str) -> None:
        self.owner = owner
        self.name = name
        #: Set by the owner when a (non-sanity) validation pass ended: every metric kind was logged once.
        self.validated = False
        self.seen = False
        self._last: torch.Tensor | None = None

    def read(self, trainer: Trainer) -> torch.Tensor | None:
        """The value if it was logged since the previous read; ``None`` if absent or not updated."""
        value = trainer.callback_metrics.get(self.name)
        if value is None:
            if self.validated:
                logged = ", ".join(sorted(trainer.callback_metrics)) or "nothing"
                raise KeyError(f"{self.owner}(monitor={self.name!r}): that metric was never logged (logged: {logged})")
            return None
        if value is self._last:
            return None
        self._last = value
        self.seen = True
        return value
