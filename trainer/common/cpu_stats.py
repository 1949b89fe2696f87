"""The CPU's figures as Lightning's ``get_cpu_stats`` gives them (``psutil``'s), for accelerators and monitors.

A leaf module, so that ``DeviceStatsMonitor`` (a callback) and ``CPUAccelerator`` (a strategy's
accelerator) read the same figures; ``psutil`` is imported at the first call only.
"""

from __future__ import annotations

__all__ = ["get_cpu_stats"]

# The figures' names (Lightning's constants of the same names).
_CPU_VM_PERCENT = "cpu_vm_percent"
_CPU_PERCENT = "cpu_percent"
_CPU_SWAP_PERCENT = "cpu_swap_percent"


def get_cpu_stats() -> dict[str, float]:
    """``cpu_vm_percent``, ``cpu_percent``, ``cpu_swap_percent`` from ``psutil`` (refused without it)."""
    try:
        import psutil
    except ImportError:
        raise ModuleNotFoundError(
            "Fetching CPU device stats requires `psutil` to be installed: pip install psutil"
        ) from None
    return {
        _CPU_VM_PERCENT: psutil.virtual_memory().percent,
        _CPU_PERCENT: psutil.cpu_percent(),
        _CPU_SWAP_PERCENT: psutil.swap_memory().percent,
    }
