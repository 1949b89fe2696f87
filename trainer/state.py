"""Lightning's ``TrainerState``: which entry point runs, which loop, and whether it ended well.

The enums are ``str`` enums with Lightning's names and values, so ``trainer.state.fn == "fit"`` and
``trainer.state.fn == TrainerFn.FITTING`` both hold during ``fit``. As Lightning's (``lightning_utilities``'
``StrEnum``) they compare to strings case-insensitively and hash as their lower-cased value, so a dict
keyed by ``"fit"`` finds ``TrainerFn.FITTING`` (the ``stage`` the ``setup``/``teardown`` hooks receive).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["RunningStage", "TrainerFn", "TrainerState", "TrainerStatus"]


class _StrEnum(str, Enum):
    """Lightning's ``StrEnum``: equal to its value (or another enum's) in any case, hashed as its lower-cased value."""

    def __eq__(self, other: object) -> bool:
        text = other.value if isinstance(other, Enum) else str(other)
        return bool(self.value.lower() == str(text).lower())

    def __hash__(self) -> int:
        return hash(self.value.lower())


class TrainerFn(_StrEnum):
    """The entry point running (or last run): ``trainer.state.fn``; the ``stage`` of ``setup``/``teardown``.

    >>> TrainerFn("fit") == "fit", {"fit": 1}[TrainerFn.FITTING]
    (True, 1)
    """

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class RunningStage(_StrEnum):
    """The loop running now: ``trainer.state.stage`` (None between runs)."""

    TRAINING = "train"
    SANITY_CHECKING = "sanity_check"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"

    @property
    def evaluating(self) -> bool:
        """Validation, test or the sanity check."""
        return self in (RunningStage.VALIDATING, RunningStage.TESTING, RunningStage.SANITY_CHECKING)

    @property
    def dataloader_prefix(self) -> str:
        """The prefix of the stage's dataloader hook and argument names (``val`` for validation and the sanity check)."""
        return "val" if self in (RunningStage.VALIDATING, RunningStage.SANITY_CHECKING) else self.value


class TrainerStatus(_StrEnum):
    """Whether a run has started, is running, ended or was interrupted: ``trainer.state.status``."""

    INITIALIZING = "initializing"
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"


@dataclass
class TrainerState:
    """Lightning's ``TrainerState``: ``fn`` (entry point), ``stage`` (loop) and ``status``.

    >>> TrainerState().status == "initializing"
    True
    """

    status: TrainerStatus = TrainerStatus.INITIALIZING
    fn: TrainerFn | None = None
    stage: RunningStage | None = None

    @property
    def finished(self) -> bool:
        """The last run ended normally."""
        return self.status == TrainerStatus.FINISHED

    @property
    def stopped(self) -> bool:
        """The last run ended, normally or not."""
        return self.status in (TrainerStatus.FINISHED, TrainerStatus.INTERRUPTED)
