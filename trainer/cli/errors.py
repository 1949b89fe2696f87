"""How the ``geartrain`` command reports a user's mistake: a short message, exit code 1, nothing left behind.

Mistakes are config keys and values (Hydra's composition errors, a value a schema or a constructor
refuses), missing options, paths, checkpoints and metric names. :func:`describe` turns each into a
few lines that name the key or file and the fix; anything else is a bug and keeps its traceback, as
every error does under ``HYDRA_FULL_ERROR=1``. A run that failed before it wrote anything of its own
leaves no run directory behind (:mod:`trainer.cli.run_dir_guard` removes what it recorded creating).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer.common.errors import CheckpointError, UserError, closest

__all__ = ["describe", "remove_empty", "report", "reported"]

FULL_ERROR = "HYDRA_FULL_ERROR"
#: Lines of a message at most; the rest is what a traceback is for.
MAX_LINES = 8


def describe(err: BaseException) -> str | None:
    """The user's mistake in ``err`` as a short message, or ``None`` when ``err`` is not one."""
    from hydra.errors import (
        ConfigCompositionException,
        InstantiationException,
        MissingConfigException,
        OverrideParseException,
    )
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(err, MissingConfigException):
        return _missing_option(err)
    if isinstance(err, ConfigCompositionException):
        return _composition(err)
    if isinstance(err, OverrideParseException):
        return f"{err.override}: {str(err).splitlines()[0]}" if err.override else str(err)
    if isinstance(err, InstantiationException):
        return _instantiation(err)
    if isinstance(err, (UserError, CheckpointError, OmegaConfBaseException)):
        return str(err)
    # A closed pipe (``geartrain --cfg job | head``) is no folder mistake: the command ends quietly on it.
    if isinstance(err, OSError) and not isinstance(err, BrokenPipeError) and _raised_by_hydra(err):
        return _output_folder(err)
    return _from_a_worker(err)


def _raised_by_hydra(err: OSError) -> bool:
    """Whether Hydra's own code met ``err`` (making the job's folder, writing ``.hydra/``, opening its log).

    That is, the last frame outside Python's standard library is one of Hydra's: an error of a file
    the job itself opens (the user's data, our checkpoints) has the job's frame last.
    """
    import sysconfig

    import hydra

    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    caller = None
    tb = err.__traceback__
    while tb is not None:
        path = Path(tb.tb_frame.f_code.co_filename).resolve()
        if stdlib not in path.parents:
            caller = path
        tb = tb.tb_next
    return caller is not None and Path(hydra.__file__).resolve().parent in caller.parents


def _output_folder(err: OSError) -> str:
    """The run directory Hydra could not write (an interpolated ``hydra.run.dir``, made by Hydra alone)."""
    from trainer.cli.run_dirs import unwritable

    folder = Path(str(err.filename)) if err.filename else Path.cwd()
    return str(unwritable(folder, err))


def _from_a_worker(err: BaseException) -> str | None:
    """A user's mistake raised in a worker process (DDP, FSDP), which reaches here as its type's name."""
    from strategies.launch import WorkerFailedError

    if not isinstance(err, WorkerFailedError):
        return None
    kind, _, message = err.cause.partition(": ")
    mistakes = {CheckpointError.__name__, UserError.__name__, *(c.__name__ for c in _subclasses(UserError))}
    return f"(rank {err.rank}) {message}" if kind in mistakes and message else None


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    direct: list[type] = cls.__subclasses__()
    for sub in direct:
        found += [sub, *_subclasses(sub)]
    return found


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """Run the Hydra app inside: a user's mistake is printed short and ends the process with code 1.

    Hydra prints errors itself unless ``HYDRA_FULL_ERROR=1``, in which case it raises them; it is set
    here so that the exception reaches :func:`describe`. A user who set it gets the traceback. It is
    set before any thread starts and left set: changing the environment while torch's threads may
    read it is not safe, and the process ends with the command.
    """
    wanted_traceback = os.environ.get(FULL_ERROR) == "1"
    os.environ[FULL_ERROR] = "1"
    from trainer.cli.trace import ReportedMistake, user_traceback

    try:
        yield
    except (Exception, ReportedMistake) as caught:
        err = caught.error if isinstance(caught, ReportedMistake) else caught
        message = None if wanted_traceback else describe(err)
        if message is None:
            shown = None if wanted_traceback else user_traceback(err, FULL_ERROR)
            if shown is None:
                if isinstance(caught, ReportedMistake):
                    raise err from err.__cause__
                raise
            print(shown, file=sys.stderr)
            sys.exit(1)
        from strategies.rank_process import hand_over

        if hand_over(err):  # a rank that rank 0 started: rank 0 says it, once
            sys.exit(1)
        report(_rank_prefix() + message)
        sys.exit(1)


