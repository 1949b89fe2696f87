"""A process that saves a sharded checkpoint, then hangs inside the write of a second one (to be killed).

``python sharded_kill.py DIR``: writes ``DIR/last.ckpt/`` from weights filled with 1, prints
``first saved``, then starts replacing it with weights filled with 2; DCP's file writer sleeps
after writing its first tensor, and the script prints ``writing`` so the test can kill -9 it there.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
import torch.distributed.checkpoint.filesystem as fs

from trainer.checkpoint.sharded import save_sharded


def state(value: float) -> dict[str, Any]:
    return {"format": "geartrain", "version": 1, "state_dict": {"w": torch.full((64,), value)}, "progress": {}}


def main(directory: str) -> None:
    save_sharded(f"{directory}/last.ckpt", state(1.0))
    print("first saved", flush=True)
    original = fs._write_item

    def slow(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        print("writing", flush=True)
        time.sleep(600)
        return result

    fs._write_item = slow
    save_sharded(f"{directory}/last.ckpt", state(2.0))


if __name__ == "__main__":
    main(sys.argv[1])
