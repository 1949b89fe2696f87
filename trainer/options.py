"""Trainer options: checks with messages that name the option and what it accepts, and the defaults.

:func:`loop_options` turns ``Trainer(...)``'s loop arguments into their checked, resolved values
(Lightning's rule for ``max_epochs``, what ``fast_dev_run`` overrides); :func:`default_callbacks` adds
the progress bar, logger and checkpoint a run gets unless the user gave their own;
:func:`check_checkpoint_folders` refuses a checkpoint folder that cannot be written when ``fit`` starts.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.arguments import batch_limit, check_non_negative_int
from trainer.common.errors import MissingStepError, PossibleUserWarning, UserError

if TYPE_CHECKING:
    from callbacks.base import Callback
    from trainer.trainer import Trainer

log = logging.getLogger("trainer")

__all__ = [
    "LoopOptions",
    "check_checkpoint_folders",
    "check_module",
    "default_callbacks",
    "loop_options",
    "resolve_classes",
    "resolve_max_epochs",
]


@dataclass
class LoopOptions:
    """The resolved loop arguments of ``Trainer(...)`` (see its docstring for each)."""

    max_epochs: int | None
    max_steps: int
    min_epochs: int
    min_steps: int
    val_check_interval: int | float | None
    check_val_every_n_epoch: int | None
    limits: dict[str, int | float | None]
    num_sanity_val_steps: int
    log_every_n_steps: int
    fast_dev_run: int
    overfit_batches: int | float
    #: ``max_epochs`` was not given (nor ``max_steps``, ``max_time``): ``fit`` takes 1000 and says so.
    max_epochs_defaulted: bool = False


def loop_options(
    *,
    max_epochs: int | None,
    max_steps: int,
    min_epochs: int | None = None,
    min_steps: int | None = None,
    max_time: Any = None,
    overfit_batches: int | float = 0.0,
    val_check_interval: int | float | None,
    check_val_every_n_epoch: int | None,
    limit_train_batches: int | float | None,
    limit_val_batches: int | float | None,
    limit_test_batches: int | float | None,
    limit_predict_batches: int | float | None,
    num_sanity_val_steps: int,
    fast_dev_run: bool | int,
    log_every_n_steps: int,
) -> LoopOptions:
    """Check the loop arguments and resolve them (``max_epochs=None``, ``fast_dev_run``, ``overfit_batches``).

    ``check_val_every_n_epoch=None`` (Lightning's) needs an int ``val_check_interval``: validation
    then runs every that many training batches counted across epochs. ``overfit_batches`` sets the
    training and validation limits (see :func:`trainer.arguments.overfit_loader` for the order).
    """
    check_non_negative_int("log_every_n_steps", log_every_n_steps)  # 0: never, as Lightning
    if isinstance(val_check_interval, (str, dict, timedelta)):
        raise ValueError(
            f"val_check_interval={val_check_interval!r}: validating by wall-clock time is not supported (where it "
            "falls would differ between runs, processes and a resumed run); give an int (every that many training "
            "batches) or a float (that fraction of an epoch)"
        )
    if check_val_every_n_epoch is None:
        if not isinstance(val_check_interval, int) or isinstance(val_check_interval, bool):
            raise UserError(  # Lightning's words first; of its durations, geartrain refuses wall-clock time
                "`val_check_interval` should be an integer or a time-based duration (str 'DD:HH:MM:SS', "
                "datetime.timedelta, or dict kwargs for timedelta) when `check_val_every_n_epoch=None`. "
                "(check_val_every_n_epoch=None validates every val_check_interval training batches across epochs, "
                f"so val_check_interval must be an int; got {val_check_interval!r}; time-based durations are refused)"
            )
    else:
        check_positive_int("check_val_every_n_epoch", check_val_every_n_epoch)
    for name, value in (("min_epochs", min_epochs), ("min_steps", min_steps)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{name} must be an int >= 0 or None, got {value!r}")
    defaulted = max_epochs is None and max_steps == -1 and max_time is None
    for option, given in (
        ("limit_train_batches", limit_train_batches),
        ("limit_val_batches", limit_val_batches),
        ("limit_test_batches", limit_test_batches),
        ("limit_predict_batches", limit_predict_batches),
        ("val_check_interval", val_check_interval),
        ("overfit_batches", overfit_batches),
    ):
        _say_what_one_means(option, given)
    overfit_batches = batch_limit("overfit_batches", overfit_batches)
    if max_epochs is not None and max_epochs < -1:
        raise UserError(f"`max_epochs` must be a non-negative integer or -1. You passed in {max_epochs}.")
    if max_steps < -1:
        raise UserError(f"`max_steps` must be a non-negative integer or -1 (infinite steps), you passed in {max_steps}")
    if val_check_interval is not None:
        val_check_interval = batch_limit("val_check_interval", val_check_interval)
        if val_check_interval == 0.0 and isinstance(val_check_interval, float):
            raise ValueError(f"val_check_interval as a fraction must be in (0, 1], got {val_check_interval}")
        if isinstance(val_check_interval, int) and val_check_interval < 1:
            raise ValueError(f"val_check_interval as a batch count must be >= 1, got {val_check_interval}")
    limits = {
        "fit": limit_train_batches,
        "validate": limit_val_batches,
        "test": limit_test_batches,
        "predict": limit_predict_batches,
    }
    for stage, name in (("fit", "train"), ("validate", "val"), ("test", "test"), ("predict", "predict")):
        limits[stage] = batch_limit(f"limit_{name}_batches", limits[stage])
    if overfit_batches:
        limits["fit"] = limits["validate"] = overfit_batches
    n = int(fast_dev_run)
    if n < 0:
        raise UserError(
            f"fast_dev_run={fast_dev_run!r} is not a valid configuration. It should be >= 0 (a bool, or a number of "
            "batches per stage)."
        )
    if n:
        max_epochs, max_steps = 1, n
        limits = dict.fromkeys(limits, n)
        num_sanity_val_steps, val_check_interval, check_val_every_n_epoch = 0, None, 1
        log_every_n_steps = 1
    return LoopOptions(
        max_epochs=max_epochs,
        max_steps=max_steps,
        min_epochs=min_epochs or 0,
        min_steps=min_steps or 0,
        val_check_interval=val_check_interval,
        check_val_every_n_epoch=check_val_every_n_epoch,
        limits=limits,
        num_sanity_val_steps=num_sanity_val_steps,
        log_every_n_steps=log_every_n_steps,
        fast_dev_run=n,
        overfit_batches=overfit_batches,
        max_epochs_defaulted=defaulted and not n,
    )


def resolve_max_epochs(loop: LoopOptions) -> None:
    """At ``fit``, as Lightning: an unset ``max_epochs`` (``None`` until then) becomes 1000, warned, or -1."""
    if loop.max_epochs is None:  # -1 beside max_steps or max_time: that limit ends the run
        loop.max_epochs = 1000 if loop.max_epochs_defaulted else -1
        if loop.max_epochs_defaulted:
            warnings.warn(
                "`max_epochs` was not set. Setting it to 1000 epochs. To train without an epoch limit, set "
                "`max_epochs=-1`.",
                PossibleUserWarning,
                stacklevel=3,
            )


def check_step_options(
    accumulate_grad_batches: int,
    gradient_clip_val: float | None,
    gradient_clip_algorithm: str,
    on_nonfinite: str | None,
    max_nonfinite_in_a_row: int,
) -> None:
    """Check the arguments of the training step."""
    check_positive_int("accumulate_grad_batches", accumulate_grad_batches)
    if gradient_clip_algorithm not in ("norm", "value"):
        raise UserError(  # Lightning's words first
            f"`gradient_clip_algorithm` {gradient_clip_algorithm} is invalid. Allowed algorithms: ['value', 'norm'] "
            f"(gradient_clip_algorithm must be 'norm' or 'value', got {gradient_clip_algorithm!r})"
        )
    if isinstance(gradient_clip_val, bool) or not isinstance(gradient_clip_val, (int, float, type(None))):
        raise TypeError(f"`gradient_clip_val` should be an int or a float. Got {gradient_clip_val!r}.")
    if gradient_clip_val is not None and gradient_clip_val < 0:
        raise ValueError(f"gradient_clip_val must be >= 0 or None (0: no clipping, as None), got {gradient_clip_val}")
    if on_nonfinite not in (None, "raise", "skip", "warn"):
        raise ValueError(f"on_nonfinite must be 'raise', 'skip', 'warn' or None, got {on_nonfinite!r}")
    check_positive_int("max_nonfinite_in_a_row", max_nonfinite_in_a_row)


def default_callbacks(
    given: list[Callback],
    *,
    root: Path,
    progress_bar: bool,
    checkpointing: bool,
    logger: bool,
    fast_dev_run: int,
    model_summary: bool = False,
    loggers: Iterable[Callback] = (),
    max_time: Any = None,
) -> list[Callback]:
    """Prepend the default progress bar, model summary, logger and checkpoint unless given.

    ``loggers`` (``Trainer(logger=[...])``) join the callbacks after the defaults; ``max_time`` adds a
    :class:`~callbacks.Timer` (as Lightning does).

    Under ``fast_dev_run`` the loggers are left out, with a warning naming them, and a ``DummyLogger`` takes
    their place; checkpointing and early stopping stay and do nothing (as in Lightning).
    """
    import callbacks as cbs

    given = [*loggers, *given]
    cbs.Checkpoint.check_enabled(given, enabled=checkpointing)
    kinds = {type(cb) for cb in given}
    defaults: list[Callback] = []
    if (bar := cbs.ProgressBar.check_one(given, enabled=progress_bar)) is None and progress_bar:
        defaults.append(cbs.ProgressBar())
    if model_summary and not any(issubclass(k, cbs.ModelSummary) for k in kinds):  # RichProgressBar: the rich one
        rich = sys.modules.get("callbacks.rich_progress")  # not imported: no bar can be one (rich stays unloaded)
        rich_bar = rich is not None and isinstance(bar, rich.RichProgressBar)
        defaults.append(cbs.RichModelSummary() if rich_bar else cbs.ModelSummary())
    if logger and not any(getattr(k, "is_logger", False) for k in kinds):
        defaults.append(cbs.TensorBoardLogger(save_dir=root))
    if checkpointing and not any(issubclass(k, cbs.ModelCheckpoint) for k in kinds):
        # No dirpath: the logger's version folder, else <root>/checkpoints (Lightning's default), so two runs
        # in one root never share one last.ckpt.
        defaults.append(cbs.ModelCheckpoint(save_last=True))
    if max_time is not None:
        defaults.append(cbs.Timer(max_time, interval="step"))
    chosen = defaults + given
    # Checkpoint callbacks run last in every hook (Lightning's order), so a checkpoint written in a
    # hook holds the other callbacks' state after that hook (early stopping's count, a timer's).
    chosen = [cb for cb in chosen if not isinstance(cb, cbs.Checkpoint)] + [
        cb for cb in chosen if isinstance(cb, cbs.Checkpoint)
    ]
    if fast_dev_run:
        dropped = [cb for cb in chosen if not cb.runs_in_fast_dev_run]
        if dropped:
            names = ", ".join(type(cb).__name__ for cb in dropped)
            warnings.warn(f"fast_dev_run: leaving out {names}", stacklevel=3)
        kept = [cb for cb in chosen if cb.runs_in_fast_dev_run]
        if any(getattr(cb, "is_logger", False) for cb in dropped):
            # As Lightning: the loggers become one DummyLogger, so code using self.logger still runs.
            from callbacks._logger import DummyLogger

            kept.insert(0, DummyLogger())
        chosen = kept
    from callbacks._logger_calls import LoggerDriver
    from callbacks.base import Callback as Ours

    # A logger that is not a geartrain callback is driven through Lightning's logger API.
    drivers = [LoggerDriver(cb) for cb in chosen if getattr(cb, "is_logger", False) and not isinstance(cb, Ours)]
    return chosen + drivers


def resolve_classes(classes: Iterable[type[torch.nn.Module] | str]) -> tuple[type[torch.nn.Module], ...]:
    """Classes from classes or dotted paths (``"examples.gpt.Block"``, as Hydra configs give them)."""
    if isinstance(classes, str):
        classes = [classes]
    resolved = []
    for cls in classes:
        if isinstance(cls, str):
            from hydra.utils import get_class

            try:
                cls = get_class(cls)
            except Exception as err:
                raise ValueError(f"activation_checkpointing: cannot import class {cls!r}: {err}") from err
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            raise TypeError(f"activation_checkpointing takes nn.Module classes or their paths, got {cls!r}")
        resolved.append(cls)
    return tuple(resolved)


def check_positive_int(name: str, value: Any) -> None:
    """``value`` must be an int >= 1 (bools refused)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise UserError(f"`{name}` should be an integer. {name} must be a positive int, got {value!r}")
    if value < 1:
        raise UserError(f"{name} must be a positive int, got {value!r}")


def unwrap_compiled(module: Any) -> Any:
    """The module inside ``torch.compile(module)``, compiled in place with the same settings.

    Lightning trains ``trainer.fit(torch.compile(model))``; the wrapper is not a TrainModule and its
    ``state_dict`` keys carry an ``_orig_mod.`` prefix. So the user's module itself is trained, its
    ``__call__`` compiled by the wrapper's own compiler context (what ``nn.Module.compile`` does with
    the same ``torch.compile`` arguments); its checkpoints hold its plain keys. Anything else is
    returned as it is.
    """
    from torch._dynamo.eval_frame import OptimizedModule

    if not isinstance(module, OptimizedModule):
        return module
    inner = module._orig_mod
    if getattr(inner, "_compiled_call_impl", None) is None:
        inner._compiled_call_impl = module.dynamo_ctx(inner._call_impl)
    return inner


def check_is_module(module: Any, stage: str) -> None:
    """Every entry point needs a TrainModule (Lightning's TypeError and words first)."""
    from trainer.module import TrainModule

    if not isinstance(module, TrainModule):
        raise TypeError(
            f"`model` must be a `LightningModule` or `torch._dynamo.OptimizedModule`, got "
            f"`{type(module).__qualname__}`: Trainer.{stage} needs a TrainModule, got {type(module).__name__}"
        )


def check_module(module: Any) -> None:
    """``fit`` needs a TrainModule that defines ``training_step`` and ``configure_optimizers`` (Lightning's words)."""
    from trainer.hooks import is_overridden
    from trainer.module import TrainModule

    check_is_module(module, "fit")
    name = type(module).__name__
    for hook, ours in (
        ("training_step", "training_step(self, batch, batch_idx); the trainer has nothing to train"),
        ("configure_optimizers", "configure_optimizers(); return None from it to train without an optimizer"),
    ):
        if not is_overridden(hook, module, TrainModule):
            raise MissingStepError(
                f"No `{hook}()` method defined. Lightning `Trainer` expects as minimum a `training_step()`, "
                f"`train_dataloader()` and `configure_optimizers()` to be defined. ({name} does not define {ours})"
            )


_ONE_MEANS = {
    "limit_train_batches": ("1 batch per epoch will be used.", "100% of the batches per epoch will be used."),
    "val_check_interval": (
        "validation will run after every batch.",
        "validation will run at the end of the training epoch.",
    ),
}


def _say_what_one_means(name: str, value: Any) -> None:
    """Lightning's info line for a ``1`` (a batch count) or ``1.0`` (a fraction) passed explicitly."""
    if value is None or isinstance(value, bool) or value != 1:
        return
    as_int, as_float = _ONE_MEANS.get(name, ("1 batch will be used.", "100% of the batches will be used."))
    if isinstance(value, int):
        log.info(f"`Trainer({name}=1)` was configured so {as_int}")
    else:
        log.info(f"`Trainer({name}=1.0)` was configured so {as_float}")


def check_checkpoint_folders(trainer: Trainer) -> None:
    """Refuse, before training, a checkpoint folder that cannot be written: one line naming it.

    Found only at the first save, it ended a run after its first epoch with a long traceback. Rank 0
    (the one that writes) tries to create a file where the folder is or would be made; every rank
    gets its answer, so all of them stop together.
    """
    problem = None
    if trainer.is_global_zero:
        for callback in trainer.checkpoint_callbacks:
            dirpath = getattr(callback, "dirpath", None)
            saves = getattr(callback, "save_top_k", 1) != 0 or getattr(callback, "save_last", False)
            why = _unwritable(os.fspath(dirpath)) if dirpath is not None and saves else None
            if why is not None:
                key = getattr(callback, "config_key", None)
                option = f"{key}.dirpath" if key else "dirpath"
                problem = f"{type(callback).__name__} cannot write checkpoints to {dirpath}: {why}; give {option}= a folder you can write"
                break
    if trainer.strategy.world_size > 1:
        problem = trainer.strategy.broadcast(problem)
    if problem is not None:
        raise UserError(problem)


def _unwritable(folder: str) -> str | None:
    """Why no file can be written in ``folder`` (made when missing), or None when one can; URLs are not checked."""
    if "://" in folder:
        return None
    existing = Path(os.path.abspath(folder))
    while not existing.exists():  # the nearest folder that exists: the missing ones would be made in it
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        return f"{os.strerror(err.errno) if err.errno else err} ({existing})"
    return None
