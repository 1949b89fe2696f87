"""The module's train/eval modes around an evaluation: its ``on_*_model_eval``/``_train`` hooks, as Lightning
calls them (``self.log`` refused there, as in Lightning), or what their defaults do."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from trainer.metrics.routing import MetricRouter
    from trainer.module import TrainModule

__all__ = ["model_mode", "module_modes", "overrides", "replaced", "restore_modes"]


def overrides(module: TrainModule, hook: str) -> bool:
    """Whether ``module`` overrides TrainModule's ``hook`` (Lightning's ``is_overridden``: a hook set to None
    on the instance is not overridden, one set to a function there is)."""
    from trainer.hooks import is_overridden
    from trainer.module import TrainModule

    return is_overridden(hook, module, TrainModule)


def replaced(module: TrainModule, hook: str) -> bool:
    """Whether ``module.<hook>`` is anything but TrainModule's own method: a subclass's override, or a callable
    set on the instance (a wrapper around the default, a ``Mock``); None on the instance is not."""
    from trainer.module import TrainModule

    fn = getattr(module, hook, None)
    return fn is not None and getattr(fn, "__func__", None) is not getattr(TrainModule, hook)


def module_modes(module: torch.nn.Module) -> dict[str, bool]:
    """The ``training`` flag of ``module`` and of every submodule, by name (to put back after evaluating)."""
    return {name: sub.training for name, sub in module.named_modules()}


def restore_modes(module: torch.nn.Module, modes: dict[str, bool]) -> None:
    """Put back what :func:`module_modes` read: a submodule the user keeps in eval mode stays there."""
    for name, sub in module.named_modules():
        if name in modes:
            sub.training = modes[name]


def model_mode(module: TrainModule, hook: str, router: MetricRouter, modes: dict[str, bool] | None = None) -> None:
    """Call the module's ``on_*_model_eval``/``_train`` hook where overridden, else do what the default does:
    ``eval()``, or (``modes`` given, the ``_train`` hooks) put back every submodule's own mode, as Lightning 2.6.
    The hook runs inside ``router``'s refusal of ``self.log``."""
    if modes is None:  # the _eval hooks: always called, as Lightning calls them (the default does eval())
        fn = getattr(module, hook, None)
        if fn is None:  # set to None on the instance: eval() still, as the default would
            module.eval()
        else:
            router.no_log(hook, fn)()
    elif overrides(module, hook):
        router.no_log(hook, getattr(module, hook))()
    else:
        restore_modes(module, modes)
