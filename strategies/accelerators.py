"""Lightning's ``Accelerator`` objects: a kind of device, as ``Trainer(accelerator=...)`` names it.

An accelerator here is thin: it answers what kind of device it is (:meth:`Accelerator.name`), whether
this machine has one, how many, and which ``torch.device`` objects ``devices=`` means. Where tensors go
is still the strategy's choice alone (``strategy.root_device``): ``Trainer(accelerator=CPUAccelerator())``
is ``Trainer(accelerator="cpu")``, both resolved by :func:`strategies.registry.resolve_accelerator`.
``trainer.accelerator`` and ``strategy.accelerator`` return the object for the device in use.

:data:`AcceleratorRegistry` holds the classes under their names (``"cpu"``, ``"cuda"``, ``"mps"``, and
``"tpu"`` for :class:`XLAAccelerator`, which is never available here), as Lightning's does; a class a user registers there must subclass one of ours, so its kind is known.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from trainer.common.cpu_stats import get_cpu_stats
from trainer.common.errors import MisconfigurationException

__all__ = [
    "Accelerator",
    "AcceleratorRegistry",
    "AcceleratorUnavailable",
    "CPUAccelerator",
    "CUDAAccelerator",
    "MPSAccelerator",
    "XLAAccelerator",
    "find_usable_cuda_devices",
    "get_cpu_stats",
]


class AcceleratorUnavailable(MisconfigurationException, RuntimeError):
    """``Trainer(accelerator=...)`` names a device kind this machine lacks (Lightning's ``MisconfigurationException``)."""


class Accelerator:
    """A kind of device (Lightning's base class). Subclass :class:`CPUAccelerator`, :class:`CUDAAccelerator`
    or :class:`MPSAccelerator` to change what one reports; the device kind is the class's :meth:`name`."""

    def setup_device(self, device: torch.device) -> None:
        """Check that ``device`` is of this kind and make it current (CUDA); Lightning calls it per process."""
        if device.type != self.name():
            raise MisconfigurationException(f"Device should be {self.name().upper()}, got {device} instead.")

    def setup(self, trainer: Any) -> None:
        """Lightning's hook before the module is placed; nothing to prepare here."""

    def teardown(self) -> None:
        """Release what :meth:`setup_device` acquired (nothing for these kinds)."""

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """Memory figures of ``device`` (see the subclasses)."""
        raise NotImplementedError(f"{type(self).__name__}.get_device_stats")

    @staticmethod
    def name() -> str:
        """The device kind: ``torch.device(name()).type``."""
        raise NotImplementedError("Accelerator.name: subclass CPUAccelerator, CUDAAccelerator or MPSAccelerator")

    @staticmethod
    def is_available() -> bool:
        """Whether this machine has a device of this kind."""
        raise NotImplementedError("Accelerator.is_available")

    @staticmethod
    def auto_device_count() -> int:
        """How many devices ``devices="auto"`` means on this kind."""
        raise NotImplementedError("Accelerator.auto_device_count")

    @staticmethod
    def parse_devices(devices: Any) -> Any:
        """``devices=`` in this kind's terms (a count for the CPU, indices for GPUs)."""
        raise NotImplementedError("Accelerator.parse_devices")

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        """The ``torch.device`` of each process for parsed ``devices``."""
        raise NotImplementedError("Accelerator.get_parallel_devices")

    @classmethod
    def register_accelerators(cls, accelerator_registry: _AcceleratorRegistry) -> None:
        """Put this class into ``accelerator_registry`` under :meth:`name`."""
        accelerator_registry.register(cls.name(), cls, description=cls.__name__, override=True)


class CPUAccelerator(Accelerator):
    """The CPU: always available; ``devices`` is a number of processes (Lightning's meaning)."""

    @staticmethod
    def name() -> str:
        return "cpu"

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def auto_device_count() -> int:
        return 1

    @staticmethod
    def parse_devices(devices: int | str) -> int:
        """A positive count (``2``, ``"2"``); ``-1``, lists and other values are refused as Lightning does."""
        if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
            devices = int(devices)
        if not isinstance(devices, int) or isinstance(devices, bool) or devices <= 0:
            raise TypeError("`devices` selected with `CPUAccelerator` should be an int > 0.")
        return devices

    @staticmethod
    def get_parallel_devices(devices: int | str) -> list[torch.device]:
        return [torch.device("cpu")] * CPUAccelerator.parse_devices(devices)

    def get_device_stats(self, device: Any) -> dict[str, float]:
        """:func:`get_cpu_stats` (the CPU has one set of figures, whatever ``device``)."""
        return get_cpu_stats()


def _gpu_indices(devices: Any, count: int, kind: str) -> list[int] | None:
    """Lightning's GPU ``devices`` forms (a count, ``-1``, indices, ``"0,1"``) as indices; ``0`` or ``[]``: None."""
    given = devices
    if isinstance(devices, str):
        text = devices.strip()
        if text == "auto":
            devices = -1
        elif "," in text:
            devices = [int(part) for part in text.split(",") if part.strip()]
        elif text.lstrip("-").isdigit():
            devices = int(text)
        else:
            raise MisconfigurationException(f"devices={given!r}: expected a count, -1 or indices like '0,1'")
    if isinstance(devices, bool) or not isinstance(devices, (int, list, tuple)):
        raise TypeError(f"devices must be an int, a string or a list of ints, got {type(given).__name__}")
    if devices == 0 or devices == [] or devices == ():
        return None
    indices = (
        list(range(count)) if devices == -1 else list(range(devices)) if isinstance(devices, int) else list(devices)
    )
    missing = [index for index in indices if not 0 <= index < count]
    if missing:
        raise MisconfigurationException(
            f"You requested gpu: {indices}\n But your machine only has: {list(range(count))} ({kind} devices)"
        )
    return indices


class CUDAAccelerator(Accelerator):
    """NVIDIA GPUs through CUDA; ``devices`` is a count or device indices."""

    @staticmethod
    def name() -> str:
        return "cuda"

    @staticmethod
    def is_available() -> bool:
        return torch.cuda.device_count() > 0

    @staticmethod
    def auto_device_count() -> int:
        return torch.cuda.device_count()

    @staticmethod
    def parse_devices(devices: int | str | list[int]) -> list[int] | None:
        return _gpu_indices(devices, torch.cuda.device_count(), "cuda")

    @staticmethod
    def get_parallel_devices(devices: list[int]) -> list[torch.device]:
        return [torch.device("cuda", index) for index in devices]

    def setup_device(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise ValueError(f"Device should be CUDA, got {device} instead.")
        torch.cuda.set_device(device)

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """``torch.cuda.memory_stats(device)``."""
        return dict(torch.cuda.memory_stats(device))


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


class MPSAccelerator(Accelerator):
    """Apple silicon GPUs through MPS: one device."""

    @staticmethod
    def name() -> str:
        return "mps"

    @staticmethod
    def is_available() -> bool:
        return _mps_available()

    @staticmethod
    def auto_device_count() -> int:
        return 1

    @staticmethod
    def parse_devices(devices: int | str | list[int]) -> list[int] | None:
        return _gpu_indices(devices, 1 if _mps_available() else 0, "mps")

    @staticmethod
    def get_parallel_devices(devices: int | str | list[int]) -> list[torch.device]:
        parsed = MPSAccelerator.parse_devices(devices)
        return [torch.device("mps", index) for index in parsed or []]

    def get_device_stats(self, device: Any) -> dict[str, float]:
        """The machine's memory and CPU figures (:func:`get_cpu_stats`): MPS shares the machine's memory."""
        return get_cpu_stats()


class XLAAccelerator(Accelerator):
    """Lightning's TPU accelerator as on a machine without TPUs: ``is_available()`` is False, no devices.

    geartrain does not train on TPUs, so a trainer given one is refused (:func:`accelerator_kind`); the
    class exists so that code asking whether a TPU is present gets Lightning's answer here.
    """

    @staticmethod
    def name() -> str:
        return "tpu"

    @staticmethod
    def is_available() -> bool:
        return False

    @staticmethod
    def auto_device_count() -> int:
        return 0

    @staticmethod
    def parse_devices(devices: Any) -> Any:
        raise MisconfigurationException(f"devices={devices!r} on TPUs: geartrain does not train on TPUs")

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        raise MisconfigurationException(f"devices={devices!r} on TPUs: geartrain does not train on TPUs")


def find_usable_cuda_devices(num_devices: int = -1) -> list[int]:
    """Indices of ``num_devices`` CUDA devices (``-1``: all) that accept a tensor now (not held exclusively).

    Returns ``[]`` for ``num_devices=0``; raises when fewer are usable than asked for.
    """
    if num_devices == 0:
        return []
    count = torch.cuda.device_count()
    if num_devices > count:
        raise ValueError(f"You requested to find {num_devices} devices but this machine only has {count} GPUs.")
    usable: list[int] = []
    for index in range(count):
        try:
            torch.tensor(0, device=torch.device("cuda", index))
        except RuntimeError:
            continue
        usable.append(index)
        if len(usable) == num_devices:
            break
    if num_devices != -1 and len(usable) != num_devices:
        raise RuntimeError(
            f"You requested to find {num_devices} devices but only {len(usable)} are usable "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); others are busy or held exclusively."
        )
    return usable


class _AcceleratorRegistry(dict[str, dict[str, Any]]):
    """Accelerator classes by name, each entry ``{"accelerator", "accelerator_name", "description", "init_params"}``."""

    def register(
        self,
        name: str,
        accelerator: Callable[..., Accelerator] | None = None,
        description: str = "",
        override: bool = False,
        **init_params: Any,
    ) -> Callable[..., Any]:
        """Register ``accelerator`` under ``name`` (or return a class decorator doing so)."""
        if not isinstance(name, str):
            raise TypeError(f"`name` must be a str, found {name}")
        if name in self and not override:
            raise MisconfigurationException(f"'{name}' is already present in the registry. HINT: Use `override=True`.")

        def do_register(cls: Callable[..., Accelerator]) -> Callable[..., Accelerator]:
            self[name] = {
                "accelerator": cls,
                "accelerator_name": name,
                "description": description,
                "init_params": init_params,
            }
            return cls

        return do_register(accelerator) if accelerator is not None else do_register

    def get(self, name: str, default: Any = None) -> Any:
        """An instance of the class registered under ``name``, built with its ``init_params``."""
        if name in self:
            data = self[name]
            return data["accelerator"](**data["init_params"])
        if default is not None:
            return default
        raise KeyError(f"'{name}' not found in registry. Available names: {self.available_accelerators()}")

    def remove(self, name: str) -> None:
        """Drop the entry registered under ``name``."""
        self.pop(name)

    def available_accelerators(self) -> set[str]:
        """The registered names."""
        return set(self.keys())

    def __str__(self) -> str:
        return "Registered Accelerators: {}".format(", ".join(sorted(self.available_accelerators())))


#: The accelerator classes by name (``AcceleratorRegistry.get("cpu")`` builds a :class:`CPUAccelerator`).
AcceleratorRegistry = _AcceleratorRegistry()
for _cls in (CPUAccelerator, CUDAAccelerator, MPSAccelerator, XLAAccelerator):
    _cls.register_accelerators(AcceleratorRegistry)


def default_device() -> torch.device:
    """CUDA if present, else Apple's MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def accelerator_kind(accelerator: Accelerator | type[Accelerator]) -> str:
    """The device kind of an accelerator instance or class (``"cpu"``, ``"cuda"``, ``"mps"``); others refused."""
    cls = accelerator if isinstance(accelerator, type) else type(accelerator)
    for known in (CPUAccelerator, CUDAAccelerator, MPSAccelerator):
        if issubclass(cls, known):
            return known.name()
    raise MisconfigurationException(
        f"accelerator={cls.__name__}: geartrain places tensors by the device kind, so an accelerator must be "
        "CPUAccelerator, CUDAAccelerator, MPSAccelerator or a subclass of one (TPU/XLA and HPU are not offered)"
    )


def accelerator_for(kind: str) -> Accelerator:
    """A new accelerator object for the device kind ``kind`` (``torch.device.type``)."""
    for known in (CPUAccelerator, CUDAAccelerator, MPSAccelerator):
        if known.name() == kind:
            return known()
    raise MisconfigurationException(f"no accelerator for device kind {kind!r}: geartrain runs on cpu, cuda, mps")


def from_parallel_devices(
    parallel_devices: Sequence[torch.device], device: str | torch.device | None, devices: int | str
) -> tuple[str, int]:
    """Lightning's ``parallel_devices`` as ours: the device kind and the process count (process i on device i)."""
    found = [torch.device(item) for item in parallel_devices]
    kinds = {item.type for item in found}
    if not found or len(kinds) != 1:
        raise ValueError(f"parallel_devices must be one or more devices of one kind, got {list(parallel_devices)!r}")
    kind = kinds.pop()
    indices = [item.index for item in found]
    if kind == "cuda" and indices != list(range(len(found))):
        raise ValueError(
            f"parallel_devices={list(parallel_devices)!r}: geartrain places process i on device i, so give "
            "cuda:0 .. cuda:n-1 (choose others with CUDA_VISIBLE_DEVICES)"
        )
    if device is not None and torch.device(device).type != kind:
        raise ValueError(f"device={device!r} and parallel_devices on {kind!r} disagree: give one of them")
    if devices not in ("auto", len(found), str(len(found))):
        raise ValueError(f"devices={devices!r} and {len(found)} parallel_devices disagree: give one of them")
    return kind, len(found)
