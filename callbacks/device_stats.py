"""``DeviceStatsMonitor``: the accelerator's device statistics, logged at the batch hooks as Lightning logs them."""

from __future__ import annotations

import importlib.util
import resource
import sys
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from callbacks.base import Callback, logs_at
from trainer.common.cpu_stats import get_cpu_stats
from trainer.common.errors import MisconfigurationException

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["DeviceStatsMonitor", "process_memory_mb"]

_MB = 1024.0 * 1024.0

#: Whether ``psutil`` (the CPU's figures, :func:`trainer.common.cpu_stats.get_cpu_stats`) can be imported;
#: read when the monitor is set up (Lightning's flag of the same name).
_PSUTIL_AVAILABLE = importlib.util.find_spec("psutil") is not None


def process_memory_mb() -> tuple[float, float]:
    """This process's resident memory now and its high-water mark, in MiB.

    Linux: ``VmRSS`` and ``VmHWM`` from ``/proc/self/status``. Elsewhere only the peak is known
    (``getrusage``), and it stands in for both.
    """
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS", "VmHWM")))
        return float(fields["VmRSS"].split()[0]) / 1024.0, float(fields["VmHWM"].split()[0]) / 1024.0
    except (OSError, KeyError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak_mb = peak / _MB if sys.platform == "darwin" else peak / 1024.0  # bytes on macOS, KiB elsewhere
        return peak_mb, peak_mb


class DeviceStatsMonitor(Callback):
    """Log the accelerator's device statistics at every training, validation and test batch's start and end.

    As Lightning's: at the batches where the trainer logs (every ``log_every_n_steps``; an evaluation
    batch by its count in the run), the figures of ``trainer.accelerator.get_device_stats(device)``
    go to every logger's ``log_metrics`` under ``DeviceStatsMonitor.<hook><separator><name>``
    (``DeviceStatsMonitor.on_train_batch_start/cpu_percent``), at the training batches that stepped
    so far. On the CPU they are ``psutil``'s ``cpu_percent``, ``cpu_vm_percent`` and
    ``cpu_swap_percent``; on CUDA ``torch.cuda.memory_stats``.

    Args:
        cpu_stats: ``None`` logs the CPU's figures only when training on the CPU, ``True`` also beside
            a GPU's, ``False`` never (on the CPU nothing is logged then).

    Raises:
        MisconfigurationException: at ``fit``'s set-up when the trainer has no logger.
        ModuleNotFoundError: at ``fit``'s set-up on the CPU with ``cpu_stats=None`` when ``psutil`` is
            not installed (``pip install psutil``).

    At the end of fit every rank's peak memory (the process's resident high-water mark and, on CUDA,
    ``torch.cuda.max_memory_allocated``; MiB) is gathered into :attr:`peaks`
    (``{"rank0/cpu": ..., "rank0/cuda": ...}``), geartrain's addition; nothing is printed.

    Example:
        >>> DeviceStatsMonitor(cpu_stats=False).peaks
        {}
    """

    def __init__(self, cpu_stats: bool | None = None) -> None:
        self._cpu_stats = cpu_stats
        #: Peak memory per rank and device in MiB, filled at the end of fit.
        self.peaks: dict[str, float] = {}
        self._stepped_at_start = 0  # Lightning's x-axis for this training batch, read at its start
        self._eval_batches = 0  # evaluation batches of the current run, as Lightning's loop counts them

    @override
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if stage != "fit":
            return
        if not trainer.loggers:
            raise MisconfigurationException(
                "Cannot use `DeviceStatsMonitor` callback with `Trainer(logger=False)`: give the Trainer a logger"
            )
        if self._cpu_stats is None and trainer.strategy.root_device.type == "cpu" and not _PSUTIL_AVAILABLE:
            raise ModuleNotFoundError(
                "`DeviceStatsMonitor` cannot log CPU stats as `psutil` is not installed: pip install psutil, "
                "or DeviceStatsMonitor(cpu_stats=False)"
            )

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self.peaks = {}
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def _log(self, trainer: Trainer, hook: str, due: bool, step: int) -> None:
        if not due:
            return
        device = trainer.strategy.root_device
        if self._cpu_stats is False and device.type == "cpu":
            return
        stats = dict(trainer.accelerator.get_device_stats(device))
        if self._cpu_stats and device.type != "cpu":
            stats.update(get_cpu_stats())
        prefix = f"{type(self).__qualname__}.{hook}"
        loggers: list[Any] = trainer.loggers  # Lightning's loggers: ``log_metrics`` and ``group_separator``
        for logger in loggers:
            separator = logger.group_separator
            logger.log_metrics({f"{prefix}{separator}{key}": value for key, value in stats.items()}, step=step)

    def _train_due(self, trainer: Trainer) -> bool:
        return logs_at(trainer, self._stepped_at_start + 1)

    def _eval_step(self, trainer: Trainer) -> int:
        # Inside fit the training batch that just ran (its step not yet counted by Lightning's loop).
        steps = trainer.global_step
        return max(steps - 1, 0) if trainer.state.fn == "fit" else steps

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int) -> None:
        self._stepped_at_start = trainer.global_step
        self._log(trainer, "on_train_batch_start", self._train_due(trainer), self._stepped_at_start)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._log(trainer, "on_train_batch_end", self._train_due(trainer), self._stepped_at_start)

    @override
    def on_validation_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_batches = 0

    @override
    def on_test_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_batches = 0

    def _eval_due(self, trainer: Trainer) -> bool:
        return logs_at(trainer, self._eval_batches)

    @override
    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._eval_batches += 1
        self._log(trainer, "on_validation_batch_start", self._eval_due(trainer), self._eval_step(trainer))

    @override
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._log(trainer, "on_validation_batch_end", self._eval_due(trainer), self._eval_step(trainer))

    @override
    def on_test_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._eval_batches += 1
        self._log(trainer, "on_test_batch_start", self._eval_due(trainer), self._eval_step(trainer))

    @override
    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._log(trainer, "on_test_batch_end", self._eval_due(trainer), self._eval_step(trainer))

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        device = trainer.strategy.root_device
        _, cpu_peak = process_memory_mb()
        device_peak = torch.cuda.max_memory_allocated(device) / _MB if device.type == "cuda" else -1.0
        mine = torch.tensor([cpu_peak, device_peak], dtype=torch.float64, device=device)
        for rank, (cpu, dev) in enumerate(trainer.strategy.all_gather(mine).cpu().view(-1, 2).tolist()):
            self.peaks[f"rank{rank}/cpu"] = cpu
            if dev >= 0:
                self.peaks[f"rank{rank}/{device.type}"] = dev
