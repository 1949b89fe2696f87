"""Sharded checkpoints on ``torch.distributed.checkpoint`` (DCP): every rank writes its own shards.

A sharded checkpoint is a directory named like the file it replaces (``last.ckpt/``,
``epoch=3-step=120.ckpt/``)::

    .metadata, __0_0.distcp, ...   DCP's files: the model under ``state_dict.<name>``, optimizer i
                                   under ``optimizers.<i>.state.<name>.<key>`` (keyed by parameter name)
    trainer.pt                     everything else a checkpoint holds (progress, every rank's RNG,
                                   sampler, callbacks, hyperparameters, schedulers), written by
                                   rank 0, read with ``torch.load(weights_only=True)``

No rank gathers the full model or optimizer: each saves what it holds (``full_state_dict=False``),
and DCP writes a replicated tensor once. Loading reshards: the target is whatever layout the loading
module has now (FSDP2 shards over M ranks, tensor-parallel DTensors, plain tensors on one device),
and DCP reads into it the slices it needs, so N ranks' checkpoint resumes on M ranks or one device.

A directory appears complete or not at all: it is written into a temporary sibling, then renamed
into place (the previous one is moved aside to ``.<name>.old`` first and removed last; the reader,
``trainer.checkpoint.reader.complete_path``, finds it if a kill came between the two renames).

Loading is as safe as for a file: what DCP would unpickle freely is read by
:mod:`strategies.sharded_safety` instead.

How a strategy opts in: set ``state_dict_type = "sharded"`` (the base :class:`~strategies.Strategy`'s
``save_sharded``/``load_sharded`` call the functions here with the user's module, which works for any
module whose parameters are plain tensors or DTensors: FSDP2, tensor parallel, both). This module
imports torch and the leaf only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from strategies.sharded_safety import (
    TRAINER_STATE,
    checkpoint_error,
    dcp_failures,
    read_sharded_metadata,
    safe_planner,
    safe_reader,
)
from trainer.common.errors import CheckpointError
from trainer.common.fs_safety import PARTIAL, check_replaceable, fsync_dir, remove_checkpoint, swap_in

__all__ = [
    "TRAINER_STATE",
    "PendingSave",
    "checkpoint_error",
    "load_sharded",
    "read_sharded_metadata",
    "safe_planner",
    "safe_reader",
    "save_sharded",
    "sharded_model_state",
    "sharded_optimizer_state",
]

#: The keys of a checkpoint dict whose tensors DCP writes; the rest goes into :data:`TRAINER_STATE`.
#: Optimizer states are ``optimizer_states`` in a checkpoint dict and ``optimizers`` among DCP's tensors.
_SHARDED_KEYS = ("state_dict", "optimizer_states", "optimizers")


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=False, **kwargs)


def sharded_model_state(module: nn.Module) -> dict[str, Any]:
    """``module``'s state dict as this rank holds it (DTensor shards where sharded); gathers nothing."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state: dict[str, Any] = get_model_state_dict(module, options=_options())
    return state


