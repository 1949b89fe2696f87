"""The hooks of :class:`~trainer.module.TrainModule` and :class:`~trainer.datamodule.DataModule`.

Lightning's names, signatures and defaults. The do-nothing hooks are skipped by the trainer when
nobody overrides them (``HookDispatch``); the hooks with a default that does something
(``optimizer_step``, ``transfer_batch_to_device``, ...) are bound once per epoch by the step, which
uses its own plain path when the module keeps the default, so an un-overridden hook costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from trainer.common.errors import MissingStepError
from trainer.common.tree import move_to_device

if TYPE_CHECKING:
    from callbacks.base import Callback

__all__ = ["DataHooks", "ModelDefaults", "ModelHooks"]


class DataHooks:
    """Data hooks shared by modules and data modules (Lightning's ``DataHooks``)."""

    #: ``prepare_data`` runs on local rank 0 of every node (True) or on global rank 0 only (False).
    #: (No class annotation: ``torch.jit.script`` reads a module's class annotations as attribute types.)
    prepare_data_per_node = True

    def prepare_data(self) -> None:
        """Download or write files: once per node (see ``prepare_data_per_node``), before ``setup``."""

    def setup(self, stage: str) -> None:
        """Build what the ``stage`` (``"fit"``, ``"validate"``, ``"test"``, ``"predict"``) needs, on every process."""

    def teardown(self, stage: str) -> None:
        """Release what :meth:`setup` built."""

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch before it moves to the device (on the CPU, e.g. augmentation). Returns it."""
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move ``batch`` to ``device`` (default: every tensor in it). Override for custom batch types."""
        return move_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch once it is on the device (e.g. GPU augmentation). Returns it."""
        return batch

    def on_exception(self, exception: BaseException) -> None:
        """Called when fit/validate/test/predict raises, before the exception propagates."""

    # The loaders of each stage, Lightning's defaults: a module or data module overrides those it has.
    def train_dataloader(self) -> Iterable[Any]:
        """The training data: a loader, or a list or dict of loaders."""
        raise _no_loader(self, "train_dataloader")

    def val_dataloader(self) -> Iterable[Any]:
        """The validation data."""
        raise _no_loader(self, "val_dataloader")

    def test_dataloader(self) -> Iterable[Any]:
        """The test data."""
        raise _no_loader(self, "test_dataloader")

    def predict_dataloader(self) -> Iterable[Any]:
        """The prediction data."""
        raise _no_loader(self, "predict_dataloader")


def _no_loader(owner: object, method: str) -> MissingStepError:
    """Lightning's error for a loader method left at its default (a ``MisconfigurationException``)."""
    return MissingStepError(
        f"`{method}` must be implemented to be used with the Lightning Trainer "
        f"({type(owner).__name__} does not define {method}())"
    )


class ModelHooks:
    """The module's notification hooks, called in Lightning's order (docs/lightning.md lists the differences).

    They do nothing by default, and the trainer skips those nobody overrides.
    """

    def on_fit_start(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...
    def on_train_epoch_end(self) -> None: ...
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None: ...
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_validation_start(self) -> None: ...
    def on_validation_end(self) -> None: ...
    def on_validation_epoch_start(self) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_start(self) -> None: ...
    def on_test_end(self) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_epoch_end(self) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_start(self) -> None: ...
    def on_predict_end(self) -> None: ...
    def on_predict_epoch_start(self) -> None: ...
    def on_predict_epoch_end(self) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_before_backward(self, loss: torch.Tensor) -> None: ...
    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...


class ModelDefaults:
    """The module's hooks whose default does something; the trainer takes its plain path when kept."""

    def configure_callbacks(self) -> Sequence[Callback] | Callback:
        """Callbacks this module needs; they replace the trainer's callbacks of the same type."""
        return []

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        """One validation batch (Lightning's default does nothing); without an override ``fit`` does not validate."""

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        """One test batch (Lightning's default does nothing); ``Trainer.test`` needs an override."""

    def configure_model(self) -> None:
        """Build layers here (inside the strategy's set-up, before wrapping) to create them sharded."""

    def configure_sharded_model(self) -> None:
        """Lightning's older name of :meth:`configure_model` (deprecated there); called right after it."""

    def optimizer_step(
        self,
        epoch: int,
        batch_idx: int,
        optimizer: Any,
        optimizer_closure: Callable[[], Any] | None = None,
    ) -> None:
        """Step ``optimizer``; the closure runs forward and backward. Override e.g. for LR warm-up.

        >>> # def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        >>> #     for group in optimizer.param_groups: group["lr"] = warmup(self.trainer.global_step)
        >>> #     optimizer.step(closure=optimizer_closure)
        """
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer) -> None:
        """Clear the gradients after a step (default: ``optimizer.zero_grad()``, to None)."""
        optimizer.zero_grad()

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip before each step; the default clips with the Trainer's ``gradient_clip_val``/``_algorithm``."""
        self.clip_gradients(  # type: ignore[attr-defined]
            optimizer, gradient_clip_val=gradient_clip_val, gradient_clip_algorithm=gradient_clip_algorithm
        )

    def lr_scheduler_step(self, scheduler: Any, metric: Any | None) -> None:
        """Step one scheduler (``metric``: the monitored value for ReduceLROnPlateau, else None)."""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    def on_validation_model_eval(self) -> None:
        """Put the model in eval mode for validation."""
        self.trainer.strategy.model.eval()  # type: ignore[attr-defined]

    def on_validation_model_train(self) -> None:
        """Put the model back in training mode after validation (during fit)."""
        self.trainer.strategy.model.train()  # type: ignore[attr-defined]

    def on_validation_model_zero_grad(self) -> None:
        """Free the gradients before validation in fit (``zero_grad()``: to None)."""
        self.zero_grad()  # type: ignore[attr-defined]

    def on_test_model_eval(self) -> None:
        """Put the model in eval mode for testing."""
        self.trainer.strategy.model.eval()  # type: ignore[attr-defined]

    def on_test_model_train(self) -> None:
        """Put the model back in training mode after testing."""
        self.trainer.strategy.model.train()  # type: ignore[attr-defined]

    def on_predict_model_eval(self) -> None:
        """Put the model in eval mode for prediction."""
        self.trainer.strategy.model.eval()  # type: ignore[attr-defined]
