"""Fully sharded data parallel (FSDP2): parameters, gradients and optimizer state split over ranks."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn
from typing_extensions import override

from strategies import fsdp_lightning as lightning
from strategies.fsdp_precision import as_sharded_precision, mixed_precision_policy
from strategies.materialize import has_meta_tensors, materialize_meta_module
from strategies.parallel import ParallelStrategy, StepRunner
from strategies.precision import Precision
from trainer.common.state_dict import strip_wrapper_prefixes

if TYPE_CHECKING:
    from trainer.module import TrainModule

__all__ = ["FSDPStrategy"]

_MIN_TORCH = (2, 9)


class FSDPStrategy(ParallelStrategy):
    """Shard every block of the module (and the rest at the root) over the ranks with ``fully_shard``.

    Each rank stores 1/N of every parameter, its gradient and its optimizer state; a block's full
    weights are all-gathered just before its forward and backward and freed after. Checkpoints are
    sharded directories by default (``state_dict_type``). Launch and data sharding work as for :class:`~strategies.DDPStrategy`.

    Args:
        devices, num_nodes, precision, device, process_group_backend, timeout: as for DDP.
        layer_classes: the blocks to shard on their own: classes, or class names (``"Block"``,
            ``"torch.nn.Linear"``). Default: every item of every ``nn.ModuleList`` (the layers of a
            transformer); everything else is sharded with the root.
        reshard_after_forward: free gathered weights after forward (saves memory, gathers again in
            backward); an int reshards to that many ranks instead (FSDP2's hybrid option).
        cpu_offload: keep the sharded parameters, gradients and optimizer state in host memory
            (``CPUOffloadPolicy``); the optimizer steps on the CPU. Lightning's name: a bool or FSDP1's
            ``CPUOffload(offload_params=...)``, read back as a ``CPUOffload``.
        state_dict_type: ``"sharded"`` (the default, as Lightning's): each rank writes its own shards
            into a checkpoint directory with ``torch.distributed.checkpoint``, and no rank ever holds
            the whole model or optimizer; the directory loads under any strategy and world size
            (docs/checkpoints.md, "Sharded checkpoints"). ``"full"``: the full weights and optimizer
            state gathered on rank 0 into one file.
        accelerator, parallel_devices, cluster_environment, checkpoint_io, precision_plugin: as for DDP.
        sharding_strategy, mixed_precision, activation_checkpointing_policy, auto_wrap_policy,
            use_orig_params: Lightning's FSDP1 arguments, translated to FSDP2 by
            :mod:`strategies.fsdp_lightning` (``FULL_SHARD``/``SHARD_GRAD_OP`` set ``reshard_after_forward``,
            ``auto_wrap_policy`` sets ``layer_classes``); those FSDP2 cannot honour raise, naming the alternative.

    Mixed precision is FSDP2's ``MixedPrecisionPolicy`` (:mod:`strategies.fsdp_precision`):
    ``"bf16-mixed"`` all-gathers bfloat16 parameters and computes in bfloat16 without autocast, while
    the sharded master weights, reduced gradients and optimizer state stay float32.

    ``configure_model`` runs with :attr:`device_mesh` set on the module and may build the model on
    the meta device; each block is then sharded and materialised (:mod:`strategies.materialize`), so
    the whole model never exists on one rank. Blocks the user already sharded there are left as they are.

    ``precision="16-mixed"`` works with the ordinary ``GradScaler``: its inf/NaN check on sharded
    (DTensor) gradients is reduced over the ranks, so all ranks skip an overflowing step together.

    Raises:
        RuntimeError: on torch older than 2.9, whose gloo backend averages gradients wrongly.
    """

    name = "fsdp"
    wraps_module: ClassVar[bool] = True
    more_processes: ClassVar[str | None] = "trainer.devices=2"
    aliases: ClassVar[dict[str, dict[str, Any]]] = {"fsdp_cpu_offload": {"cpu_offload": True}}
    # FSDP gathers and frees parameters around evaluation forwards; under inference_mode the gathered
    # tensors would be inference tensors it cannot reshard, so evaluation runs under no_grad.
    supports_inference_mode = False

    def __init__(
        self,
        devices: int | str = "auto",
        num_nodes: int = 1,
        precision: str | Precision = "32-true",
        device: str | torch.device | None = None,
        process_group_backend: str | None = None,
        timeout: float | timedelta = timedelta(minutes=30),
        max_restarts: int = 0,
        layer_classes: Iterable[type[nn.Module] | str] | None = None,
        reshard_after_forward: bool | int = True,
        cpu_offload: bool | Any = False,
        state_dict_type: str = "sharded",
        *,
        accelerator: Any = None,
        parallel_devices: Sequence[torch.device] | None = None,
        cluster_environment: Any = None,
        checkpoint_io: Any = None,
        precision_plugin: Precision | None = None,
        sharding_strategy: Any = None,
        mixed_precision: Any = None,
        activation_checkpointing_policy: Any = None,
        **kwargs: Any,
    ) -> None:
        if state_dict_type not in ("sharded", "full"):
            raise ValueError(f"FSDPStrategy(state_dict_type=...) must be 'sharded' or 'full', got {state_dict_type!r}")
        version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
        if version < _MIN_TORCH:
            raise RuntimeError(
                f"FSDPStrategy needs torch >= 2.9 (found {torch.__version__}): earlier releases average "
                "gradients wrongly over gloo. Upgrade torch, or use strategy='ddp'."
            )
        super().__init__(
            devices=devices,
            num_nodes=num_nodes,
            precision=precision,
            device=device,
            process_group_backend=process_group_backend,
            timeout=timeout,
            max_restarts=max_restarts,
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self.kwargs = self._lightning_kwargs(kwargs)
        if "auto_wrap_policy" in self.kwargs and layer_classes is None:
            layer_classes = lightning.activation_checkpointing_classes(
                self.kwargs["auto_wrap_policy"], "auto_wrap_policy"
            )
        self.layer_classes = list(layer_classes) if layer_classes is not None else None
        if not isinstance(reshard_after_forward, bool) and reshard_after_forward < 1:
            raise ValueError(f"reshard_after_forward must be a bool or a rank count >= 1, got {reshard_after_forward}")
        self.sharding_strategy: Any = None  # Lightning's ShardingStrategy, read back as given
        if sharding_strategy is not None:
            if reshard_after_forward is not True:
                raise ValueError("FSDPStrategy: give sharding_strategy or reshard_after_forward, not both")
            self.sharding_strategy, reshard_after_forward = lightning.sharding_strategy(sharding_strategy)
        else:
            self.sharding_strategy = _sharding_strategy_of(reshard_after_forward)
        self.reshard_after_forward = reshard_after_forward
        self.cpu_offload = lightning.cpu_offload_config(cpu_offload)
        self.mixed_precision = mixed_precision
        self._mixed_precision_policy = lightning.fsdp2_mixed_precision(mixed_precision)
        self._checkpointed: tuple[type[nn.Module], ...] = ()
        if activation_checkpointing_policy is not None:
            self._checkpointed = lightning.activation_checkpointing_classes(
                activation_checkpointing_policy, "activation_checkpointing_policy"
            )
        self.state_dict_type = state_dict_type
        self._sharded: list[nn.Module] = []
        self._device_mesh: Any = None

    @property
    def precision(self) -> Precision:
        """The precision plugin; autocast mixed precision is replaced by FSDP2's policy (see the class)."""
        return self._precision

    @precision.setter
    def precision(self, value: Precision) -> None:
        self._precision = self._sharded_precision(value)

    def _sharded_precision(self, precision: Precision) -> Precision:
        return as_sharded_precision(precision)

    @property
    def mixed_precision_config(self) -> Any:
        """Lightning's name: the ``mixed_precision`` given, else FSDP2's policy for the precision plugin."""
        return self.mixed_precision if self.mixed_precision is not None else mixed_precision_policy(self.precision)

    @staticmethod
    def _lightning_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
        """Lightning's extra FSDP keyword arguments that FSDP2 honours; any other is refused by name."""
        unknown = sorted(set(kwargs) - {"use_orig_params", "auto_wrap_policy"})
        if unknown:
            raise TypeError(
                f"FSDPStrategy got FSDP1 keyword arguments {unknown} that geartrain's FSDP2 strategy has no "
                "equivalent for; use layer_classes, reshard_after_forward, cpu_offload or mixed_precision, "
                "or ModelParallelStrategy to call fully_shard yourself"
            )
        return {**kwargs, "use_orig_params": lightning.use_orig_params(kwargs.get("use_orig_params", True))}

    @property
    def device_mesh(self) -> Any:
        """The ranks' ``DeviceMesh`` (one dimension), made on first use after the process group exists."""
        if self._device_mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._device_mesh = init_device_mesh(self.root_device.type, (self.world_size,))
        return self._device_mesh

    @override
    def connect(self, module: TrainModule) -> None:
        module.device_mesh = self.device_mesh
        self._lightning_module = module

    def _shard_options(self) -> dict[str, Any]:
        """``fully_shard``'s keyword arguments from this strategy's options and precision."""
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

        policy = self._mixed_precision_policy
        return {
            "reshard_after_forward": self.reshard_after_forward,
            "mp_policy": policy if policy is not None else mixed_precision_policy(self.precision),
            # Pinned host memory needs an accelerator; on a CPU-only machine the policy cannot pin.
            "offload_policy": (
                CPUOffloadPolicy(pin_memory=self.root_device.type == "cuda")
                if self.cpu_offload.offload_params
                else OffloadPolicy()
            ),
        }

    def _blocks(self, module: nn.Module) -> list[nn.Module]:
        """The submodules to shard as units, in ``modules()`` order (outer blocks before inner ones)."""
        if self.layer_classes is None:
            return [item for m in module.modules() if isinstance(m, nn.ModuleList) for item in m]
        wanted = self.layer_classes

        def matches(m: nn.Module) -> bool:
            cls = type(m)
            for w in wanted:
                if isinstance(w, str):
                    if w in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}"):
                        return True
                elif isinstance(m, w):
                    return True
            return False

        return [m for m in module.modules() if m is not module and matches(m)]

    @override
    def setup(self, module: TrainModule) -> nn.Module:
        from torch.distributed.fsdp import FSDPModule, fully_shard

        if self.module is module and self.model is not None:
            return module  # sharded by an earlier stage (fit, then validate): fully_shard applies once
        if self._checkpointed:  # Lightning's activation_checkpointing_policy: the Trainer option's mechanism
            self.apply_activation_checkpointing(module, self._checkpointed)
        on_meta = has_meta_tensors(module)
        # A module on the meta device stays there until sharded: only its shards are ever allocated.
        converted = self.precision.convert_module(module if on_meta else module.to(self.root_device))
        mesh, options = self.device_mesh, self._shard_options()
        own = [m for m in converted.modules() if isinstance(m, FSDPModule)]  # sharded in configure_model
        blocks = [b for b in self._blocks(converted) if not isinstance(b, FSDPModule)]
        # Children before parents: a block nested in another block must be sharded first.
        for block in reversed(blocks):
            fully_shard(block, mesh=mesh, **options)
        # The runner is the root: calling it gathers the parameters that belong to no block, so
        # training_step (not only forward) can use them.
        runner = StepRunner(converted)
        fully_shard(runner, mesh=mesh, **options)
        if on_meta:
            materialize_meta_module(converted, self.root_device)
        self._sharded = [*own, *blocks, runner]
        self.module = converted
        self.model = runner
        return converted

    @override
    def step(self, hook: str, *args: Any) -> Any:
        assert self.model is not None
        return self.model(hook, *args)

    @override
    def no_backward_sync(self, skip: bool) -> contextlib.AbstractContextManager[None]:
        return self._gradient_sync(not skip)

    @contextlib.contextmanager
    def _gradient_sync(self, enabled: bool) -> Iterator[None]:
        if enabled or not self._sharded:
            yield
            return
        for m in self._sharded:
            m.set_requires_gradient_sync(False, recurse=False)  # type: ignore[operator]
        try:
            yield
        finally:
            for m in self._sharded:
                m.set_requires_gradient_sync(True, recurse=False)  # type: ignore[operator]

    @override
    @contextlib.contextmanager
    def evaluation_context(self) -> Iterator[None]:
        """Gather the full weights once for the whole loop, so evaluation steps run no collectives.

        Evaluation shards may differ by a batch between ranks (no padded duplicates); an all-gather
        per forward would then wait forever on the rank that has finished.
        """
        modules = self._sharded
        # Each module's own setting is put back afterwards: an int (reshard to fewer ranks) or what a
        # user chose in configure_model, which FSDP2's public setter (bools only) cannot restore.
        saved = [_reshard_setting(m) for m in modules]
        for m in modules:
            m.set_reshard_after_forward(False, recurse=False)  # type: ignore[operator]
            m.unshard()  # type: ignore[operator]
        try:
            yield
        finally:
            for m, setting in zip(modules, saved, strict=True):
                m.reshard()  # type: ignore[operator]
                _restore_reshard_setting(m, setting)

    @override
    def clip_gradients(
        self, optimizer: torch.optim.Optimizer, value: float | None, algorithm: str = "norm"
    ) -> torch.Tensor | None:
        norm = super().clip_gradients(optimizer, value, algorithm)
        full_tensor = getattr(norm, "full_tensor", None)  # the norm of sharded gradients is a DTensor
        return full_tensor() if callable(full_tensor) else norm

    # ----------------------------------------------------------------- full state
    def _options(self, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, **kwargs)

    @override
    def model_state_dict(self) -> dict[str, Any]:
        """The full weights on rank 0 (an empty dict on the others); a collective."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        assert self.module is not None
        state: dict[str, Any] = get_model_state_dict(self.module, options=self._options(cpu_offload=True))
        return state

    @override
    def load_model_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        assert self.module is not None
        set_model_state_dict(self.module, strip_wrapper_prefixes(state), options=self._options(strict=strict))

    @override
    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The full optimizer state in ``optimizer.state_dict()``'s own layout (parameters by index).

        That layout, not FSDP's parameter names, is what every other strategy saves, so a checkpoint
        written under FSDP resumes under DDP or one device and the other way round.
        """
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        assert self.module is not None
        named: dict[str, Any] = get_optimizer_state_dict(
            self.module, optimizer, options=self._options(cpu_offload=True)
        )
        if not named:
            return named  # ranks other than 0
        index = {name: i for i, name in enumerate(self._param_names(optimizer))}
        return {
            "state": {index[name]: value for name, value in named["state"].items()},
            "param_groups": [
                {**group, "params": [index[name] for name in group["params"]]} for group in named["param_groups"]
            ],
        }

    @override
    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        assert self.module is not None
        names = self._param_names(optimizer)
        named: dict[str, Any] = {
            "state": {names[int(i)]: value for i, value in state["state"].items()},
            "param_groups": [
                {**group, "params": [names[int(i)] for i in group["params"]]} for group in state["param_groups"]
            ],
        }
        set_optimizer_state_dict(self.module, optimizer, named, options=self._options())

    def _param_names(self, optimizer: torch.optim.Optimizer) -> list[str]:
        """Names of the optimizer's parameters in the order ``optimizer.state_dict()`` numbers them."""
        assert self.module is not None
        by_id = {id(p): name for name, p in self.module.named_parameters()}
        return [by_id[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _sharding_strategy_of(reshard_after_forward: bool | int) -> Any:
    """Lightning's ``ShardingStrategy`` that ``reshard_after_forward`` matches (``None`` for a rank count)."""
    from torch.distributed.fsdp import ShardingStrategy

    if reshard_after_forward is True:
        return ShardingStrategy.FULL_SHARD
    return ShardingStrategy.SHARD_GRAD_OP if reshard_after_forward is False else None


def _reshard_setting(module: nn.Module) -> tuple[Any, list[Any]]:
    """What ``set_reshard_after_forward`` overwrites on one FSDP module (FSDP2's internals, read only here)."""
    state = module._get_fsdp_state()  # type: ignore[operator]
    return state._auto_reshard_after_forward, [group.post_forward_mesh_info for group in state._fsdp_param_groups]


def _restore_reshard_setting(module: nn.Module, setting: tuple[Any, list[Any]]) -> None:
    state = module._get_fsdp_state()  # type: ignore[operator]
    state._auto_reshard_after_forward = setting[0]
    for group, info in zip(state._fsdp_param_groups, setting[1], strict=True):
        group.post_forward_mesh_info = info
