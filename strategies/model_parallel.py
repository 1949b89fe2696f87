"""Tensor and 2-D parallelism: a (data-parallel x tensor-parallel) ``DeviceMesh`` for ``configure_model``.

The user parallelises the model in ``configure_model`` with PyTorch's own tools, as torchtitan does:
``parallelize_module`` with a tensor-parallel plan over ``self.device_mesh["tensor_parallel"]``, then
``fully_shard`` over ``self.device_mesh["data_parallel"]``. The strategy builds the mesh, materialises
a model built on the meta device, shards the data over the data-parallel dimension only (the ranks of
one tensor-parallel group see the same batches), reduces logged values over it, and clips gradients
that live on several meshes. Everything else (launch, evaluation, sharded or full checkpoints) is FSDP's.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
import torch.distributed as dist
from torch import nn
from typing_extensions import override

from strategies.fsdp import FSDPStrategy
from strategies.materialize import has_meta_tensors, materialize_meta_module
from strategies.precision import Precision
from trainer.common.errors import ConfigError

if TYPE_CHECKING:
    from trainer.module import TrainModule

__all__ = ["ModelParallelStrategy"]

MESH_DIMS = ("data_parallel", "tensor_parallel")


def _size(name: str, value: int | str) -> int | Literal["auto"]:
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be 'auto' or an int >= 1, got {value!r}")
    return value


class ModelParallelStrategy(FSDPStrategy):
    """Lightning's ``ModelParallelStrategy``: 2-D parallelism the module applies in ``configure_model``.

    Args:
        data_parallel_size: ranks in a data-parallel group; ``"auto"`` is the number of nodes.
        tensor_parallel_size: ranks in a tensor-parallel group; ``"auto"`` is the processes per node.
        save_distributed_checkpoint: ``True``: each rank writes its own shards into a checkpoint
            directory (``torch.distributed.checkpoint``; it loads on any mesh, world size or strategy);
            ``False``: the full weights and optimizer state gathered on rank 0 into one file.
        process_group_backend, timeout: as for :class:`~strategies.DDPStrategy`.
        devices, num_nodes, precision, device, max_restarts: geartrain's (set by the Trainer).

    ``configure_model`` must be overridden (Lightning's rule). With more than one data-parallel rank
    it must apply ``fully_shard`` (otherwise gradients would not be averaged over those ranks); apply
    it to submodules (``self.model``), not to the ``TrainModule`` itself, whose ``training_step`` is
    not a forward call. Mixed precision is the precision plugin's autocast, as in Lightning; pass a
    ``MixedPrecisionPolicy`` to your ``fully_shard`` to all-gather in low precision instead.
    """

    name = "model_parallel"
    #: Several processes need a model whose ``configure_model`` parallelises it, not a device count only.
    more_processes: ClassVar[str | None] = None

    def __init__(
        self,
        data_parallel_size: int | Literal["auto"] = "auto",
        tensor_parallel_size: int | Literal["auto"] = "auto",
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: float | timedelta = timedelta(minutes=30),
        *,
        devices: int | str = "auto",
        num_nodes: int = 1,
        precision: str | Precision = "32-true",
        device: str | torch.device | None = None,
        max_restarts: int = 0,
    ) -> None:
        self.data_parallel_size = _size("data_parallel_size", data_parallel_size)
        self.tensor_parallel_size = _size("tensor_parallel_size", tensor_parallel_size)
        self.save_distributed_checkpoint = bool(save_distributed_checkpoint)
        super().__init__(
            devices=devices,
            num_nodes=num_nodes,
            precision=precision,
            device=device,
            process_group_backend=process_group_backend,
            timeout=timeout,
            max_restarts=max_restarts,
            state_dict_type="sharded" if save_distributed_checkpoint else "full",
        )

    @override
    def _sharded_precision(self, precision: Precision) -> Precision:
        return precision  # autocast, as Lightning; the user's fully_shard chooses its own policy

    @override
    def _check_process_count(self) -> None:
        """Also refuse a mesh that does not fit the processes, before any is started (not inside each)."""
        super()._check_process_count()
        self.mesh_shape()

    def mesh_shape(self) -> tuple[int, int]:
        """``(data_parallel_size, tensor_parallel_size)`` with ``"auto"`` resolved; their product is the world."""
        processes = self.world_size // max(self.num_nodes, 1)
        dp = self.num_nodes if self.data_parallel_size == "auto" else self.data_parallel_size
        tp = processes if self.tensor_parallel_size == "auto" else self.tensor_parallel_size
        if self.tensor_parallel_size == "auto" and self.data_parallel_size != "auto":
            tp = self.world_size // dp
        if self.data_parallel_size == "auto" and self.tensor_parallel_size != "auto":
            dp = self.world_size // tp
        if dp * tp != self.world_size:
            raise ConfigError(
                f"ModelParallelStrategy: data_parallel_size={self.data_parallel_size!r} x tensor_parallel_size="
                f"{self.tensor_parallel_size!r} gives {dp} x {tp} = {dp * tp} ranks, but {self.world_size} "
                "processes run; choose sizes whose product is devices x num_nodes"
            )
        return dp, tp

    @property
    @override
    def device_mesh(self) -> Any:
        """The 2-D ``DeviceMesh`` with dimensions ``("data_parallel", "tensor_parallel")``."""
        if self._device_mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._device_mesh = init_device_mesh(self.root_device.type, self.mesh_shape(), mesh_dim_names=MESH_DIMS)
        return self._device_mesh

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """Data is sharded over the data-parallel dimension: a tensor-parallel group shares its batches."""
        dp_mesh = self.device_mesh["data_parallel"]
        return {"num_replicas": dp_mesh.size(), "rank": dp_mesh.get_local_rank()}

    @override
    def setup(self, module: TrainModule) -> nn.Module:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

        if self.module is module and self.model is not None:
            return module
        if getattr(type(module).configure_model, "__qualname__", "") == "ModelDefaults.configure_model":
            raise TypeError(
                f"When using the {type(self).__name__}, you are required to override the `configure_model()` "
                "hook in the TrainModule and apply parallelization there (parallelize_module over "
                "self.device_mesh['tensor_parallel'], fully_shard over self.device_mesh['data_parallel'])."
            )
        if any(isinstance(m, FullyShardedDataParallel) for m in module.modules()):
            raise TypeError(
                "Found modules wrapped in torch.distributed.fsdp.FullyShardedDataParallel (FSDP1); "
                f"{type(self).__name__} works with FSDP2's fully_shard only"
            )
        dp, _ = self.mesh_shape()
        sharded: list[nn.Module] = [m for m in module.modules() if isinstance(m, FSDPModule)]
        if dp > 1 and not sharded:
            raise RuntimeError(
                f"{type(self).__name__} has {dp} data-parallel ranks, but configure_model applied no fully_shard: "
                "gradients would not be averaged over them. Call fully_shard(..., mesh=self.device_mesh"
                "['data_parallel']) on the model, or set data_parallel_size=1"
            )
        if isinstance(module, FSDPModule):
            raise TypeError(
                "configure_model applied fully_shard to the TrainModule itself; apply it to its submodules "
                "(e.g. fully_shard(self.model, ...)): training_step is not a forward call, so the root's "
                "parameters would never be gathered"
            )
        if has_meta_tensors(module):
            materialize_meta_module(module, self.root_device)
        converted = self.precision.convert_module(module.to(self.root_device))
        self._sharded = sharded
        self.module = converted
        self.model = converted
        return converted

    @override
    def step(self, hook: str, *args: Any) -> Any:
        assert self.module is not None
        return getattr(self.module, hook)(*args)

    @override
    def reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Sums and means over the data-parallel ranks (a tensor-parallel group holds one value, not
        several); max and min over every rank (votes such as preemption must reach all)."""
        if op not in ("sum", "mean") or not dist.is_initialized() or self._device_mesh is None:
            return super().reduce(tensor, op)
        dp_mesh = self._device_mesh["data_parallel"]
        if dp_mesh.size() == 1:
            return tensor
        out = tensor.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=dp_mesh.get_group())
        return out / dp_mesh.size() if op == "mean" else out

    @override
    def clip_gradients(
        self, optimizer: torch.optim.Optimizer, value: float | None, algorithm: str = "norm"
    ) -> torch.Tensor | None:
        """Clip by the norm of all gradients, whose DTensors may live on different meshes.

        Tensor-parallel layers' gradients live on the 2-D mesh, the others' on the data-parallel one;
        ``clip_grad_norm_`` cannot stack their norms, so each mesh's norm is made whole first.
        """
        if not value or algorithm != "norm":
            return super().clip_gradients(optimizer, value, algorithm)
        from torch.distributed.tensor import DTensor

        self.precision.unscale_gradients(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        by_mesh: dict[Any, list[torch.Tensor]] = {}
        for p in params:
            grad = p.grad
            assert grad is not None
            by_mesh.setdefault(grad.device_mesh if isinstance(grad, DTensor) else None, []).append(grad)
        norms = []
        for grads in by_mesh.values():
            norm = torch.nn.utils.get_total_norm(grads)
            norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        total = torch.linalg.vector_norm(torch.stack(norms))
        coef = torch.clamp(value / (total + 1e-6), max=1.0)  # clip_grads_with_norm_'s rule
        with torch.no_grad():
            # Each shard scaled in place: a DTensor cannot be multiplied by a plain tensor.
            local = [g.to_local() if isinstance(g, DTensor) else g for grads in by_mesh.values() for g in grads]
            torch._foreach_mul_(local, coef)
        return total
