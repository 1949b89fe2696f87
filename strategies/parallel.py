"""What DDP and FSDP share: one process per device, a process group, collectives and sharded data.

A subclass says only how the module is wrapped (:meth:`Strategy.setup`) and how gradient sync is
deferred (:meth:`Strategy.no_backward_sync`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any, ClassVar, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, Sampler, SequentialSampler
from typing_extensions import override

from strategies import environments, relaunch
from strategies.accelerators import Accelerator, from_parallel_devices
from strategies.base import Strategy
from strategies.launch import DEFAULT_GRACE_PERIOD, check_slurm_launched, joined_environment, start_processes
from strategies.lightning_names import LightningParallelNames
from strategies.precision import Precision
from strategies.rank_process import flush_files_at_exit, join_group, record_errors
from strategies.sampling import EvalShardSampler, EvenEnd, GlobalBatchSampler, ShardedBatchSampler, ShardedSampler
from trainer.common.env import seed_from_env
from trainer.common.errors import UserError
from trainer.common.loaders import rebuild_dataloader

__all__ = ["EvalShardSampler", "ParallelStrategy", "StepRunner"]

T = TypeVar("T")

#: On CPU, a strategy that starts its own processes starts at most this many per core.
CPU_PROCESSES_PER_CORE = 4

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


class StepRunner(nn.Module):
    """A module whose ``forward(hook, *args)`` calls ``module.<hook>(*args)``.

    DDP and FSDP act in their wrapper's ``forward`` (DDP prepares the gradient all-reduce there, FSDP
    gathers parameters), while the user's code lives in ``training_step``. Wrapping this runner
    instead of the module makes the wrapper see every step.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    @override
    def forward(self, hook: str, *args: Any) -> Any:
        return getattr(self.module, hook)(*args)


