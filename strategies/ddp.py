"""DistributedDataParallel: one process per device, gradients averaged by all-reduce during backward."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from strategies.accelerators import Accelerator
from strategies.launch import DEFAULT_GRACE_PERIOD
from strategies.parallel import ParallelStrategy, StepRunner
from strategies.precision import Precision

if TYPE_CHECKING:
    from trainer.module import TrainModule

__all__ = ["DDPStrategy"]


class DDPStrategy(ParallelStrategy):
    """Data parallel training in ``devices * num_nodes`` processes with ``DistributedDataParallel``.

    Each process holds a full replica and trains on its shard of every batch; DDP averages the
    gradients in buckets while backward runs, so every replica takes the same optimizer step. On one
    machine ``Trainer(strategy="ddp", devices=N).fit(...)`` starts the N processes itself; under
    ``torchrun`` or ``srun`` it joins the processes that exist.

    Args:
        devices: processes per node; ``"auto"``: one per GPU, or 1 on a CPU-only machine.
        num_nodes: machines taking part.
        precision: precision name or plugin (``"bf16-mixed"`` etc. compose with DDP).
        device: ``"cpu"`` or ``"cuda"`` (default: CUDA when available).
        process_group_backend: default ``"nccl"`` on CUDA, ``"gloo"`` on CPU.
        timeout: collective timeout (seconds or ``timedelta``).
        find_unused_parameters: let DDP handle parameters that get no gradient in some steps (costs
            a graph traversal per step).
        static_graph: the set of used parameters never changes; enables DDP's static-graph
            optimisations.
        gradient_as_bucket_view: gradients are views into DDP's communication buckets (saves one
            copy of the gradients in memory).
        start_method: how the strategy starts its own processes: ``"popen"`` (``strategy="ddp"``: the
            other ranks run the script again), ``"spawn"`` (``"ddp_spawn"``: pickled into new
            processes) or ``"fork"`` (``"ddp_fork"``/``"ddp_notebook"``).
        preemption_grace_period: seconds the processes the strategy started get to save after a signal
            (see :class:`~strategies.parallel.ParallelStrategy`).
        accelerator, parallel_devices, cluster_environment, checkpoint_io, precision_plugin: Lightning's
            arguments: an accelerator object sets the device kind, ``parallel_devices`` the kind and the
            process count (process i on device i), ``precision_plugin`` is ``precision``; the other two are
            kept for the plugins that read them.
        kwargs: further arguments of torch's ``DistributedDataParallel`` (``bucket_cap_mb=...``), as in Lightning.

    >>> DDPStrategy(devices=2, device="cpu")
    DDPStrategy(devices=2, num_nodes=1, precision='32-true')
    """

    name = "ddp"
    wraps_module: ClassVar[bool] = True
    more_processes: ClassVar[str | None] = "trainer.devices=2"
    aliases: ClassVar[dict[str, dict[str, Any]]] = {
        "ddp_spawn": {"start_method": "spawn"},
        "ddp_fork": {"start_method": "fork"},
        "ddp_notebook": {"start_method": "fork"},
        **{
            f"{base}_find_unused_parameters_{flag}": {**implied, "find_unused_parameters": flag == "true"}
            for base, implied in (
                ("ddp", {"start_method": "popen"}),
                ("ddp_spawn", {"start_method": "spawn"}),
                ("ddp_fork", {"start_method": "fork"}),
                ("ddp_notebook", {"start_method": "fork"}),
            )
            for flag in ("true", "false")
        },
    }

    def __init__(
        self,
        devices: int | str = "auto",
        num_nodes: int = 1,
        precision: str | Precision = "32-true",
        device: str | torch.device | None = None,
        process_group_backend: str | None = None,
        timeout: float | timedelta = timedelta(minutes=30),
        max_restarts: int = 0,
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
        start_method: str = "popen",
        preemption_grace_period: float = DEFAULT_GRACE_PERIOD,
        *,
        accelerator: Accelerator | None = None,
        parallel_devices: Sequence[torch.device] | None = None,
        cluster_environment: Any = None,
        checkpoint_io: Any = None,
        precision_plugin: Precision | None = None,
        **kwargs: Any,
    ) -> None:
        unknown = sorted(set(kwargs) - set(inspect.signature(DistributedDataParallel).parameters) - {"module"})
        if unknown or "module" in kwargs:
            raise TypeError(
                f"DDPStrategy got {', '.join(unknown or ['module'])}: its other keyword arguments go to "
                "torch's DistributedDataParallel, which has no such argument (DDP communication hooks and "
                "model averaging are not offered)"
            )
        super().__init__(
            devices=devices,
            num_nodes=num_nodes,
            precision=precision,
            device=device,
            process_group_backend=process_group_backend,
            timeout=timeout,
            max_restarts=max_restarts,
            start_method=start_method,
            preemption_grace_period=preemption_grace_period,
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self.ddp_kwargs: dict[str, Any] = {
            **kwargs,
            "find_unused_parameters": find_unused_parameters,
            "static_graph": static_graph,
            "gradient_as_bucket_view": gradient_as_bucket_view,
        }

    @override
    def setup(self, module: TrainModule) -> nn.Module:
        converted = self.precision.convert_module(module.to(self.root_device))
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        self.module = converted
        # DDP broadcasts rank 0's parameters here, so every replica starts from the same weights.
        self.model = DistributedDataParallel(StepRunner(converted), device_ids=device_ids, **self.ddp_kwargs)
        return converted

    @override
    def step(self, hook: str, *args: Any) -> Any:
        """Training steps run through DDP's forward (which arms the gradient all-reduce).

        Evaluation steps call the module directly: they need no gradient sync, and a forward through
        DDP may broadcast buffers, a collective that would wait forever on a rank whose (unpadded)
        evaluation shard has one batch fewer. That broadcast is made once instead, as the evaluation
        loop starts (:meth:`sync_buffers`).
        """
        assert self.module is not None and self.model is not None
        if hook == "training_step":
            return self.model(hook, *args)
        return getattr(self.module, hook)(*args)

    @override
    def sync_buffers(self) -> None:
        """Broadcast rank 0's buffers when DDP would at its next forward, as Lightning's ranks get them.

        DDP broadcasts buffers at the start of a forward that follows a synced training forward (or
        none yet). Lightning's evaluation steps go through that forward, so its ranks evaluate with rank
        0's BatchNorm statistics and keep them. Ours call the module directly (a rank may have one
        evaluation batch fewer), so this broadcast is made once, where every rank arrives: on entering
        an evaluation loop and when ``fit``'s loop ends. It then counts as that forward's broadcast:
        the next training forward makes none, as after Lightning's evaluation forward.
        """
        model = self.model
        if isinstance(model, DistributedDataParallel) and model.will_sync_module_buffers():
            model._sync_buffers()  # DDP's own broadcast: its buffer list, ignored names, source rank 0
            model.require_forward_param_sync = False

    @override
    @contextlib.contextmanager
    def evaluation_context(self) -> Iterator[None]:
        self.sync_buffers()
        yield

    @override
    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Each manual backward gets DDP's reducer ready for it.

        DDP prepares its gradient all-reduce once per forward (from the forward's output). Manual
        optimisation may run several backwards after one ``training_step`` (a GAN: the generator's loss,
        then the discriminator's), each reaching other parameters; with ``find_unused_parameters`` the
        reducer must learn, per backward, which parameters this loss does not reach.
        """
        model = self.model
        if isinstance(model, DistributedDataParallel) and torch.is_grad_enabled() and model.require_backward_grad_sync:
            from torch.nn.parallel.distributed import _find_tensors

            model.require_forward_param_sync = True
            unused_search = model.find_unused_parameters and not model.static_graph
            model.reducer._rebuild_buckets()
            model.reducer.prepare_for_backward(list(_find_tensors(loss)) if unused_search else [])
        self.backward(loss, *args, **kwargs)

    @override
    def no_backward_sync(self, skip: bool) -> contextlib.AbstractContextManager[None]:
        if skip and isinstance(self.model, DistributedDataParallel):
            return self.model.no_sync()
        return contextlib.nullcontext()
