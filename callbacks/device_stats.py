"""``DeviceStatsMonitor``: measured memory of the accelerator and of the process, as logged metrics."""

from __future__ import annotations

import os
import resource
import sys
from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from callbacks.base import Callback

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["DeviceStatsMonitor", "process_memory_mb"]

_MB = 1024.0 * 1024.0


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
    """Log memory every ``every_n_steps`` optimizer steps and summarise the peaks at the end of fit.

    Metrics, in MiB, reach the loggers like any other (TensorBoard shows them under ``device_stats/``):

    * ``device_stats/cpu_rss`` and ``device_stats/cpu_rss_peak``: this process's resident memory and
      its high-water mark (the peak covers the process's whole life, imports included);
    * on CUDA, ``device_stats/cuda_allocated``, ``cuda_reserved`` and ``cuda_peak_allocated`` of the
      strategy's device (``torch.cuda.memory_allocated`` / ``memory_reserved`` /
      ``max_memory_allocated``; the peak counter is reset when fit starts).

    Reading them costs no device sync. At the end of fit every rank's peaks are gathered and rank 0
    prints one line per device; they are kept in :attr:`peaks` (``{"rank0/cpu": MiB, ...}``).

    Args:
        cpu_stats: whether the ``cpu_*`` figures are logged: ``None`` (Lightning's default) logs them
            when training on the CPU only, ``True`` always, ``False`` never. The peaks printed at
            the end of fit always include the CPU.
        every_n_steps: log after every this many optimizer steps.

    Example:
        >>> monitor = DeviceStatsMonitor(every_n_steps=10)
        >>> monitor.peaks
        {}
    """

    def __init__(self, cpu_stats: bool | None = None, every_n_steps: int = 50) -> None:
        if not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps must be a positive int, got {every_n_steps!r}")
        self.cpu_stats = cpu_stats
        self.every_n_steps = every_n_steps
        #: Peak memory per rank and device in MiB, filled at the end of fit.
        self.peaks: dict[str, float] = {}
        self._last_step = -1

    def measure(self, device: torch.device) -> dict[str, float]:
        """Memory figures (MiB) for this process and ``device``, measured now."""
        rss, hwm = process_memory_mb()
        stats = {"device_stats/cpu_rss": rss, "device_stats/cpu_rss_peak": hwm}
        if device.type == "cuda":
            stats["device_stats/cuda_allocated"] = torch.cuda.memory_allocated(device) / _MB
            stats["device_stats/cuda_reserved"] = torch.cuda.memory_reserved(device) / _MB
            stats["device_stats/cuda_peak_allocated"] = torch.cuda.max_memory_allocated(device) / _MB
        return stats

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self.peaks = {}
        self._last_step = -1
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: object, batch: object, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step == self._last_step or step == 0 or step % self.every_n_steps:
            return  # not a step boundary (accumulating), or not one we log
        self._last_step = step
        device = trainer.strategy.root_device
        stats = self.measure(device)
        if not (self.cpu_stats if self.cpu_stats is not None else device.type == "cpu"):
            stats = {k: v for k, v in stats.items() if not k.startswith("device_stats/cpu_")}
        if stats:
            trainer.log_metrics(stats, step - 1)

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        device = trainer.strategy.root_device
        stats = self.measure(device)
        mine = [stats["device_stats/cpu_rss_peak"], stats.get("device_stats/cuda_peak_allocated", -1.0)]
        gathered = trainer.strategy.all_gather(torch.tensor(mine, dtype=torch.float64, device=device)).cpu()
        for rank, (cpu_peak, device_peak) in enumerate(gathered.tolist()):
            self.peaks[f"rank{rank}/cpu"] = cpu_peak
            if device_peak >= 0:
                self.peaks[f"rank{rank}/{device.type}"] = device_peak
        if trainer.is_global_zero:
            lines = [f"  {name}: {mib:,.1f} MiB" for name, mib in self.peaks.items()]
            print("Peak memory (cpu: resident set high-water; cuda: max allocated):", *lines, sep=os.linesep)