class ParallelStrategy(LightningParallelNames, Strategy):
    """Base of the multi-process strategies: one process per device, ``devices * num_nodes`` in all.

    Args:
        devices: processes per node; ``"auto"`` is the number of GPUs, or 1 on a CPU-only machine.
        num_nodes: machines taking part (start them with ``torchrun`` or ``srun``).
        precision: a precision name or plugin.
        device: ``"cpu"`` or ``"cuda"`` to choose the kind of device; the index is the local rank.
        process_group_backend: ``"gloo"`` or ``"nccl"``; default nccl on CUDA, gloo on CPU.
        timeout: how long a collective may wait (seconds or a ``timedelta``) before it errors.
        max_restarts: when the strategy starts its own processes, restart the whole group this many
            times after a worker fails; training resumes from the last checkpoint (under ``torchrun``
            use its ``--max-restarts``: the resume is the same).
        start_method: ``"popen"`` (``ddp``: this process is rank 0, the others run the script again;
            :mod:`strategies.relaunch`), ``"spawn"`` (``ddp_spawn``: pickled into new interpreters) or
            ``"fork"`` (``ddp_fork``/``ddp_notebook``). ``max_restarts`` > 0 spawns (the elastic engine).
        preemption_grace_period: when the strategy starts its own processes and a signal (SIGTERM,
            SIGINT, SIGHUP, SIGUSR1) reaches the launcher: seconds the processes get to finish their
            step, save ``last.ckpt`` and exit before they are killed (docs/checkpoints.md, "Signals
            and exit codes"). Under ``torchrun``/``srun`` their launcher decides.
    """

    name = "parallel"
    base_only: ClassVar[bool] = True

    def __init__(
        self,
        devices: int | str = "auto",
        num_nodes: int = 1,
        precision: str | Precision = "32-true",
        device: str | torch.device | None = None,
        process_group_backend: str | None = None,
        timeout: float | timedelta = timedelta(minutes=30),
        max_restarts: int = 0,
        start_method: str = "popen",
        preemption_grace_period: float = DEFAULT_GRACE_PERIOD,
        *,
        accelerator: Accelerator | None = None,
        parallel_devices: Sequence[torch.device] | None = None,
        cluster_environment: Any = None,
        checkpoint_io: Any = None,
        precision_plugin: Precision | None = None,
    ) -> None:
        if parallel_devices is not None:
            device, devices = from_parallel_devices(parallel_devices, device, devices)
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if not isinstance(seconds, (int, float)) or not 0 < seconds < float("inf"):
            raise ValueError(
                f"timeout must be a positive number of seconds (or a timedelta), got {timeout!r}: how long a "
                "collective may wait for the other processes, e.g. timeout=1800"
            )
        if not isinstance(preemption_grace_period, (int, float)) or not 0 <= preemption_grace_period < float("inf"):
            raise ValueError(
                f"preemption_grace_period must be a number of seconds >= 0, got {preemption_grace_period!r}"
            )
        self.preemption_grace_period = float(preemption_grace_period)
        if start_method not in ("popen", "spawn", "fork"):
            raise ValueError(f"start_method must be 'popen', 'spawn' or 'fork', got {start_method!r}")
        self.max_restarts = max_restarts
        self.start_method = start_method
        self._device_type = torch.device(device).type if device is not None else None
        self._devices: int | str = "auto"
        self.num_nodes = 1
        self.configure(devices=devices, num_nodes=num_nodes)
        self.process_group_backend = process_group_backend
        self.timeout = timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))
        self._owns_group = False
        self.cluster_environment = cluster_environment  # Lightning's argument; None: the one detected
        super().__init__(
            precision=None if precision_plugin is not None and precision == "32-true" else precision,
            device=None,
            accelerator=accelerator,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )

    # ----------------------------------------------------------------- topology
    @override
    def configure(self, *, devices: int | str = "auto", num_nodes: int = 1) -> None:
        if devices != "auto":
            count = int(devices)
            if count < 1:
                raise ValueError(f"devices must be >= 1 or 'auto', got {devices!r}")
            self._devices = count
        if int(num_nodes) < 1:
            raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
        if num_nodes != 1:  # 1 is the Trainer's default: it must not undo an instance's own setting
            self.num_nodes = int(num_nodes)

    @property
    def num_processes(self) -> int:
        """Processes on this node (``devices`` resolved)."""
        if self._devices != "auto":
            return int(self._devices)
        return torch.cuda.device_count() if self._accelerator() == "cuda" else 1

    def _accelerator(self) -> str:
        if self._device_type is not None:
            return self._device_type
        return "cuda" if torch.cuda.is_available() else "cpu"

    @property
    @override
    def root_device(self) -> torch.device:
        if self._accelerator() == "cuda":
            return torch.device("cuda", self.local_rank)
        return torch.device(self._accelerator())

    @property
    @override
    def world_size(self) -> int:
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
        if joined_environment():
            return int(os.environ.get("WORLD_SIZE", "1"))
        return self.num_processes * self.num_nodes

    @property
    @override
    def global_rank(self) -> int:
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        if joined_environment():
            return int(os.environ.get("RANK", "0"))
        return 0

    @property
    @override
    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    cluster_environment = environments.EnvironmentSlot()  # Lightning's: the one given, else the one detected

    # ----------------------------------------------------------------- lifecycle
    @override
    def launch(self, fn: Callable[..., T], *args: Any) -> T:
        """Join torchrun's, Slurm's or rank 0's processes, or start ``devices`` local ones, and run ``fn``."""
        if (launcher := relaunch.current_launcher()) is not None:  # ranks this process started run with it
            return launcher.run(fn, *args)
        if (dist.is_available() and dist.is_initialized()) or joined_environment() or self.world_size == 1:
            return fn(*args)
        if self.num_nodes > 1:
            raise RuntimeError(
                f"num_nodes={self.num_nodes}: start one launcher per machine, e.g. `torchrun "
                f"--nnodes={self.num_nodes} --nproc-per-node={self.num_processes} --rdzv-backend=c10d "
                "--rdzv-endpoint=HOST:PORT your_script.py`, or `srun` under Slurm"
            )
        self._check_process_count()
        if self.start_method == "popen" and self.max_restarts == 0:
            relaunch.check_rerunnable(self.name)
            return relaunch.start_ranks(self.num_processes, self.preemption_grace_period).run(fn, *args)
        method, grace = ("fork" if self.start_method == "fork" else "spawn"), self.preemption_grace_period
        result: T = start_processes(fn, args, self.num_processes, self.max_restarts, method, grace)
        return result

    def _check_process_count(self) -> None:
        """Refuse more local processes than the machine can hold, before starting any."""
        count = self.num_processes
        if self._accelerator() == "cuda":
            available = torch.cuda.device_count()
            if count > available:
                raise ValueError(
                    f"devices={count}: this machine has {available} CUDA device(s); use devices<={available}"
                )
            return
        cores = os.cpu_count() or 1
        limit = CPU_PROCESSES_PER_CORE * cores
        if count > limit:
            raise UserError(
                f"devices={count}: too many processes for this machine's {cores} CPU core(s) (at most {limit}, "
                f"{CPU_PROCESSES_PER_CORE} per core, when the strategy starts them itself). Use devices<={limit}, "
                "or spread the processes over machines with num_nodes; to start this many here deliberately, "
                f"start them yourself: torchrun --nproc-per-node={count} your_script.py"
            )

    @override
    def setup_environment(self) -> None:
        """Create the process group (once per process; later stages reuse it)."""
        if dist.is_initialized():
            return
        backend = self.process_group_backend or ("nccl" if self.root_device.type == "cuda" else "gloo")
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        if joined_environment():
            record_errors()  # a rank's failure ends its process at once (and reaches rank 0)
            flush_files_at_exit()
            if relaunch.started_by_rerun():
                return join_group(backend, self.timeout, relaunch.joining_check())
            if "TORCHELASTIC_RUN_ID" not in os.environ:
                check_slurm_launched()
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            if attempt == "0":
                dist.init_process_group(backend, init_method="env://", timeout=self.timeout)
            else:
                # After an elastic restart the launcher's store still holds the addresses the dead
                # workers published; a per-attempt key prefix keeps the new group from reading them.
                use_agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "False").lower() == "true"
                rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
                store = dist.TCPStore(
                    os.environ["MASTER_ADDR"],
                    int(os.environ["MASTER_PORT"]),
                    world,
                    is_master=not use_agent_store and rank == 0,
                    timeout=self.timeout,
                )
                prefixed = dist.PrefixStore(f"geartrain/attempt_{attempt}", store)
                dist.init_process_group(backend, store=prefixed, rank=rank, world_size=world, timeout=self.timeout)
            # The group lives as long as the process (fit, validate and test reuse it), and is not
            # destroyed at exit: a rank tearing its gloo connections down while a peer still used them
            # aborted the peer (SIGABRT) after the work was done. The operating system closes them.
            return
        if self.world_size != 1:
            raise RuntimeError(
                f"{type(self).__name__} needs {self.world_size} processes; call trainer.fit/validate/test, "
                "which start them, or run the script with torchrun"
            )
        # One process: an in-memory store, no port needed.
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=self.timeout)
        self._owns_group = True

    @override
    def teardown(self) -> None:
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False

    # ----------------------------------------------------------------- data
    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """How data is sharded (Lightning's name): ``num_replicas`` shards, this process takes ``rank``.

        Every process is a replica here; a model-parallel strategy shards over its data-parallel ranks.
        """
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    @override
    def process_dataloader(self, dataloader: Iterable[Any], *, train: bool) -> Iterable[Any]:
        """Give a DataLoader a sampler that shards it over the ranks.

        The default samplers: training gets a :class:`~strategies.sampling.GlobalBatchSampler` (rank
        ``r``'s shards of the global batches of ``batch_size * world_size`` that one process takes, in
        the order one process draws), evaluation an :class:`EvalShardSampler`, with no padded
        duplicates. A training loader over an ``IterableDataset`` (sharded by the user's code) gets
        :class:`~strategies.sampling.EvenEnd`, so every rank stops at the same batch. A sampler or batch sampler of the user's is
        kept and sharded (:mod:`strategies.sampling`): each rank gets its share of what it yields.
        """
        shard = self.distributed_sampler_kwargs
        world = shard["num_replicas"]
        if world == 1 or not isinstance(dataloader, DataLoader):
            return dataloader
        if isinstance(dataloader.dataset, IterableDataset):
            # The user's code shards the stream (``get_worker_info`` and the rank); in training the
            # ranks agree on where the epoch ends, so unequal shards cannot leave one rank waiting.
            return EvenEnd(dataloader, self.root_device) if train else dataloader
        if isinstance(dataloader.sampler, (DistributedSampler, EvalShardSampler, ShardedSampler)):
            return dataloader
        if isinstance(dataloader.batch_sampler, ShardedBatchSampler):
            return dataloader
        rank = shard["rank"]
        if dataloader.batch_size is None and dataloader.batch_sampler is not None:  # the user's batch sampler
            batches = ShardedBatchSampler(dataloader.batch_sampler, rank, world, pad=train)
            return rebuild_dataloader(dataloader, batch_sampler=batches)
        sampler: Sampler[int]
        if not train:
            sampler = EvalShardSampler(dataloader.sampler, rank, world)
        elif not isinstance(dataloader.sampler, (SequentialSampler, RandomSampler)):  # the user's sampler
            sampler = ShardedSampler(dataloader.sampler, rank, world, drop_last=dataloader.drop_last)
        else:  # the default samplers: the global batches one process takes (strategies/sampling.py)
            assert dataloader.batch_size is not None
            sampler = GlobalBatchSampler(
                dataloader.dataset,  # type: ignore[arg-type]
                dataloader.sampler,
                dataloader.batch_size,
                rank,
                world,
                drop_last=dataloader.drop_last,
                seed=seed_from_env(),
            )
        return rebuild_dataloader(dataloader, sampler=sampler)

    # ----------------------------------------------------------------- collectives
    @override
    def reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if op not in _REDUCE_OPS:
            raise ValueError(f"reduce op must be one of {sorted(_REDUCE_OPS)}, got {op!r}")
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return tensor
        out = tensor.detach().clone()
        dist.all_reduce(out, op=_REDUCE_OPS[op])
        return out / dist.get_world_size() if op == "mean" else out

    @override
    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if not dist.is_initialized():
            return tensor.unsqueeze(0)
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, tensor.contiguous())
        return torch.stack(parts)

    @override
    def barrier(self, name: str = "") -> None:
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()

    @override
    def gather_object(self, obj: T) -> list[T]:
        if self.world_size == 1 or not dist.is_initialized():
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    @override
    def broadcast(self, obj: T, src: int = 0) -> T:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    @override
    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(devices={self._devices}, num_nodes={self.num_nodes}, "
            f"precision={self.precision.name!r})"
        )