def report(message: str) -> None:
    """Print a user's mistake as the command does: at most :data:`MAX_LINES` lines, then where the traceback is."""
    lines = message.strip().splitlines()
    if len(lines) > MAX_LINES:
        lines = [*lines[: MAX_LINES - 1], "..."]
    print("geartrain: error: " + "\n  ".join(lines), file=sys.stderr)
    print(f"(the traceback: run again with {FULL_ERROR}=1)", file=sys.stderr)


def _rank_prefix() -> str:
    """``"(rank R) "`` under several processes (which rank met the mistake), else ``""``."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return ""
    return f"(rank {dist.get_rank()}) "


def remove_empty(folder: Path, stop_at: Path) -> None:
    """Remove ``folder`` and then its parents up to ``stop_at`` (not included), each only while it is empty."""
    stop = stop_at.resolve()
    while folder.resolve() != stop and stop in folder.resolve().parents:
        try:
            folder.rmdir()  # only when empty
        except FileNotFoundError:
            pass  # removed already (the run's own clean-up): go on with its parents
        except OSError:
            return
        folder = folder.parent


# ----------------------------------------------------------------- messages
def _missing_option(err: Any) -> str:
    missing = str(getattr(err, "missing_cfg_file", "") or "")
    options = getattr(err, "options", None)
    if "/" not in missing or not options:
        return str(err).splitlines()[0]
    group, name = missing.rsplit("/", 1)
    guess = closest(name, options)
    lines = [f"{group}={name}: there is no such {group}" + (f"; did you mean {group}={guess}?" if guess else ".")]
    lines.append(f"{group} options: {', '.join(options)}")
    lines.append(f"(your own: a file {group}/{name}.yaml in a folder given with --config-dir)")
    return "\n".join(lines)


def _composition(err: Exception) -> str:
    from omegaconf import DictConfig
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    cause = err.__cause__
    first = str(err).splitlines()[0]
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.full_key:
        full_key = str(cause.full_key)
        prefix, _, key = full_key.rpartition(".")
        parent = cause.parent_node
        keys = [str(k) for k in parent] if isinstance(parent, DictConfig) else []
        guess = closest(key, keys)
        where = prefix or "the config"
        if guess is not None:
            return f"{full_key}: no such key in {where}; did you mean {prefix + '.' if prefix else ''}{guess}?"
        typed = cause.object_type is not None and dataclasses.is_dataclass(cause.object_type)
        if typed or not keys:
            return f"{full_key}: no such key in {where}. Its keys: {', '.join(keys) or 'none'}"
        return f"{full_key}: no such key in {where}. To add a new key, write +{full_key}=..."
    if isinstance(cause, ValidationError) and cause.full_key:
        return f"{cause.full_key}: {str(cause.msg).splitlines()[0]}"
    if cause is not None:
        return f"{first}\n{str(cause).splitlines()[0]}"
    return str(err)


def _instantiation(err: Exception) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    full_key = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("full_key:")), "")
    body = [line.replace(f", set env var {FULL_ERROR}=1 to see chained exception.", "") for line in lines]
    body = [line for line in body if not line.startswith("full_key:")]
    cause = err.__cause__
    if cause is not None and body and body[0].startswith("Error locating target"):
        body.append(f"{type(cause).__name__}: {cause}")
        body.append("(your own classes are imported from the folder geartrain runs in)")
    head = f"could not build {full_key}" if full_key else "could not build an object of the config"
    return f"{head}: " + "\n".join(body)


def warn_no_last_checkpoint(err: Exception, rank_zero: bool) -> None:
    """``ckpt_path=last`` with nothing to resume yet, when training: said (rank 0), and training starts afresh.

    As Lightning's ``fit(ckpt_path="last")``: a preemptible job's script may pass it from its first start.
    """
    if rank_zero:
        reason = str(err).removeprefix("ckpt_path=last: ")
        warnings.warn(
            f"ckpt_path=last is set, but there is no last checkpoint available: training starts from scratch ({reason})",
            stacklevel=3,
        )


def checkpoints_in_run_dir(callbacks: list[Any], run_dir: Path) -> None:
    """The command's checkpoints live in ``<run dir>/checkpoints``, whatever the logger's folder (``dirpath: null``)."""
    for cb in callbacks:
        if getattr(cb, "dirpath", "") is None and hasattr(cb, "CHECKPOINT_NAME_LAST"):
            cb.dirpath = str(run_dir / "checkpoints")