def sharded_optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state as this rank holds it, keyed by parameter name; ``{}`` before its first step.

    An optimizer that has not stepped is saved empty rather than through torch's initialising
    zero-learning-rate step, which would give it state (Adam's ``step``) the uninterrupted run lacks.
    """
    if not optimizer.state:
        return {}
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state: dict[str, Any] = get_optimizer_state_dict(module, optimizer, options=_options())
    return state


# ------------------------------------------------------------------------------------------ save
class PendingSave:
    """A sharded save in flight (``async_save``); :meth:`wait` blocks until it is in place."""

    def __init__(self, future: Future[Any] | None, finish: Callable[[], None] | None) -> None:
        self._future = future
        self._finish = finish
        self._done = threading.Event()
        self._error: BaseException | None = None
        if future is None:
            self._complete()
        else:
            future.add_done_callback(lambda _: self._complete())

    def _complete(self) -> None:
        try:
            if self._future is not None:
                self._future.result()
            if self._finish is not None:
                self._finish()
        except BaseException as err:
            self._error = err
        finally:
            self._done.set()

    @property
    def pending(self) -> bool:
        """True while the write or its renames are still running."""
        return not self._done.is_set()

    def wait(self) -> None:
        """Block until the directory is in place; re-raise the error of a failed write."""
        self._done.wait()
        if self._error is not None:
            err, self._error = self._error, None
            raise CheckpointError(f"Could not write the sharded checkpoint: {err}") from err


_ASYNC_GROUP: dict[int, Any] = {}


def _async_group() -> Any:
    """A gloo group of its own for background saves, so they never interleave with training's collectives.

    Made once per default process group (a collective: every rank reaches its first async save together).
    """
    world = id(dist.group.WORLD)
    if world not in _ASYNC_GROUP:
        _ASYNC_GROUP.clear()  # groups of a destroyed default group are unusable
        _ASYNC_GROUP[world] = dist.new_group(backend="gloo")
    return _ASYNC_GROUP[world]


def save_sharded(
    path: str | os.PathLike[str],
    state: Mapping[str, Any],
    *,
    async_: bool = False,
    also_at: Iterable[str | os.PathLike[str]] = (),
    replaces: Iterable[str | os.PathLike[str]] = (),
) -> PendingSave:
    """Write checkpoint ``state`` as a sharded directory at ``path``; a collective of every rank.

    ``state["state_dict"]`` and ``state["optimizer_states"]`` (this rank's shards, see
    :func:`sharded_model_state`) go through ``dcp.save``; the rest of ``state`` becomes
    :data:`TRAINER_STATE`, written by rank 0. The directory is written into ``.<name>.partial``
    and renamed into place once complete; then copies are placed at ``also_at`` (hard links) and
    the directories ``replaces`` names are removed, in that order, so a failure loses nothing.

    With ``async_``, tensors are staged to CPU memory now and written by DCP in the background
    (``torch.distributed.checkpoint.async_save``); the returned :class:`PendingSave` finishes
    the renames when the write completes.
    """
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    extra = [Path(p) for p in also_at]
    for target in (path, *extra):  # every rank refuses alike, before any of them writes or waits
        check_replaceable(target)
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    tmp = path.parent / f".{path.name}{PARTIAL}"
    if rank0:
        shutil.rmtree(tmp, ignore_errors=True)  # a save killed earlier
        rest = {k: v for k, v in state.items() if k not in _SHARDED_KEYS}
        try:
            tmp.mkdir(parents=True)
            _write_file(tmp / TRAINER_STATE, rest)
        except (OSError, RuntimeError) as err:  # torch reports a refused write as a RuntimeError
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(
                f"Could not write the sharded checkpoint {path}: writing {tmp / TRAINER_STATE} failed: "
                f"{_write_reason(err)}"
            ) from err
    _barrier()
    tensors = {"state_dict": dict(state.get("state_dict", {}))}
    optimizers = state.get("optimizer_states", state.get("optimizers", []))
    tensors["optimizers"] = {str(i): opt for i, opt in enumerate(optimizers) if opt}
    writer = dcp.FileSystemWriter(tmp, sync_files=True)
    old = [Path(p) for p in replaces]

    def finish() -> None:
        if rank0:
            _place(tmp, path, extra, old)

    if not async_:
        try:
            with _one_process_quietly():
                dcp.save(tensors, storage_writer=writer)
        except dcp_failures() as err:
            if rank0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise checkpoint_error(err, f"Could not write the sharded checkpoint {path}") from err
        finish()
        return PendingSave(None, None)
    group = _async_group() if dist.is_initialized() else None
    with _one_process_quietly():
        future = dcp.async_save(tensors, storage_writer=writer, process_group=group)
    return PendingSave(future, finish)  # type: ignore[arg-type]


@contextlib.contextmanager
def _one_process_quietly() -> Any:
    """Without a process group DCP warns that it assumes one process; that is what is meant here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _write_reason(err: BaseException) -> str:
    """What stopped a write: the operating system's reason where the chain of errors holds one."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            return os.strerror(seen.errno) + (" (the disk is full)" if seen.errno == errno.ENOSPC else "")
        seen = seen.__cause__ or seen.__context__
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def _write_file(path: Path, obj: Any) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _place(tmp: Path, path: Path, also_at: Sequence[Path], replaces: Sequence[Path]) -> None:
    fsync_dir(tmp)
    for other in also_at:
        if other.resolve() == path.resolve():
            continue
        copy = other.parent / f".{other.name}{PARTIAL}"
        shutil.rmtree(copy, ignore_errors=True)  # our own name: a copy a killed save left
        shutil.copytree(tmp, copy, copy_function=_link_or_copy)
        swap_in(copy, other)
    swap_in(tmp, path)
    keep = {path.resolve(), *(p.resolve() for p in also_at)}
    for gone in replaces:
        if gone.resolve() not in keep:
            remove_checkpoint(gone)


def _link_or_copy(source: str, dest: str) -> None:
    """A hard link (no second write; DCP never writes into an existing file), else a copy."""
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


# ------------------------------------------------------------------------------------------ load
def load_sharded(
    path: str | os.PathLike[str],
    module: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer] = (),
    strict: bool = True,
) -> None:
    """Load a sharded checkpoint's model (and ``optimizers``) into ``module``'s current layout; a collective.

    ``module`` may be plain, FSDP2-sharded or tensor-parallel over any number of ranks: the
    directory is resharded into what each rank holds now. Optimizer state is matched by parameter
    name; an optimizer saved before its first step stays as it is.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    path = Path(path)
    metadata = read_sharded_metadata(path)
    saved = set(getattr(metadata, "state_dict_metadata", {}))
    model = sharded_model_state(module)
    if strict:
        missing = [k for k in model if f"state_dict.{k}" not in saved]
        if missing:
            raise CheckpointError(
                f"Cannot load the weights in {path}: the checkpoint lacks {missing[:5]} "
                f"({len(missing)} missing). Pass strict=False to load what matches."
            )
        # As a file's load_state_dict(strict=True): weights the module has no place for are refused too.
        unexpected = [k[len("state_dict.") :] for k in saved if k.startswith("state_dict.")]
        unexpected = sorted(k for k in unexpected if k not in model)
        if unexpected:
            raise CheckpointError(
                f"Cannot load the weights in {path}: the checkpoint holds {unexpected[:5]} "
                f"({len(unexpected)} unexpected), which the module lacks (a checkpoint of another, bigger "
                "model?). Pass strict=False to load what matches."
            )
    else:
        model = {k: v for k, v in model.items() if f"state_dict.{k}" in saved}
    target: dict[str, Any] = {"state_dict": model}
    wanted: dict[str, tuple[torch.optim.Optimizer, dict[str, Any]]] = {}
    for i, opt in enumerate(optimizers):
        if any(key.startswith(f"optimizers.{i}.") for key in saved):
            from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

            template: dict[str, Any] = get_optimizer_state_dict(module, opt, options=_options())
            wanted[str(i)] = (opt, template)
    if wanted:
        target["optimizers"] = {key: saved_like for key, (_, saved_like) in wanted.items()}
    try:
        with _one_process_quietly():
            dcp.load(target, storage_reader=safe_reader(path), planner=safe_planner())
    except dcp_failures() as err:
        raise checkpoint_error(err, f"Cannot load the sharded checkpoint {path}") from err
    set_model_state_dict(module, target["state_dict"], options=_options(strict=strict))
    for key, (opt, _) in wanted.items():
        set_optimizer_state_dict(module, opt, target["optimizers"][key], options=_options())
