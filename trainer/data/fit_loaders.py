"""When ``fit`` asks for its loaders, as Lightning does.

- The training loader: after the sanity check (so ``val_dataloader()`` is called first when it runs),
  then again every ``reload_dataloaders_every_n_epochs`` epochs (:func:`request_train_loader`).
- The validation loaders: when a validation first needs them (the sanity check, else the first
  validation), then again at a validation at least ``reload_dataloaders_every_n_epochs`` epochs after
  the last request (:func:`request_val_loaders`). A sanity check in an epoch that does not validate
  (``check_val_every_n_epoch`` above 1) does not count as that epoch's request.

The sanity check puts the random generators back afterwards (``trainer/loops/evaluation.py``), so a
``val_dataloader()`` that draws random numbers there changes nothing of the training, as in Lightning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.data.loaders import resolve_loaders

if TYPE_CHECKING:
    from trainer.run_state import RunState
    from trainer.trainer import Trainer

__all__ = ["defines_loader", "has_val_data", "request_train_loader", "request_val_loaders"]


def request_train_loader(trainer: Trainer, reload: bool = False) -> Any:
    """The training loader, requested now if not yet (one already prepared is kept) or when ``reload``."""
    state = trainer.run_state
    if reload or "fit" not in state.loaders:
        state.loaders["fit"] = resolve_loaders(trainer, "fit", state.given_loaders.get("fit"))
    return state.loaders["fit"]


def request_val_loaders(trainer: Trainer) -> Any:
    """The fit's validation loaders (a list, or None without any), requested now if not yet or if a reload is due."""
    state = trainer.run_state
    epoch, every = state.progress.epoch, trainer.reload_dataloaders_every_n_epochs
    if "validate" in state.loaders and not (every and epoch - state.val_loaders_epoch >= every):
        return state.loaders["validate"]
    given = state.given_loaders.get("validate")
    state.loaders["validate"] = resolve_loaders(trainer, "validate", given, required=False)
    n = state.loop.check_val_every_n_epoch
    if not state.sanity_checking or n is None or (epoch + 1) % n == 0:
        state.val_loaders_epoch = epoch
    return state.loaders["validate"]


def has_val_data(state: RunState) -> bool:
    """Whether ``fit`` has validation data: loaders requested and found, else given or defined (not yet requested)."""
    if "validate" in state.loaders:
        return state.loaders["validate"] is not None
    if state.given_loaders.get("validate") is not None:
        return True
    return any(defines_loader(source, "val_dataloader") for source in (state.datamodule, state.module))


def defines_loader(source: Any, method: str) -> bool:
    """Whether a module or data module overrides (or was given) the loader method ``method``."""
    if source is None or getattr(source, method, None) is None:
        return False
    from trainer.module import DataModule, TrainModule

    base = DataModule if isinstance(source, DataModule) else TrainModule
    return getattr(type(source), method, None) is not getattr(base, method, None) or method in vars(source)
