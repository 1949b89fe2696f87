"""``python -m trainer.checkpoint.convert``: a sharded checkpoint directory to one portable file, and back.

::

    python -m trainer.checkpoint.convert to-file checkpoints/last.ckpt last-full.ckpt
    python -m trainer.checkpoint.convert to-dir last-full.ckpt checkpoints/from-file.ckpt

``to-file`` reads every shard in this one process (it needs memory for the whole state, as any
single file does) and writes geartrain's checkpoint file, which ``torch.load(path,
weights_only=True)`` reads and every strategy resumes from. ``to-dir`` writes a file's state as a
sharded directory (one shard) that any world size loads.

The optimizer state is renumbered between the two layouts: ``optimizer.state_dict()``'s by-index
layout in a file, keyed by parameter name in a directory (from the names a file records,
``optimizer_param_names``). Both writes go through the writer (:func:`~trainer.checkpoint.files.write_checkpoint`,
:func:`~trainer.checkpoint.sharded.save_sharded`), both reads through the reader.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainer.checkpoint.files import write_checkpoint
from trainer.checkpoint.reader import complete_path, load_checkpoint, read_directory
from trainer.checkpoint.sharded import save_sharded
from trainer.checkpoint.sharded_safety import checkpoint_error, read_sharded_metadata, safe_planner, safe_reader
from trainer.common.errors import CheckpointError

__all__ = ["directory_to_file", "file_to_directory", "main"]


def _read_all_tensors(path: Path) -> dict[str, Any]:
    """Every tensor and value of a sharded checkpoint, whole, in one process (what conversion needs)."""
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    read_sharded_metadata(path)  # refuses a crafted .metadata with its own message, before DCP wraps it
    state: dict[str, Any] = {}
    planner = safe_planner(_EmptyStateDictLoadPlanner)
    try:
        _load_state_dict(state, storage_reader=safe_reader(path), planner=planner, no_dist=True)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:  # DCP's CheckpointException is one
        raise checkpoint_error(err, f"Cannot read the sharded checkpoint {path}") from err
    return state


def directory_to_file(directory: str | os.PathLike[str], file: str | os.PathLike[str]) -> Path:
    """Write the sharded checkpoint ``directory`` as one portable geartrain checkpoint ``file``.

    Holds the whole state in this process's memory once (that is what a single file is).
    """
    directory = complete_path(directory)
    state = read_directory(directory)
    del state["sharded_directory"]
    tensors = _read_all_tensors(directory)
    state["state_dict"] = dict(tensors.get("state_dict", {}))
    if "optimizer_types" in state:  # keyed by parameter name -> optimizer.state_dict()'s layout (by index)
        saved = tensors.get("optimizers", {})
        named = [saved.get(str(i)) or {"param_groups": []} for i in range(len(state["optimizer_types"]))]
        state["optimizer_param_names"] = [[str(p) for g in opt["param_groups"] for p in g["params"]] for opt in named]
        state["optimizer_states"] = [
            _renumber(opt, {name: i for i, name in enumerate(names)})
            for opt, names in zip(named, state["optimizer_param_names"])
        ]
    return write_checkpoint(state, file)


def _renumber(opt_state: dict[str, Any], key: Mapping[Any, Any]) -> dict[str, Any]:
    """``opt_state`` with each parameter's key (in its state and its param groups) replaced by ``key[old]``."""
    return {
        "state": {key[old]: value for old, value in opt_state.get("state", {}).items()},
        "param_groups": [{**g, "params": [key[p] for p in g["params"]]} for g in opt_state["param_groups"]],
    }


def file_to_directory(file: str | os.PathLike[str], directory: str | os.PathLike[str]) -> Path:
    """Write the geartrain checkpoint ``file`` as a sharded checkpoint ``directory`` (one shard).

    The optimizer state is keyed by parameter name, from the names the file records; a file
    without them (written before geartrain recorded them) converts its weights and trainer state,
    and refuses to guess the optimizer's names.
    """
    state = load_checkpoint(file)
    optimizers = state.get("optimizer_states")
    if optimizers:
        names = state.get("optimizer_param_names")
        if not names or len(names) != len(optimizers):
            raise CheckpointError(
                f"{file} does not record its optimizers' parameter names, which a sharded checkpoint keys their "
                "state by; resave it with this geartrain (Trainer.save_checkpoint), or load it as a file"
            )
        state["optimizer_states"] = [  # optimizer.state_dict()'s layout (by index) -> keyed by parameter name
            _renumber(opt, dict(enumerate(n))) if opt.get("param_groups") else {} for opt, n in zip(optimizers, names)
        ]
    save_sharded(directory, state)
    return Path(directory)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (2 for a bad checkpoint, with the reason on stderr)."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer.checkpoint.convert",
        description="Convert a sharded geartrain checkpoint directory to one file, or a file to a directory.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, convert, source, target, help_text in (
        ("to-file", directory_to_file, "directory", "file", "sharded directory -> one portable checkpoint file"),
        ("to-dir", file_to_directory, "file", "directory", "checkpoint file -> sharded directory"),
    ):
        command = sub.add_parser(name, help=help_text)
        command.add_argument("source", metavar=source)
        command.add_argument("target", metavar=target)
        command.set_defaults(convert=convert)
    args = parser.parse_args(argv)
    try:
        written = args.convert(args.source, args.target)
    except CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
