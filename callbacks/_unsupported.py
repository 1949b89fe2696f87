"""Lightning callbacks geartrain does not have yet: the names exist, and building one says what to use.

A Lightning project importing one of these fails at the line that builds it, with the
alternative, instead of at import time with a bare ``ImportError`` (or, worse, running without it).
"""

from __future__ import annotations

from typing import Any, NoReturn

from callbacks.base import Callback

__all__ = ["UNSUPPORTED", "unsupported_class"]

#: Lightning callback name -> what to do instead.
UNSUPPORTED: dict[str, str] = {
    "ModelPruning": "torch.nn.utils.prune in on_train_epoch_end of a Callback of your own",
    "SpikeDetection": "Trainer's non-finite loss policy, or a check of the loss in on_train_batch_end",
}


def unsupported_class(name: str) -> type[Callback]:
    """A ``Callback`` subclass named ``name`` whose construction raises ``NotImplementedError``."""
    instead = UNSUPPORTED[name]

    def __init__(self: Callback, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"callbacks.{name} is not supported yet: {instead}")

    return type(
        name,
        (Callback,),
        {"__init__": __init__, "__doc__": f"Not supported yet: {instead}.", "__module__": "callbacks"},
    )
