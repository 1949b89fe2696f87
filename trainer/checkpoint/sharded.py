"""Sharded checkpoints on ``torch.distributed.checkpoint`` (DCP): every rank writes and reads its own shards.

A sharded checkpoint is a directory named like the file it replaces (``last.ckpt/``,
``epoch=3-step=120.ckpt/``)::

    .metadata, __0_0.distcp, ...   DCP's files: the model under ``state_dict.<name>``, optimizer i
                                   under ``optimizers.<i>.state.<name>.<key>`` (keyed by parameter name)
    trainer.pt                     everything else a checkpoint holds (progress, every rank's RNG,
                                   sampler, callbacks, hyperparameters, schedulers), written by
                                   rank 0, read with ``torch.load(weights_only=True)``

No rank gathers the full model or optimizer: each saves what it holds (the strategy's
``sharded_model_state_dict``), and DCP writes a replicated tensor once. Loading reshards: DCP reads
into whatever layout the loading module has now (FSDP2 shards over M ranks, tensor-parallel
DTensors, plain tensors on one device) the slices it needs, so N ranks' checkpoint resumes on M
ranks or one device. A directory appears complete or not at all: it is written as ``.<name>.partial``
and renamed into place by the writer's :func:`~trainer.checkpoint.files.swap_in`. What DCP would
unpickle freely is read by :mod:`trainer.checkpoint.sharded_safety` instead.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.checkpoint.files import check_replaceable, finish_save, fsync_dir, swap_in, write_checkpoint, write_failure
from trainer.checkpoint.format import PARTIAL, TRAINER_STATE
from trainer.checkpoint.sharded_safety import (
    checkpoint_error,
    dcp_failures,
    read_sharded_metadata,
    safe_planner,
    safe_reader,
)
from trainer.common.errors import CheckpointError

__all__ = ["TRAINER_STATE", "load_sharded", "save_sharded"]

#: The keys of a checkpoint dict whose tensors DCP writes; the rest goes into :data:`TRAINER_STATE`.
#: Optimizer states are ``optimizer_states`` in a checkpoint dict and ``optimizers`` among DCP's tensors.
_SHARDED_KEYS = ("state_dict", "optimizer_states", "optimizers")


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=False, **kwargs)


@functools.lru_cache(maxsize=1)  # the group of the current default group only: a destroyed one's are unusable
def _async_group(world: int) -> Any:
    """A gloo group of its own for background saves, so they never interleave with training's collectives.

    Made once per default process group, ``world`` (a collective: every rank reaches its first async save together).
    """
    return dist.new_group(backend="gloo")


def save_sharded(
    path: str | os.PathLike[str],
    state: Mapping[str, Any],
    *,
    background: Callable[[Callable[[], object]], None] | None = None,
    also_at: Iterable[str | os.PathLike[str]] = (),
    replaces: Iterable[str | os.PathLike[str]] = (),
) -> None:
    """Write checkpoint ``state`` as a sharded directory at ``path`` (the module docstring's layout); a collective.

    Once in place it ends as a file's save (:func:`~trainer.checkpoint.files.finish_save`). With
    ``background`` (the writer's :meth:`~trainer.checkpoint.files.AsyncCheckpointWriter.run`), tensors
    are staged to CPU memory now and written by DCP in the background; the writer's thread waits for
    them and does the renames.
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
            write_checkpoint(rest, tmp / TRAINER_STATE)
        except (OSError, CheckpointError) as err:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(
                f"Could not write the sharded checkpoint {path}: writing {tmp / TRAINER_STATE} failed: "
                f"{write_failure(tmp, err.__cause__ or err)}"
            ) from err
    if dist.is_initialized():
        dist.barrier()
    optimizers = state.get("optimizer_states", state.get("optimizers", []))
    tensors = {
        "state_dict": dict(state.get("state_dict", {})),
        "optimizers": {str(i): opt for i, opt in enumerate(optimizers) if opt},
    }
    writer = dcp.FileSystemWriter(tmp, sync_files=True)
    replaces = tuple(replaces)

    def write(future: Any = None) -> None:
        try:
            if future is None:
                with _one_process_quietly():
                    dcp.save(tensors, storage_writer=writer)
            else:
                future.result()
        except dcp_failures() as err:
            if rank0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise checkpoint_error(err, f"Could not write the sharded checkpoint {path}") from err
        if rank0:
            fsync_dir(tmp)
            try:
                swap_in(tmp, path)
            except OSError as err:
                raise CheckpointError(f"Could not rename the sharded checkpoint {tmp} to {path}: {err}") from err
            finish_save(path, extra, replaces)

    if background is None:
        write()
        return
    group = _async_group(id(dist.group.WORLD)) if dist.is_initialized() else None
    with _one_process_quietly():
        future = dcp.async_save(tensors, storage_writer=writer, process_group=group)
    background(functools.partial(write, future))


@contextlib.contextmanager
def _one_process_quietly() -> Any:
    """Without a process group DCP warns that it assumes one process; that is what is meant here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def load_sharded(
    path: str | os.PathLike[str],
    module: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer] = (),
    strict: bool = True,
) -> None:
    """Load a sharded checkpoint's model (and ``optimizers``) into ``module``'s current layout; a collective.

    Optimizer state is matched by parameter name; an optimizer saved before its first step stays as it is.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    path = Path(path)
    saved = set(getattr(read_sharded_metadata(path), "state_dict_metadata", {}))
    model = get_model_state_dict(module, options=_options())
    if strict:
        missing = [k for k in model if f"state_dict.{k}" not in saved]
        if missing:
            raise CheckpointError(
                f"Cannot load the weights in {path}: the checkpoint lacks {missing[:5]} "
                f"({len(missing)} missing). Pass strict=False to load what matches."
            )
        # As a file's load_state_dict(strict=True): weights the module has no place for are refused too.
        unexpected = sorted(k[len("state_dict.") :] for k in saved if k.startswith("state_dict."))
        unexpected = [k for k in unexpected if k not in model]
        if unexpected:
            raise CheckpointError(
                f"Cannot load the weights in {path}: the checkpoint holds {unexpected[:5]} "
                f"({len(unexpected)} unexpected), which the module lacks (a checkpoint of another, bigger "
                "model?). Pass strict=False to load what matches."
            )
    else:
        model = {k: v for k, v in model.items() if f"state_dict.{k}" in saved}
    wanted = {
        str(i): opt for i, opt in enumerate(optimizers) if any(key.startswith(f"optimizers.{i}.") for key in saved)
    }
    target: dict[str, Any] = {"state_dict": model}
    if wanted:
        target["optimizers"] = {
            i: get_optimizer_state_dict(module, opt, options=_options()) for i, opt in wanted.items()
        }
    try:
        with _one_process_quietly():
            dcp.load(target, storage_reader=safe_reader(path), planner=safe_planner())
    except dcp_failures() as err:
        raise checkpoint_error(err, f"Cannot load the sharded checkpoint {path}") from err
    set_model_state_dict(module, target["state_dict"], options=_options(strict=strict))
    for i, opt in wanted.items():
        set_optimizer_state_dict(module, opt, target["optimizers"][i], options=_options())
