"""Lightning callbacks geartrain does not have yet: the names exist, and building one says what to use.

A Lightning project importing one of these fails at the line that builds it, with the
alternative, instead of at import time with a bare ``ImportError`` (or, worse, running without it).
"""

from __future__ import annotations

from typing import Any, NoReturn

from callbacks.base import Callback

__all__ = ["UNSUPPORTED", "UNSUPPORTED_LOGGERS", "unsupported_class"]

#: Lightning callback name -> what to do instead.
UNSUPPORTED: dict[str, str] = {}
_OTHER_TRACKERS = (
    "callbacks.MLFlowLogger, callbacks.WandbLogger, callbacks.TensorBoardLogger, callbacks.CSVLogger, "
    "or a subclass of callbacks.Logger writing to your tracker"
)
UNSUPPORTED.update(dict.fromkeys(("CometLogger", "NeptuneLogger", "LitLogger"), _OTHER_TRACKERS))

#: Lightning logger name -> what to do instead.
UNSUPPORTED_LOGGERS: dict[str, str] = {
    name: f"use callbacks.TensorBoardLogger or callbacks.CSVLogger, or subclass callbacks.Logger (log_metrics, "
    f"log_hyperparams) to send values to {service}"
    for name, service in (
        ("WandbLogger", "Weights & Biases"),
        ("CometLogger", "Comet"),
        ("MLFlowLogger", "MLflow"),
        ("NeptuneLogger", "Neptune"),
        ("LitLogger", "Lightning's platform"),
    )
}


def unsupported_class(name: str) -> type[Callback]:
    """A ``Callback`` subclass named ``name`` whose construction raises ``NotImplementedError``."""
    instead = UNSUPPORTED.get(name) or UNSUPPORTED_LOGGERS[name]

    def __init__(self: Callback, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"callbacks.{name} is not supported yet: {instead}")

    return type(
        name,
        (Callback,),
        {"__init__": __init__, "__doc__": f"Not supported yet: {instead}.", "__module__": "callbacks"},
    )
