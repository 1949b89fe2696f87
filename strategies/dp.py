"""DataParallel: one process, the module replicated on every visible GPU for each training step."""

from __future__ import annotations

import threading
import warnings
from collections import defaultdict
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch
from torch import nn
from typing_extensions import override

from strategies.base import Strategy
from strategies.precision import Precision
from trainer.common.tree import apply_to_tensors, batch_size_of, is_metric

if TYPE_CHECKING:
    from trainer.module import TrainModule

__all__ = ["DataParallelStrategy"]

#: One ``self.log`` call in a replica: name, value, the replica's batch share, the keyword options.
_LogCall = tuple[str, Any, int, dict[str, Any]]


class DataParallelStrategy(Strategy):
    """``nn.DataParallel`` over the visible GPUs (or ``devices`` of them).

    Every training step scatters the batch over the GPUs, runs ``training_step`` in a replica on each
    (in threads of this one process), gathers the outputs on the first GPU and averages the losses;
    values the replicas ``self.log`` are averaged (weighted by each replica's batch share) and logged
    once. Evaluation runs on the first GPU. PyTorch recommends DDP over DataParallel even on one
    machine: DataParallel replicates the module every step, is bound by one Python process, and
    copies gradients through GPU 0. With fewer than two GPUs it trains on one device and says so
    once.

    Args:
        devices: how many GPUs to use; ``"auto"`` for all visible ones.
        precision: a precision name or plugin.
    """

    name = "dp"
    wraps_module: ClassVar[bool] = True

    def __init__(self, devices: int | str = "auto", precision: str | Precision = "32-true") -> None:
        self._devices: int | str = "auto"
        self.configure(devices=devices)
        super().__init__(precision=precision, device=None)
        self._records: list[tuple[int, list[_LogCall]]] = []
        self._lock = threading.Lock()
        self._said_one_device = False

    @override
    def configure(self, *, devices: int | str = "auto", num_nodes: int = 1) -> None:
        """Take ``devices`` GPUs; more than this machine has is refused, as one-device strategies refuse two.

        ``"auto"`` is every visible GPU, and one device (the CPU, said once at set-up) without CUDA.
        """
        if num_nodes != 1:
            raise ValueError(f"DataParallelStrategy runs on one machine; got num_nodes={num_nodes}")
        if devices == "auto":
            return
        count, visible = int(devices), torch.cuda.device_count()
        if count > max(visible, 1):
            raise ValueError(
                f"strategy='dp' replicates the module over GPUs; got devices={devices!r}, and {visible} GPU(s) "
                "are visible here: leave devices out to train on one device, or use strategy='ddp' for one "
                "process per device (on a CPU too)"
            )
        self._devices = count

    @property
    def device_ids(self) -> list[int]:
        """The GPUs the module is replicated on (empty without CUDA)."""
        count = torch.cuda.device_count()
        if self._devices != "auto":
            count = min(count, int(self._devices))
        return list(range(count))

    @override
    def setup(self, module: TrainModule) -> nn.Module:
        ids = self.device_ids
        # Said once per strategy, not left to the warnings registry: setup runs for every stage
        # (fit, then test), and the registry forgets what it showed whenever a library changes the
        # warning filters (importing torch._dynamo, which every optimizer does, imports sympy, which does).
        if len(ids) < 2 and not self._said_one_device:
            self._said_one_device = True
            warnings.warn(
                f"DataParallelStrategy: {len(ids)} GPU(s) visible, so training runs on one device "
                f"({self.root_device}) without replication.",
                stacklevel=2,
            )
        converted = self.precision.convert_module(module.to(self.root_device))
        self.module = converted
        self.model = nn.DataParallel(_ReplicaRunner(converted, self), device_ids=ids or None)
        return converted

    @override
    def step(self, hook: str, *args: Any) -> Any:
        """Training steps run in every replica; outputs are gathered and per-replica losses averaged."""
        assert self.module is not None and self.model is not None
        if hook != "training_step":
            return getattr(self.module, hook)(*args)
        replicas = len(self.device_ids)
        if replicas < 2:
            return self.model(hook, *args)
        self._records = []
        out = self.model(hook, *args)
        self._log_replica_values()
        return apply_to_tensors(out, lambda t: t.mean() if t.ndim == 1 and t.shape[0] <= replicas else t)

    # ----------------------------------------------------------------- logging from replicas
    def _record(self, device_index: int, records: list[_LogCall]) -> None:
        with self._lock:
            self._records.append((device_index, records))

    def _log_replica_values(self) -> None:
        """Log each name once, through the module's own ``log``: the batch-share-weighted mean of the replicas'."""
        assert self.module is not None
        module = cast("TrainModule", self.module)
        grouped: dict[str, list[tuple[torch.Tensor, int]]] = defaultdict(list)
        options: dict[str, dict[str, Any]] = {}
        for _, records in sorted(self._records, key=lambda r: r[0]):
            for name, value, share, kwargs in records:
                grouped[name].append((torch.as_tensor(value).detach().to(self.root_device).float(), share))
                options[name] = kwargs
        self._records = []
        for name, values in grouped.items():
            total = sum(share for _, share in values)
            mean = sum(v * share for v, share in values) / total
            module.log(name, mean, **options[name])


class _ReplicaRunner(nn.Module):
    """Runs ``module.<hook>(*args)`` in a replica; on several GPUs it records ``self.log`` calls.

    Each replica is a shallow copy of the module, so giving the copy an instance attribute ``log``
    (a :class:`_LogRecorder`'s method, found before ``TrainModule.log``) affects only that replica's
    thread; ``log_dict`` goes through it too. The strategy merges the records after the step.
    """

    def __init__(self, module: nn.Module, strategy: DataParallelStrategy) -> None:
        super().__init__()
        self.module = module
        self._strategy = strategy

    @override
    def forward(self, hook: str, *args: Any) -> Any:
        module = self.module
        if len(self._strategy.device_ids) < 2:
            return getattr(module, hook)(*args)
        recorder = _LogRecorder(batch_size_of(args[0]) if args else 1)
        attributes = vars(module)
        shadowed = attributes.get("log", _NOTHING)
        attributes["log"] = recorder.log
        try:
            return getattr(module, hook)(*args)
        finally:
            if shadowed is _NOTHING:
                del attributes["log"]
            else:
                attributes["log"] = shadowed
            device = next(module.parameters()).device
            self._strategy._record(device.index or 0, recorder.records)


_NOTHING = object()


class _LogRecorder:
    """Stands in for ``TrainModule.log`` inside a replica: keeps each call for the strategy to merge.

    Args:
        share: the replica's number of samples (its weight in the merged mean).
    """

    def __init__(self, share: int) -> None:
        self.share = share
        self.records: list[_LogCall] = []

    def log(
        self,
        name: str,
        value: Any,
        *,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        prog_bar: bool = False,
        sync_dist: bool = False,
        reduce_fx: str = "mean",
        batch_size: int | None = None,
    ) -> None:
        """Keep one ``self.log`` call (``TrainModule.log``'s signature)."""
        if is_metric(value):
            raise RuntimeError(
                f"self.log({name!r}, <Metric>) in a DataParallel replica: torchmetrics objects cannot be "
                "updated from replicas. Log a tensor in training_step, or use strategy='ddp'."
            )
        options: dict[str, Any] = dict(on_step=on_step, on_epoch=on_epoch, prog_bar=prog_bar, sync_dist=sync_dist)
        options.update(reduce_fx=reduce_fx, batch_size=batch_size)
        self.records.append((name, value, self.share, options))
