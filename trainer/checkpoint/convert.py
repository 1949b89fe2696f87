"""``python -m trainer.checkpoint.convert``: a sharded checkpoint directory to one portable file, and back.

::

    python -m trainer.checkpoint.convert to-file checkpoints/last.ckpt last-full.ckpt
    python -m trainer.checkpoint.convert to-dir last-full.ckpt checkpoints/from-file.ckpt

``to-file`` reads every shard in this one process (it needs memory for the whole state, as any
single file does) and writes geartrain's checkpoint file, which ``torch.load(path,
weights_only=True)`` reads and every strategy resumes from. ``to-dir`` writes a file's state as a
sharded directory (one shard) that any world size loads.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from trainer.checkpoint.sharded import directory_to_file, file_to_directory
from trainer.common.errors import CheckpointError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (2 for a bad checkpoint, with the reason on stderr)."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer.checkpoint.convert",
        description="Convert a sharded geartrain checkpoint directory to one file, or a file to a directory.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    to_file = sub.add_parser("to-file", help="sharded directory -> one portable checkpoint file")
    to_file.add_argument("directory")
    to_file.add_argument("file")
    to_dir = sub.add_parser("to-dir", help="checkpoint file -> sharded directory")
    to_dir.add_argument("file")
    to_dir.add_argument("directory")
    args = parser.parse_args(argv)
    try:
        if args.command == "to-file":
            written = directory_to_file(args.directory, args.file)
        else:
            written = file_to_directory(args.file, args.directory)
    except CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
