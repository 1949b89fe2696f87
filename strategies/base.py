"""The Strategy interface: where tensors go, how gradients are synced, how processes agree.

The trainer talks to a strategy only through these methods and never asks which strategy it holds.
Every method has a working single-process default, so a new strategy overrides only what differs.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch
from torch import nn

from strategies.accelerators import Accelerator, default_device
from strategies.lightning_names import LightningStrategyNames, one_precision
from strategies.precision import NULL_CONTEXT, Precision, make_precision
from trainer.common.errors import UserError
from trainer.common.state_dict import load_module_state
from trainer.common.tree import move_to_device

if TYPE_CHECKING:
    from trainer.module import TrainModule

__all__ = ["Strategy"]

T = TypeVar("T")


class Strategy(LightningStrategyNames):
    """Base strategy: one process, one device (CPU unless a subclass says otherwise).

    Args:
        precision: ``"32-true"`` (the default, also for ``None``), ``"16-mixed"``, ``"bf16-mixed"``,
            ``"bf16-true"`` or a :class:`~strategies.precision.Precision` instance.
        device: the device to train on; ``None`` picks the best available (CUDA, MPS, CPU).
    """

    #: The name ``Trainer(strategy=...)`` and ``geartrain strategy=...`` build this class under. The
    #: registry finds a class in the module of ``strategies`` named by the name's first words
    #: (``"ddp"`` and ``"ddp_spawn"`` in ``strategies/ddp.py``): a strategy is one file named after it.
    name = "base"
    #: Other names for this class (Lightning's), each with the constructor arguments it implies.
    aliases: ClassVar[dict[str, dict[str, Any]]] = {}
    #: True on a class that other strategies build on and that is not built by name itself (this one,
    #: ``ParallelStrategy``); read from the class's own namespace, so subclasses are registered.
    base_only: ClassVar[bool] = True
    #: Whether evaluation may run under ``torch.inference_mode()`` (``Trainer(inference_mode=True)``).
    supports_inference_mode = True
    #: How checkpoints are written: ``"full"``, one file gathered on rank 0 (the portable form), or
    #: ``"sharded"``, a directory each rank writes its own shards into (:meth:`sharded_model_state_dict`). A
    #: strategy opts in to sharded checkpoints by setting this to ``"sharded"``; nothing else is needed
    #: for a module whose parameters are plain tensors or DTensors (FSDP2, tensor parallel, both).
    state_dict_type: str = "full"
    #: Whether :meth:`setup` wraps, replicates or shards the module, which needs every parameter's shape:
    #: lazy layers (``nn.LazyLinear``) are then given theirs by one forward before it. Where False, a lazy
    #: layer the trainer cannot run forward on gets its shape in the first training step, as in plain PyTorch.
    wraps_module: ClassVar[bool] = False
    #: What starts more processes of this strategy on a machine without GPUs, where ``devices="auto"``
    #: is one process: the ``geartrain`` command names it then. ``None``: the strategy runs in one
    #: process (or, as ``model_parallel``, needs more than a device count to run on several).
    more_processes: ClassVar[str | None] = None
    #: Lightning's ``strategy.checkpoint_io``: the IO that writes, reads and removes checkpoint files
    #: (``trainer.checkpoint.plugin_io``); the Trainer sets it (geartrain's own unless one is given).
    checkpoint_io: Any = None

    def __init__(
        self,
        precision: str | Precision | None = None,
        device: str | torch.device | None = None,
        *,
        accelerator: Accelerator | None = None,
        checkpoint_io: Any = None,
        precision_plugin: Precision | None = None,
    ):
        self._device = torch.device(device) if device is not None else None
        self._take_lightning_arguments(accelerator, checkpoint_io)
        self.precision: Precision = make_precision(one_precision(precision, precision_plugin), self.root_device.type)
        self.module: nn.Module | None = None  # the user's module after setup
        self.model: nn.Module | None = None  # what forward runs through (a wrapper, or the module)

    @property
    def precision_plugin(self) -> Precision:
        """Lightning's name of :attr:`precision`, the precision plugin (settable: it replaces the plugin)."""
        return self.precision

    @precision_plugin.setter
    def precision_plugin(self, plugin: Precision) -> None:
        self.precision = plugin

    # ----------------------------------------------------------------- topology
    @property
    def root_device(self) -> torch.device:
        """The device this process computes on."""
        if self._device is None:
            self._device = default_device()
        return self._device

    @property
    def world_size(self) -> int:
        """Number of processes taking part in training."""
        return 1

    @property
    def global_rank(self) -> int:
        """This process's rank among all processes."""
        return 0

    @property
    def local_rank(self) -> int:
        """This process's rank on its node."""
        return 0

    @property
    def is_global_zero(self) -> bool:
        """True on the process that writes logs, checkpoints and the console."""
        return self.global_rank == 0

    def configure(self, *, devices: int | str = "auto", num_nodes: int = 1) -> None:
        """Take the Trainer's ``devices``/``num_nodes`` (an instance built by Hydra learns them here).

        ``"auto"`` and 1 keep what the strategy was built with. One-device strategies refuse more.
        """
        if devices not in ("auto", 1, "1") or num_nodes != 1:
            raise ValueError(
                f"{type(self).__name__} runs in one process on one device; got devices={devices!r}, "
                f"num_nodes={num_nodes}. Use strategy='ddp' (or 'fsdp') for more."
            )

    # ----------------------------------------------------------------- lifecycle
    def launch(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in every process this strategy needs; returns rank 0's result.

        The default runs it here, in this process. Multi-process strategies start (or join) their
        workers instead.
        """
        return fn(*args)

    def setup_environment(self) -> None:
        """Prepare this process (process groups, device selection). Called once per ``fit``/``test``."""

    def connect(self, module: TrainModule) -> None:
        """Hand ``module`` what its ``configure_model`` needs (a model-parallel strategy's ``device_mesh``).

        Called before ``configure_model``, after :meth:`setup_environment`. The default (every strategy
        whose parameters are plain tensors) refuses a module that an earlier ``fit`` with FSDP or model
        parallelism sharded in place (its parameters are DTensors, as Lightning leaves them): torch would
        fail deep inside the first forward with "mixed torch.Tensor and DTensor".
        """
        sharded = _sharded_parameter(module)
        if sharded is not None:
            raise UserError(
                f"the module's parameter {sharded!r} is sharded across processes (a DTensor): an earlier fit with "
                f"strategy='fsdp' or 'model_parallel' sharded the module in place, and strategy={self.name!r} "
                "cannot use it. Run this stage with the trainer that fit it, or build a new module and load the "
                "full weights: the checkpoint (Module.load_from_checkpoint(path)), or "
                "trainer.strategy.model_state_dict() called on every rank after fit"
            )
        self._lightning_module = module

    def setup(self, module: TrainModule) -> nn.Module:
        """Place ``module`` on the device (and wrap it where the strategy needs). Returns the module."""
        converted = self.precision.convert_module(module.to(self.root_device))
        self.module = converted
        self.model = converted
        return converted

    def apply_activation_checkpointing(self, module: nn.Module, classes: tuple[type[nn.Module], ...]) -> int:
        """Recompute the activations of ``module``'s ``classes`` submodules in backward; return their count.

        The default gives each such submodule a subclass of its class (same name, same state_dict
        keys) whose ``forward`` runs the original under ``torch.utils.checkpoint.checkpoint``
        (non-reentrant, RNG replayed so dropout masks match). A class, not an instance attribute,
        so DataParallel's replicas and deep copies call their own parameters (but pickling the whole
        module object no longer works; state dicts do). Costs one extra
        forward of those blocks per step. Called before :meth:`setup`, so wrapping strategies (FSDP)
        can override this with their own wrapper. Applying it twice changes nothing.
        """
        count = 0
        for sub in module.modules():
            if isinstance(sub, classes):
                if not getattr(sub, "_geartrain_checkpointed", False):
                    sub.__class__ = _checkpointed_class(type(sub))
                count += 1
        return count

    def compile_model(self, **compile_kwargs: Any) -> None:
        """``torch.compile`` what forward runs through (:attr:`model`), keeping every object's identity.

        The default compiles :attr:`model`'s ``__call__`` in place (``nn.Module.compile``) instead of wrapping it
        in an ``OptimizedModule``: the user's module stays the same object, and its ``state_dict`` keys get no
        ``_orig_mod.`` prefix. A wrapping strategy (DDP) compiles its wrapper the same way, so the wrapper's hooks
        run inside the compiled call. Called once per run, after :meth:`setup`; a model compiled by an earlier
        run (``fit`` then ``test``) is left as it is, so its compiled code is reused instead of compiled again.
        """
        assert self.model is not None, "Strategy.setup() must run before compile_model()"
        if getattr(self.model, "_compiled_call_impl", None) is None:
            self.model.compile(**compile_kwargs)

    def setup_optimizers(self, optimizers: list[torch.optim.Optimizer]) -> list[torch.optim.Optimizer]:
        """Give the strategy a chance to wrap or re-create optimizers (default: unchanged)."""
        return optimizers

    def teardown(self) -> None:
        """Release what :meth:`setup_environment` acquired."""

    def on_exception(self, exception: BaseException) -> None:
        """Lightning's hook: a stage ended with ``exception`` (after the callbacks' ``on_exception``); no-op."""

    # ----------------------------------------------------------------- data
    def process_dataloader(self, dataloader: Iterable[Any], *, train: bool) -> Iterable[Any]:
        """Shard ``dataloader`` across processes where the strategy has several (default: as is)."""
        return dataloader

    def batch_to_device(self, batch: Any) -> Any:
        """Move the tensors nested in ``batch`` to :attr:`root_device` and the precision's dtype."""
        return self.precision.convert_input(move_to_device(batch, self.root_device))

    # ----------------------------------------------------------------- the step
    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        """Context around ``training_step`` and the evaluation steps (autocast under mixed precision)."""
        return self.precision.forward_context()

    def no_backward_sync(self, skip: bool) -> contextlib.AbstractContextManager[Any]:
        """Context that, when ``skip`` is true, defers gradient sync (accumulating micro-batches)."""
        return NULL_CONTEXT

    def step(self, hook: str, *args: Any) -> Any:
        """Call the user's ``hook`` (``"training_step"``, ``"validation_step"``, ...) with ``args``.

        Wrapping strategies (DDP, DataParallel) route this through their wrapper's ``forward`` so the
        wrapper sees the call.
        """
        assert self.module is not None, "Strategy.setup() must run before steps"
        return getattr(self.module, hook)(*args)

    def evaluation_context(self) -> contextlib.AbstractContextManager[None]:
        """Context around a whole evaluation or predict loop (FSDP gathers full weights once here;
        DDP gives every rank rank 0's buffers on entry, see :meth:`sync_buffers`)."""
        return contextlib.nullcontext()

    def sync_buffers(self) -> None:
        """Give every process rank 0's buffers (BatchNorm's running statistics, ...) where they may differ: a
        data-parallel replica updates its own from its own shard. Called by every rank at once (the trainer
        calls it when ``fit``'s loop ends); one process: nothing to do."""

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward of a loss from ``self.manual_backward`` (manual optimisation; may run several times after
        one forward). Default: :meth:`backward`. ``args``/``kwargs`` (``retain_graph=True``) reach ``loss.backward``."""
        self.backward(loss, *args, **kwargs)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backpropagate ``loss`` (scaled under fp16); ``args``/``kwargs`` go to ``loss.backward``."""
        precision = self.precision
        loss = precision.pre_backward(loss, self.module)
        precision.backward(loss, None, None, *args, **kwargs)
        precision.post_backward(loss, self.module)

    def clip_gradients(
        self, optimizer: torch.optim.Optimizer, value: float | None, algorithm: str = "norm"
    ) -> torch.Tensor | None:
        """Unscale gradients (exactly once) and clip them by total ``"norm"`` or by ``"value"``.

        Returns the total norm before clipping for ``"norm"``, else ``None``; ``None`` or ``0`` clips nothing.
        """
        if not value:
            return None
        self.precision.unscale_gradients(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if algorithm == "norm":
            return torch.nn.utils.clip_grad_norm_(params, value)
        if algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, value)
            return None
        raise ValueError(f"gradient_clip_algorithm must be 'norm' or 'value', got {algorithm!r}")

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        """Step ``optimizer``; False when the precision skipped it (fp16 overflow)."""
        return self.precision.step_taken(optimizer, **kwargs)

    # ----------------------------------------------------------------- collectives
    def reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce ``tensor`` over processes with ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``."""
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Stack ``tensor`` from every process along a new first dimension."""
        return tensor.unsqueeze(0)

    def barrier(self, name: str = "") -> None:
        """Wait until every process reaches this point."""

    def gather_object(self, obj: T) -> list[T]:
        """Every process's ``obj``, in rank order, on every process (pickles: not for hot paths)."""
        return [obj]

    def broadcast(self, obj: T, src: int = 0) -> T:
        """Return process ``src``'s ``obj`` on every process."""
        return obj

    # ----------------------------------------------------------------- state
    def model_state_dict(self) -> dict[str, Any]:
        """The full, unwrapped model state dict (no ``module.`` prefixes), as every rank agrees."""
        assert self.module is not None
        return self.module.state_dict()

    def load_model_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Load a full model state dict into the user's module."""
        assert self.module is not None
        load_module_state(self.module, state, strict=strict)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's full state dict (sharded strategies gather it)."""
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Restore one optimizer from :meth:`optimizer_state_dict`'s output (Lightning's
        ``load_optimizer_state_dict(checkpoint)`` calls it for each of the run's optimizers)."""
        optimizer.load_state_dict(state)

    # ----------------------------------------------------------------- sharded state
    def sharded_model_state_dict(self) -> dict[str, Any]:
        """The model state as this rank holds it (DTensor shards where sharded); gathers nothing.

        What a sharded checkpoint directory holds (``trainer.checkpoint.sharded``, with ``state_dict_type = "sharded"``).
        """
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        assert self.module is not None
        state: dict[str, Any] = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=False))
        return state

    def sharded_optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer state as this rank holds it, keyed by parameter name; gathers nothing.

        ``{}`` before its first step, rather than through torch's initialising zero-learning-rate step,
        which would give it state (Adam's ``step``) the uninterrupted run lacks.
        """
        if not optimizer.state:
            return {}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        assert self.module is not None
        options = StateDictOptions(full_state_dict=False)
        state: dict[str, Any] = get_optimizer_state_dict(self.module, optimizer, options=options)
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.root_device}, precision={self.precision.name!r})"


_CHECKPOINTED: dict[type[nn.Module], type[nn.Module]] = {}


def _checkpointed_class(cls: type[nn.Module]) -> type[nn.Module]:
    """``cls`` with a forward that recomputes its activations in backward (made once per class)."""
    if cls not in _CHECKPOINTED:

        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            from torch.utils.checkpoint import checkpoint

            return checkpoint(cls.forward, self, *args, use_reentrant=False, **kwargs)

        attrs = {"forward": forward, "_geartrain_checkpointed": True, "__module__": cls.__module__}
        _CHECKPOINTED[cls] = type(cls.__name__, (cls,), {**attrs, "__qualname__": cls.__qualname__})
    return _CHECKPOINTED[cls]


def _sharded_parameter(module: nn.Module) -> str | None:
    """The name of ``module``'s first DTensor parameter, else None (no DTensor exists before torch's module is imported)."""
    tensor_module = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(tensor_module, "DTensor", None)
    if dtensor is None:
        return None
    for name, parameter in module.named_parameters():
        if isinstance(parameter, dtensor):
            return name
    return None
