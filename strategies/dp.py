"""DataParallel: one process, the module replicated on every visible GPU for each training step."""

from __future__ import annotations

import threading
import warnings
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from typing_extensions import override

from strategies.base import Strategy
from strategies.precision import Precision
from trainer.common.tree import apply_to_tensors, batch_size_of, is_metric

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["DataParallelStrategy"]


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

    def __init__(self, devices: int | str = "auto", precision: str | Precision = "32-true") -> None:
        self._devices: int | str = "auto"
        self.configure(devices=devices)
        super().__init__(precision=precision, device=None)
        self._records: list[tuple[int, list[tuple[str, Any, dict[str, Any]]]]] = []
        self._lock = threading.Lock()

    @override
    def configure(self, *, devices: int | str = "auto", num_nodes: int = 1) -> None:
        if num_nodes != 1:
            raise ValueError(f"DataParallelStrategy runs on one machine; got num_nodes={num_nodes}")
        if devices != "auto":
            self._devices = int(devices)

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
        if len(ids) < 2:
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
    def _record(self, device_index: int, records: list[tuple[str, Any, dict[str, Any]]]) -> None:
        with self._lock:
            self._records.append((device_index, records))

    def _log_replica_values(self) -> None:
        """Log each name once: the batch-share-weighted mean of what the replicas logged."""
        trainer = getattr(self.module, "_trainer", None)
        if trainer is None:
            return
        grouped: dict[str, list[tuple[torch.Tensor, int]]] = defaultdict(list)
        options: dict[str, dict[str, Any]] = {}
        for _, records in sorted(self._records, key=lambda r: r[0]):
            for name, value, kwargs in records:
                share = kwargs.pop("_share")
                grouped[name].append((torch.as_tensor(value).detach().to(self.root_device).float(), share))
                options[name] = kwargs
        for name, values in grouped.items():
            total = sum(share for _, share in values)
            mean = sum(v * share for v, share in values) / total
            trainer._log(name, mean, **options[name])
        self._records = []


class _ReplicaRunner(nn.Module):
    """Runs ``module.<hook>(*args)`` in a replica; on several GPUs it records ``self.log`` calls.

    Each replica is a shallow copy of the module, so pointing the copy's ``_trainer`` at a recorder
    affects only that replica's thread.
    """

    def __init__(self, module: nn.Module, strategy: DataParallelStrategy) -> None:
        super().__init__()
        self.module = module
        self._strategy = strategy

    @override
    def forward(self, hook: str, *args: Any) -> Any:
        module = self.module
        trainer = getattr(module, "_trainer", None)
        if trainer is None or len(self._strategy.device_ids) < 2:
            return getattr(module, hook)(*args)
        recorder = _LogRecorder(trainer, args[0] if args else None)
        module._trainer = recorder  # type: ignore[assignment]
        try:
            return getattr(module, hook)(*args)
        finally:
            module._trainer = trainer
            device = next(module.parameters()).device
            self._strategy._record(device.index or 0, recorder.records)


class _LogRecorder:
    """Stands in for the trainer inside a replica: keeps ``self.log`` calls, forwards the rest."""

    def __init__(self, trainer: Trainer, batch: Any) -> None:
        self._trainer = trainer
        self._share = batch_size_of(batch)
        self._is_metric = is_metric
        self.records: list[tuple[str, Any, dict[str, Any]]] = []

    def _log(
        self,
        name: str,
        value: Any,
        on_step: bool | None,
        on_epoch: bool | None,
        prog_bar: bool,
        sync_dist: bool,
        reduce_fx: str,
        batch_size: int | None,
    ) -> None:
        """Keep one ``self.log`` call (``Trainer._log``'s arguments) for the strategy to merge."""
        if self._is_metric(value):
            raise RuntimeError(
                f"self.log({name!r}, <Metric>) in a DataParallel replica: torchmetrics objects cannot be "
                "updated from replicas. Log a tensor in training_step, or use strategy='ddp'."
            )
        options: dict[str, Any] = dict(on_step=on_step, on_epoch=on_epoch, prog_bar=prog_bar, sync_dist=sync_dist)
        options.update(reduce_fx=reduce_fx, batch_size=batch_size, _share=self._share)
        self.records.append((name, value, options))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)
