"""What counts as a Lightning internal: shared by the alias (which stubs internals) and the classifier.

Lightning documents its public API; a test that reaches past it (a ``_private`` name, the loops,
the trainer's connectors, launchers, Lightning's own test utilities) tests Lightning's
implementation, not the behaviour a program sees, and is counted as "needs Lightning internals".
Public names a test uses (``module.trainer = ...``, ``trainer.train_dataloader``, ``DummyLogger``)
are never internals.
"""

from __future__ import annotations

#: Module paths below ``lightning.pytorch`` that are Lightning's implementation, not its API.
INTERNAL_MODULES: tuple[str, ...] = (
    "loops",
    "trainer.connectors",
    "trainer.call",
    "trainer.configuration_validator",
    "trainer.setup",
    "overrides",
    "strategies.launchers",
    "utilities.signature_utils",
    "utilities.migration",
    "utilities.testing",
    "utilities.compile",
    "utilities.data",
    "utilities.model_registry",
    "utilities.combined_loader._",
)

#: Attribute names that are Lightning's implementation although they have no leading underscore.
INTERNAL_ATTRS: frozenset[str] = frozenset(
    {
        "fit_loop",
        "validate_loop",
        "test_loop",
        "predict_loop",
        "epoch_loop",
        "val_loop",
        "batch_progress",
        "epoch_progress",
        "optim_progress",
        "automatic_optimization_loop",
        "manual_optimization",
        "automatic_optimization",
    }
)

#: Lightning's package prefixes, each read as ``lightning.pytorch``.
PREFIXES: tuple[str, ...] = ("lightning.pytorch", "pytorch_lightning", "trainer.lightning")


def canonical(module: str) -> str | None:
    """``module`` as a path below ``lightning.pytorch`` ("" for the root), or None when it is not Lightning's."""
    for prefix in PREFIXES:
        if module == prefix:
            return ""
        if module.startswith(prefix + "."):
            return module[len(prefix) + 1 :]
    return None


def is_private(name: str) -> bool:
    """A ``_name`` that is not a dunder."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_internal_module(path: str) -> bool:
    """Whether ``path`` (below ``lightning.pytorch``) is Lightning's implementation.

    A module's ``__dict__`` is too: a test reaching it (``mock.patch.dict("lightning.pytorch.x.__dict__",
    {...})``) patches that module's globals, which an alias cannot forward to geartrain's modules.
    """
    if any(is_private(part) or part == "__dict__" for part in path.split(".")):
        return True
    return any(path == internal or path.startswith(internal + ".") for internal in INTERNAL_MODULES)
