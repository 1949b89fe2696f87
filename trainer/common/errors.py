"""Exceptions raised by one room of geartrain and caught by another, or by the user.

They live in the leaf so that the code raising them (a strategy's launcher, a state-dict loader, a
callback) does not have to import the trainer that catches them. :class:`UserError` and its
subclasses are the user's mistakes, which the ``geartrain`` command prints without a traceback;
users import them from ``trainer.errors``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from trainer.common.lightning_shared import lightning_class

__all__ = [
    "CheckpointError",
    "CheckpointNotFoundError",
    "ClosureNotRunError",
    "ConfigError",
    "Interrupted",
    "InvalidDataloaderError",
    "LightningDeprecationWarning",
    "LogRefusedError",
    "MetricNotLoggedError",
    "MisconfigurationException",
    "MissingLossError",
    "MissingStepError",
    "PossibleUserWarning",
    "Preempted",
    "StepOutputError",
    "TunerExit",
    "UserError",
    "closest",
    "disable_possible_user_warnings",
    "refuse_url",
]


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, read, or applied; the message says which file and why."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """Nothing is at a checkpoint's path: a ``FileNotFoundError``, as Lightning raises for a missing ``ckpt_path``.

    Its message starts ``Checkpoint file not found:`` as Lightning's does, so code written for
    Lightning that catches or matches it keeps working.
    """


class Preempted(Exception):
    """Raised inside the loop after a preemption checkpoint was saved; ``trainer/run.py`` catches it."""


class TunerExit(Exception):
    """A finder hosted by the ``Tuner`` ends the entry point it ran in (Lightning's ``_TunerExitException``).

    ``trainer/run.py`` catches it: the stage ends as finished, without ``on_exception`` hooks.
    """


class Interrupted(RuntimeError):
    """A signal stopped the processes a strategy started before they saved a checkpoint.

    ``signal`` is the signal's number; the ``geartrain`` command exits with ``128 + signal``, as a
    shell reports a process a signal ended. The trainer adds the newest checkpoint that exists.
    """

    def __init__(self, message: str, signal: int) -> None:
        super().__init__(message)
        self.signal = int(signal)


class MisconfigurationException(Exception):
    """Lightning's name for a setting the trainer cannot run with; every :class:`UserError` is one.

    So Lightning code catching ``MisconfigurationException`` catches geartrain's refusals, and code
    raising it (Lightning users do, in their own checks) raises what Lightning's does.
    """


class UserError(MisconfigurationException, ValueError):
    """A mistake in what the user asked for; the message names it and the fix."""


class InvalidDataloaderError(UserError, TypeError):
    """No dataloader, or one that cannot be iterated, where a stage needs one.

    A ``TypeError`` as Lightning's; a :class:`UserError` (so a ``ValueError``) as geartrain's was.
    """


class ConfigError(UserError):
    """A config value or key that cannot work; the message names its key (``optim.lr``)."""


class MissingStepError(MisconfigurationException, NotImplementedError):
    """The module lacks a step or hook an entry point needs (``training_step``, ``validation_step``, ...).

    Lightning's type, and a ``NotImplementedError`` as it was before it had its own.
    """


class MetricNotLoggedError(UserError, KeyError):
    """A callback or scheduler monitors a metric that was never logged (a typo, or another module's name).

    Also a ``KeyError``, the type this error had before it had its own.
    """

    def __str__(self) -> str:
        # KeyError's str() quotes its argument, as it expects a key; this one carries a sentence.
        return str(self.args[0]) if self.args else ""


class StepOutputError(MisconfigurationException, TypeError):
    """``training_step`` returned something the automatic optimisation cannot take a loss from.

    Lightning's type; a ``TypeError`` as it was before it had its own.
    """


class MissingLossError(MisconfigurationException, KeyError):
    """``training_step`` returned a dict without a ``"loss"`` under automatic optimisation.

    Lightning's type; a ``KeyError`` as it was before it had its own.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ClosureNotRunError(MisconfigurationException, RuntimeError):
    """An overridden ``optimizer_step`` never ran the closure (forward and backward) it was given.

    Lightning's type; a ``RuntimeError`` as it was before it had its own.
    """


class LogRefusedError(MisconfigurationException, RuntimeError):
    """``self.log`` was called where Lightning refuses it (``setup``, the batch-transfer hooks, predict, ...).

    Lightning's type; a ``RuntimeError`` as it was before it had its own.
    """


class PossibleUserWarning(UserWarning):
    """A warning about something that may be a mistake, or may be meant (Lightning's name)."""


class LightningDeprecationWarning(DeprecationWarning):
    """A Lightning name or behaviour that is going away (Lightning's name)."""


# One class with lightning_fabric's (which lightning.pytorch re-exports) when fabric is imported first;
# when it is imported later, fabric's module gets these (trainer/common/lightning_shared.py).
PossibleUserWarning = lightning_class(PossibleUserWarning)  # type: ignore[misc]
LightningDeprecationWarning = lightning_class(LightningDeprecationWarning)  # type: ignore[misc]


def disable_possible_user_warnings(module: str = "") -> None:
    """Silence :class:`PossibleUserWarning` (of ``module`` only, when given), as Lightning's function does."""
    import warnings

    warnings.filterwarnings("ignore", category=PossibleUserWarning, module=module)


def refuse_url(path: object, what: str) -> None:
    """Refuse a URL (``s3://...``, ``memory://...``) where geartrain writes or reads local files.

    Lightning hands such paths to fsspec; geartrain's files are local, and a URL given to ``os.path``
    would silently become a local folder named ``s3:``.

    Raises:
        UserError: naming the argument, the URL and what to use instead.

    Example:
        >>> refuse_url("/tmp/runs", "dirpath")
        >>> refuse_url("s3://bucket/runs", "dirpath")
        Traceback (most recent call last):
        ...
        trainer.common.errors.UserError: dirpath='s3://bucket/runs' is a URL: geartrain writes local files only. Mount the store as a folder (s3fs, gcsfuse) or write locally and copy the files.
    """
    text = str(path)
    scheme, sep, _ = text.partition("://")
    if sep and scheme.isidentifier() and scheme != "file":
        raise UserError(
            f"{what}={text!r} is a URL: geartrain writes local files only. Mount the store as a folder "
            "(s3fs, gcsfuse) or write locally and copy the files."
        )


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
