"""The one quiet trainer of the test suite: CPU, no progress bar, no logger, no checkpoints."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from callbacks import Callback, Checkpoint, ProgressBar
from strategies import SingleDeviceStrategy
from trainer import Trainer


def quiet_trainer(root: str | Path | None = None, callbacks: Iterable[Callback] = (), **kwargs: Any) -> Trainer:
    """A trainer that writes nothing and prints nothing unless ``kwargs`` say otherwise.

    Defaults: ``strategy=SingleDeviceStrategy(device="cpu")`` (parity tests compare bitwise with a
    loop on the CPU), ``num_sanity_val_steps=0``, no progress bar, model summary, logger or ``ModelCheckpoint``,
    and ``default_root_dir=root`` when ``root`` is given (else the Trainer's own default). Any
    keyword overrides them; a test that needs the Trainer's defaults passes them explicitly, e.g.
    ``quiet_trainer(strategy="auto", num_sanity_val_steps=2)``.

    Args:
        root: ``default_root_dir``.
        callbacks: the trainer's callbacks.
        **kwargs: any other ``Trainer`` argument.
    """
    callbacks = list(callbacks)
    given_bar = any(isinstance(cb, ProgressBar) for cb in callbacks)
    options: dict[str, Any] = {
        "enable_progress_bar": given_bar,  # a bar given is the bar (False beside one is refused, as in Lightning)
        "logger": False,
        # A checkpoint callback given is the checkpointing (False beside one is refused, as in Lightning).
        "enable_checkpointing": any(isinstance(cb, Checkpoint) for cb in callbacks),
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }
    if root is not None:
        options["default_root_dir"] = root
    options.update(kwargs)
    if "strategy" not in options:  # built only when used: a Strategy is a fresh object per trainer
        options["strategy"] = SingleDeviceStrategy(device="cpu")
    return Trainer(callbacks=callbacks, **options)


def spawned(name: str) -> Any:
    """Strategy ``name`` with its processes spawned and handed pickled objects (``ddp_spawn``'s way).

    A test that calls ``fit`` inside pytest cannot use ``strategy="ddp"``/``"fsdp"`` as they are:
    their other ranks run the script again, and here the script is the test session.
    """
    from strategies.registry import build_strategy

    if name == "single":
        return name
    strategy = build_strategy(name)  # FSDP's and model_parallel's constructors take no start_method: set it
    strategy.start_method = "spawn"  # type: ignore[attr-defined]
    return strategy
