"""``TrainModule`` (and ``DataModule``): the user's side of the contract, with Lightning's names.

Porting a ``LightningModule`` is a change of base class. The trainer drives these methods; a module
used outside a trainer is a plain ``nn.Module`` whose ``self.log`` does nothing. The hooks are in
:mod:`trainer.module_hooks`, ``self.log`` in :mod:`trainer.module_logging`, hyperparameters in
:mod:`trainer.hparams`, the data module in :mod:`trainer.datamodule` (re-exported here), checkpoint
loading in :mod:`trainer.checkpoint.lightning_format`.
"""

from __future__ import annotations

import builtins
import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from trainer.common.errors import MisconfigurationException
from trainer.datamodule import DataModule
from trainer.hparams import HyperparametersMixin
from trainer.module_export import ExportMixin
from trainer.module_hooks import DataHooks, ModelDefaults, ModelHooks
from trainer.module_logging import LoggingMixin

if TYPE_CHECKING:
    from trainer.trainer import Trainer

M = TypeVar("M", bound="TrainModule")

__all__ = ["DataModule", "TrainModule"]


class TrainModule(HyperparametersMixin, ModelHooks, ModelDefaults, DataHooks, LoggingMixin, ExportMixin, nn.Module):
    """Base class for models the :class:`~trainer.Trainer` trains.

    Override ``training_step`` and ``configure_optimizers``; add ``validation_step``, ``test_step``,
    ``predict_step`` and any ``on_*`` hook as needed. Set ``automatic_optimization = False`` to call
    ``self.optimizers()``, ``self.manual_backward(loss)`` and ``opt.step()`` yourself.

    >>> class Net(TrainModule):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.layer = nn.Linear(2, 1)
    ...     def training_step(self, batch, batch_idx):
    ...         return self.layer(batch).sum()
    ...     def configure_optimizers(self):
    ...         return torch.optim.SGD(self.parameters(), lr=0.1)
    >>> Net().training_step(torch.ones(1, 2), 0).shape
    torch.Size([])
    """

    #: The checkpoint keys of the hyperparameters (geartrain's file format; Lightning's are ``hyper_parameters``...).
    CHECKPOINT_HYPER_PARAMS_KEY = "hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "hparams_type"

    # torch.jit.script compiles every property it finds unless named here (as Lightning's list):
    # these read the trainer or walk the parameters, which TorchScript cannot follow and a scripted
    # model does not need. No class attribute of this class is annotated, for the same reason:
    # TorchScript takes a module's class annotations as its attributes' types.
    __jit_unused_properties__ = [
        "example_input_array",
        "on_gpu",
        "current_epoch",
        "global_step",
        "global_rank",
        "local_rank",
        "logger",
        "loggers",
        "automatic_optimization",
        "trainer",
        "fabric",
        "strict_loading",
        "device_mesh",
        "device",
        "dtype",
        "hparams",
        "hparams_initial",
    ]
    #: True while ``to_torchscript``/``to_onnx`` run: :attr:`trainer` then answers None instead of raising.
    _jit_is_scripting = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer: Trainer | None = None
        self._automatic_optimization = True
        self._strict_loading: bool | None = None
        self._example_input_array: Any = None
        self._param_requires_grad_state: dict[torch.Tensor, bool] = {}  # toggle_optimizer's saved flags
        self._device_mesh: Any = None

    # ----------------------------------------------------------------- plain settings
    @property
    def automatic_optimization(self) -> bool:
        """When False the trainer calls ``training_step`` and leaves backward and step to it."""
        return self._automatic_optimization

    @automatic_optimization.setter
    def automatic_optimization(self, value: bool) -> None:
        self._automatic_optimization = value

    @property
    def strict_loading(self) -> bool:
        """Whether loading weights requires every key to match (``load_from_checkpoint``'s default ``strict``)."""
        return True if self._strict_loading is None else self._strict_loading

    @strict_loading.setter
    def strict_loading(self, value: bool) -> None:
        self._strict_loading = value

    @property
    def example_input_array(self) -> Any:
        """An example input (a tensor or a tuple of them): the model summary shows input and output sizes."""
        return self._example_input_array

    @example_input_array.setter
    def example_input_array(self, example: Any) -> None:
        self._example_input_array = example

    @property
    def device_mesh(self) -> Any:
        """The device mesh of a model-parallel strategy (None without one)."""
        return self._device_mesh

    @device_mesh.setter
    def device_mesh(self, mesh: Any) -> None:
        self._device_mesh = mesh

    @property
    def fabric(self) -> None:
        """Lightning Fabric's object when run by Fabric (always None: geartrain has no Fabric)."""
        return None

    # ----------------------------------------------------------------- trainer state
    @property
    def trainer(self) -> Trainer:
        """The trainer driving this module (an error outside ``fit``/``validate``/...)."""
        if self._trainer is None:
            if self._jit_is_scripting:  # torch.jit walks attributes; not an error there
                return None  # type: ignore[return-value]
            raise RuntimeError(f"{type(self).__qualname__} is not attached to a `Trainer`.")
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: Trainer | None) -> None:
        """Attach (or with None detach) a trainer, here and in every child module of this kind, as Lightning."""
        for child in self.children():
            if isinstance(child, TrainModule):
                child.trainer = trainer
        self._trainer = trainer

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far (0 outside a trainer)."""
        return self._trainer.global_step if self._trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        """The epoch being trained, from 0 (0 outside a trainer)."""
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def device(self) -> torch.device:
        """The device of the module's first parameter or buffer (CPU if it has none)."""
        for param in self.parameters():
            return param.device
        for buffer in self.buffers():
            return buffer.device
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the module's first floating-point parameter (the default dtype if none)."""
        for param in self.parameters():
            if param.is_floating_point():
                return param.dtype
        return torch.get_default_dtype()

    @property
    def on_gpu(self) -> bool:
        """Whether the module is on a CUDA device."""
        return self.device.type == "cuda"

    @property
    def global_rank(self) -> int:
        """This process's rank among all processes (0 outside a trainer)."""
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        """This process's rank on its node (0 outside a trainer)."""
        return self._trainer.local_rank if self._trainer is not None else 0

    @property
    def loggers(self) -> list[Any]:
        """The trainer's loggers (the callbacks that write logged metrics), [] outside a trainer."""
        t = self._trainer
        if t is None:
            return []
        return list(t.loggers)

    @property
    def logger(self) -> Any:
        """The first of :attr:`loggers`, or None."""
        loggers = self.loggers
        return loggers[0] if loggers else None

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only (so a message appears once under DDP), through the progress bar.

        While a progress bar is enabled the line goes through its ``print``, so it does not break the bar
        (tqdm's ``write``, rich's console), as Lightning does; otherwise through the built-in ``print``.
        """
        if self.global_rank != 0:
            return
        bar = self._trainer.progress_bar_callback if self._trainer is not None else None
        if bar is not None and bar.is_enabled:  # type: ignore[attr-defined]
            bar.print(*args, **kwargs)  # type: ignore[attr-defined]
        else:
            builtins.print(*args, **kwargs)

    def all_gather(self, data: Any, group: Any | None = None, sync_grads: bool = False) -> Any:
        """Gather ``data`` (a tensor, or a dict/list/tuple of them) from every process.

        Each tensor gets a new first dimension of size world size (on one process: returned as it
        is, as Lightning does). ``sync_grads=True`` keeps the graph (``torch.distributed.nn``).
        """
        if group is not None:
            raise ValueError("self.all_gather(group=...) is not supported: geartrain gathers over all processes")
        t = self._trainer
        if t is None or t.strategy.world_size == 1:
            return data
        gather: Callable[[torch.Tensor], torch.Tensor] = _gather_with_grads if sync_grads else t.strategy.all_gather
        return _map_tensors(data, gather)

    @classmethod
    def load_from_checkpoint(
        cls: type[M],
        checkpoint_path: str | os.PathLike[str] | IO[bytes],
        map_location: Any = None,
        hparams_file: str | os.PathLike[str] | None = None,
        strict: bool | None = None,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> M:
        """Rebuild the module from a checkpoint's saved hyperparameters, then load its weights.

        ``kwargs`` override saved hyperparameters or supply those a checkpoint cannot hold (an
        ``nn.Module`` argument: it is saved as a description; a missing one is an error naming it).
        Reads geartrain's and Lightning 2.x's checkpoints, always with ``weights_only=True``.
        ``strict`` defaults to :attr:`strict_loading`.
        """
        from trainer.checkpoint.lightning_format import load_from_checkpoint

        return load_from_checkpoint(cls, checkpoint_path, map_location, hparams_file, strict, weights_only, kwargs)

    # ----------------------------------------------------------------- user steps
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | Mapping[str, Any] | None:
        """Compute the loss of one batch; return it, a dict with ``"loss"``, or None to skip."""
        raise NotImplementedError(
            f"{type(self).__name__} must define training_step(self, batch, batch_idx) to be trained"
        )

    def configure_optimizers(self) -> Any:
        """Return an optimizer, a list of them, or ``{"optimizer": ..., "lr_scheduler": ...}``."""
        raise NotImplementedError(f"{type(self).__name__} must define configure_optimizers()")

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        """Default prediction: ``self(batch)``; takes ``(batch, batch_idx[, dataloader_idx])`` as Lightning's does."""
        return self(kwargs["batch"] if "batch" in kwargs else args[0])

    # ----------------------------------------------------------------- manual optimisation
    def optimizers(self, use_pl_optimizer: bool = True) -> Any:
        """The optimizer(s) from ``configure_optimizers``; one object if there is one.

        ``use_pl_optimizer=False`` returns the torch optimizers themselves (their ``step`` bypasses
        the strategy: no fp16 scaling, no global step count), as in Lightning.
        """
        handles = self.trainer.optimizer_handles if use_pl_optimizer else self.trainer.optimizers
        return handles[0] if len(handles) == 1 else handles

    def lr_schedulers(self) -> Any:
        """The scheduler(s) from ``configure_optimizers``; None, one, or a list."""
        schedulers = [cfg.scheduler for cfg in self.trainer.lr_scheduler_configs]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward through the strategy (loss scaling, sync), in place of ``loss.backward()``.

        The trainer's ``on_nonfinite`` policy applies: a non-finite loss raises, warns, or (``"skip"``)
        is not backpropagated and the next ``opt.step()`` is dropped.
        """
        backward = self.trainer.run_state.manual_backward
        if backward is None:  # before fit set up the optimizers: no policy to apply yet
            self.trainer.strategy.manual_backward(loss, *args, **kwargs)
        else:
            backward(loss, *args, **kwargs)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward of the training loss (automatic optimisation); override to change how it runs."""
        loss.backward(*args, **kwargs)

    def toggle_optimizer(self, optimizer: Any) -> None:
        """Switch off the other optimizers' parameters until :meth:`untoggle_optimizer` (Lightning's rule:
        parameters no optimizer holds keep their flag, and ``optimizer``'s keep the one they had)."""
        state: dict[torch.Tensor, bool] = {}
        for opt in self.trainer.optimizers:
            for group in opt.param_groups:
                for param in group["params"]:
                    if param not in state:
                        state[param] = param.requires_grad
                        param.requires_grad = False
        for group in getattr(optimizer, "optimizer", optimizer).param_groups:
            for param in group["params"]:
                param.requires_grad = state.get(param, param.requires_grad)
        self._param_requires_grad_state = state

    def untoggle_optimizer(self, optimizer: Any) -> None:
        """Restore the ``requires_grad`` flags :meth:`toggle_optimizer` switched off."""
        for param, flag in self.__dict__.get("_param_requires_grad_state", {}).items():
            param.requires_grad = flag
        self._param_requires_grad_state = {}

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: Any) -> Iterator[None]:
        """:meth:`toggle_optimizer` for the ``with`` block, untoggled after it."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    def freeze(self: M) -> M:
        """No parameter requires grad, and eval mode."""
        for param in self.parameters():
            param.requires_grad = False
        return self.eval()

    def unfreeze(self: M) -> M:
        """Every parameter requires grad, and training mode."""
        for param in self.parameters():
            param.requires_grad = True
        return self.train()

    def clip_gradients(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip ``optimizer``'s gradients by ``"norm"`` (default) or ``"value"``, unscaling first under fp16.

        Left out, a value is the Trainer's; given, it must agree with one the Trainer was given (Lightning's
        ``MisconfigurationException`` otherwise: two places would decide one clipping).
        """
        t = self.trainer
        if gradient_clip_val is None:
            gradient_clip_val = t.gradient_clip_val
        elif t.gradient_clip_val is not None and t.gradient_clip_val != gradient_clip_val:
            raise MisconfigurationException(
                f"You have set `Trainer(gradient_clip_val={t.gradient_clip_val!r})` and have passed "
                f"`clip_gradients(gradient_clip_val={gradient_clip_val!r})`. Please use only one of them."
            )
        if gradient_clip_algorithm is None:
            gradient_clip_algorithm = t.gradient_clip_algorithm or "norm"
        elif t.__dict__.get("_gradient_clip_algorithm_given") and t.gradient_clip_algorithm != gradient_clip_algorithm:
            raise MisconfigurationException(
                f"You have set `Trainer(gradient_clip_algorithm={t.gradient_clip_algorithm!r})` and have passed "
                f"`clip_gradients(gradient_clip_algorithm={gradient_clip_algorithm!r}) Please use only one of them."
            )
        opt = getattr(optimizer, "optimizer", optimizer)
        strategy, algorithm = t.strategy, gradient_clip_algorithm
        if type(strategy.precision).clip_gradients.__module__.split(".")[0] != "strategies":
            strategy.precision.clip_gradients(opt, gradient_clip_val or 0.0, algorithm)  # the user's plugin
            return
        strategy.clip_gradients(opt, gradient_clip_val, algorithm)


def _gather_with_grads(x: torch.Tensor) -> torch.Tensor:
    """All-gather that keeps the autograd graph (gradients flow back to every rank's input)."""
    import torch.distributed.nn.functional as dist_nn

    return torch.stack(dist_nn.all_gather(x))


def _map_tensors(data: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``fn`` applied to every tensor in a tree of dicts, lists and tuples."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, Mapping):
        return type(data)({k: _map_tensors(v, fn) for k, v in data.items()})  # type: ignore[call-arg]
    if isinstance(data, (list, tuple)):
        return type(data)(_map_tensors(v, fn) for v in data)
    return data
