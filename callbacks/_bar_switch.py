"""What Lightning's two progress bars share: a refresh rate, and a switch that turns them off and on."""

from __future__ import annotations

__all__ = ["BarSwitch"]


class BarSwitch:
    """``refresh_rate``, ``is_enabled``/``is_disabled``, ``enable()``/``disable()`` of ``TQDMProgressBar`` and
    ``RichProgressBar`` (Lightning's names): a bar draws while enabled and its rate is above 0."""

    _refresh_rate: int
    _enabled: bool

    @property
    def refresh_rate(self) -> int:
        """How often the bar redraws (0: never)."""
        return self._refresh_rate

    @refresh_rate.setter
    def refresh_rate(self, value: int) -> None:
        self._refresh_rate = value

    @property
    def is_enabled(self) -> bool:
        """Whether the bars draw: enabled and ``refresh_rate > 0``."""
        return self._enabled and self.refresh_rate > 0

    @property
    def is_disabled(self) -> bool:
        """The opposite of :attr:`is_enabled`."""
        return not self.is_enabled

    def disable(self) -> None:
        """Stop drawing (the trainer's other ranks, a run that asked for no bar)."""
        self._enabled = False

    def enable(self) -> None:
        """Draw again."""
        self._enabled = True
