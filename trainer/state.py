"""Lightning's ``TrainerState``: which entry point runs, which loop, and whether it ended well.

The enums are ``str`` enums with Lightning's names and values, so ``trainer.state.fn == "fit"`` and
``trainer.state.fn == TrainerFn.FITTING`` both hold during ``fit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["RunningStage", "TrainerFn", "TrainerState", "TrainerStatus"]


class TrainerFn(str, Enum):
    """The entry point running (or last run): ``trainer.state.fn``."""

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class RunningStage(str, Enum):
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


class TrainerStatus(str, Enum):
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
