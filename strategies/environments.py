"""Cluster environments: Lightning's objects over the variables geartrain's strategies read.

Under ``torchrun`` (``TORCHELASTIC_RUN_ID``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``GROUP_RANK``)
or ``srun`` (``SLURM_NTASKS``, ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``) the processes
exist and each reads its rank from the environment (:mod:`strategies.launch`). These classes are
Lightning's public face of those variables (``lightning.pytorch.plugins.environments``): the same
methods (``world_size()``, ``global_rank()``, ``local_rank()``, ``node_rank()``, ``main_address``,
``main_port``, ``detect()``, ``creates_processes_externally``), reading the same variables, so a
program that asks its environment gets what the strategy runs with. :func:`detect_environment`
answers which one this process is in, in Lightning's order.

A class of the user's own that overrides what the ranks are (an environment geartrain does not
read) is refused by ``Trainer(plugins=...)``: the ranks come from the variables above.
``LSFEnvironment`` and ``MPIEnvironment`` detect their jobs as Lightning's do, and building one is
refused (geartrain does not join LSF or MPI jobs: start the processes with ``torchrun``).
"""

from __future__ import annotations

import abc
import os
import signal
import socket
from typing import Any

from strategies.launch import first_host, slurm_environment

__all__ = [
    "ClusterEnvironment",
    "EnvironmentSlot",
    "KubeflowEnvironment",
    "LSFEnvironment",
    "LightningEnvironment",
    "MPIEnvironment",
    "SLURMEnvironment",
    "TorchElasticEnvironment",
    "detect_environment",
    "is_environment",
]

#: What every cluster environment answers (Lightning's ``ClusterEnvironment`` interface).
_INTERFACE = ("creates_processes_externally", "main_address", "main_port", "world_size", "global_rank", "local_rank")


class ClusterEnvironment(metaclass=abc.ABCMeta):
    """Lightning's ``ClusterEnvironment``: where this process stands among the processes of a run.

    ``isinstance(obj, ClusterEnvironment)`` holds for Lightning's own environment objects too (any
    object with this interface), so ``Trainer(plugins=[...])`` recognises them.
    """

    @classmethod
    def __subclasshook__(cls, other: type) -> bool:
        if cls is not ClusterEnvironment:
            return NotImplemented
        return all(any(name in vars(base) for base in other.__mro__) for name in _INTERFACE)

    @property
    @abc.abstractmethod
    def creates_processes_externally(self) -> bool:
        """Whether a launcher (torchrun, srun) started the processes, rather than the strategy."""
        raise NotImplementedError

    @property
    @abc.abstractmethod
    def main_address(self) -> str:
        """The address of the process of rank 0 (``MASTER_ADDR``)."""
        raise NotImplementedError

    @property
    @abc.abstractmethod
    def main_port(self) -> int:
        """The port rank 0 listens on for the process group (``MASTER_PORT``)."""
        raise NotImplementedError

    @staticmethod
    @abc.abstractmethod
    def detect() -> bool:
        """Whether this process runs in this kind of environment."""
        raise NotImplementedError

    @abc.abstractmethod
    def world_size(self) -> int:
        """The number of processes of the run."""
        raise NotImplementedError

    def set_world_size(self, size: int) -> None:  # noqa: B027 (a default that does nothing)
        """Lightning's strategies tell the environment the world size; fixed by the launcher here."""

    @abc.abstractmethod
    def global_rank(self) -> int:
        """This process's rank among all processes."""
        raise NotImplementedError

    def set_global_rank(self, rank: int) -> None:  # noqa: B027 (a default that does nothing)
        """Lightning's strategies tell the environment the rank; fixed by the launcher here."""

    @abc.abstractmethod
    def local_rank(self) -> int:
        """This process's rank on its machine."""
        raise NotImplementedError

    @abc.abstractmethod
    def node_rank(self) -> int:
        """The rank of this process's machine."""
        raise NotImplementedError

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:  # noqa: B027 (a default that does nothing)
        """Check ``devices``/``num_nodes`` against the environment (nothing to check by default)."""

    def teardown(self) -> None:  # noqa: B027 (a default that does nothing)
        """Clean up at the end of a run (nothing by default)."""


def is_environment(obj: Any) -> bool:
    """Whether ``obj`` is a cluster environment (ours, or Lightning's: an object with the interface)."""
    return isinstance(obj, ClusterEnvironment)


class LightningEnvironment(ClusterEnvironment):
    """Processes the strategy starts itself on one machine (``Trainer(devices=N)``), or one process.

    ``LOCAL_RANK`` set means a launcher started this process. The world size and rank are what the
    strategy sets (:meth:`set_world_size`, :meth:`set_global_rank`), 1 and 0 until then.
    """

    def __init__(self) -> None:
        self._main_port = -1
        self._global_rank = 0
        self._world_size = 1

    @property
    def creates_processes_externally(self) -> bool:
        return "LOCAL_RANK" in os.environ

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        if self._main_port == -1:
            self._main_port = int(os.environ["MASTER_PORT"]) if "MASTER_PORT" in os.environ else _free_port()
        return self._main_port

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return self._world_size

    def set_world_size(self, size: int) -> None:
        self._world_size = size

    def global_rank(self) -> int:
        return self._global_rank

    def set_global_rank(self, rank: int) -> None:
        self._global_rank = rank

    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", 0))

    def node_rank(self) -> int:
        return int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", 0)))

    def teardown(self) -> None:
        os.environ.pop("WORLD_SIZE", None)


class _LauncherVariables(ClusterEnvironment):
    """What torchrun and Kubeflow share: processes started outside, ``MASTER_ADDR``/``MASTER_PORT``,
    ``WORLD_SIZE`` and ``RANK`` as the launcher set them."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ["MASTER_ADDR"]

    @property
    def main_port(self) -> int:
        return int(os.environ["MASTER_PORT"])

    def world_size(self) -> int:
        return int(os.environ["WORLD_SIZE"])

    def global_rank(self) -> int:
        return int(os.environ["RANK"])


class TorchElasticEnvironment(_LauncherVariables):
    """Processes started by ``torchrun`` (torch elastic): ranks from ``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``."""

    @staticmethod
    def detect() -> bool:
        return all(name in os.environ for name in ("RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))

    def local_rank(self) -> int:
        return int(os.environ["LOCAL_RANK"])

    def node_rank(self) -> int:
        return int(os.environ.get("GROUP_RANK", 0))


class SLURMEnvironment(ClusterEnvironment):
    """Tasks started by ``srun``: ranks from ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NODEID``.

    Args:
        auto_requeue: on the requeue signal, save ``last.ckpt`` and ``scontrol requeue`` the job
            (``Trainer(slurm_requeue=...)``, which this sets when given as a plugin).
        requeue_signal: the signal that asks for the requeue (``SIGUSR1`` when None; give the same
            one as ``sbatch --signal``).
    """

    def __init__(self, auto_requeue: bool = True, requeue_signal: signal.Signals | None = None) -> None:
        self.auto_requeue = auto_requeue
        self.requeue_signal = requeue_signal if requeue_signal is not None else getattr(signal, "SIGUSR1", None)

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        """``MASTER_ADDR``, else the first host of ``SLURM_NODELIST`` (the address geartrain's ranks join at)."""
        found = slurm_environment()
        if "MASTER_ADDR" in os.environ:
            return os.environ["MASTER_ADDR"]
        if found is not None:
            return found["MASTER_ADDR"]
        return first_host(os.environ.get("SLURM_NODELIST", "127.0.0.1"))

    @property
    def main_port(self) -> int:
        """``MASTER_PORT``, else the port geartrain derives from the job id, the same on every task."""
        if "MASTER_PORT" in os.environ:
            return int(os.environ["MASTER_PORT"])
        found = slurm_environment({**os.environ, "SLURM_NTASKS": "2", "SLURM_PROCID": "0"})
        assert found is not None
        return int(found["MASTER_PORT"])

    @staticmethod
    def detect() -> bool:
        return "SLURM_NTASKS" in os.environ and SLURMEnvironment.job_name() not in ("bash", "interactive")

    @staticmethod
    def job_name() -> str | None:
        """``SLURM_JOB_NAME``."""
        return os.environ.get("SLURM_JOB_NAME")

    @staticmethod
    def job_id() -> int | None:
        """``SLURM_JOB_ID`` as a number; None outside a job (or in an interactive one)."""
        if SLURMEnvironment.job_name() in ("bash", "interactive"):
            return None
        try:
            return int(os.environ["SLURM_JOB_ID"])
        except (KeyError, ValueError):
            return None

    def world_size(self) -> int:
        return int(os.environ["SLURM_NTASKS"])

    def global_rank(self) -> int:
        return int(os.environ["SLURM_PROCID"])

    def local_rank(self) -> int:
        return int(os.environ["SLURM_LOCALID"])

    def node_rank(self) -> int:
        return int(os.environ["SLURM_NODEID"])


class KubeflowEnvironment(_LauncherVariables):
    """A Kubeflow PyTorchJob: one process per pod, ranks from ``RANK``/``WORLD_SIZE`` (read as torchrun's)."""

    @staticmethod
    def detect() -> bool:
        return all(
            name in os.environ for name in ("KUBERNETES_PORT", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
        )

    def local_rank(self) -> int:
        return 0

    def node_rank(self) -> int:
        return self.global_rank()


class _Unjoined(ClusterEnvironment):
    """An environment Lightning joins and geartrain does not: detected, refused when built."""

    _how = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Unjoined:
        raise NotImplementedError(
            f"{cls.__name__} is not supported: geartrain does not join {cls._how} jobs; start one process "
            "per device with torchrun (or srun under Slurm), whose variables every strategy reads"
        )


class LSFEnvironment(_Unjoined):
    """An IBM LSF job (``jsrun``): detected as Lightning detects it (``LSB_JOBID``, ``LSB_DJOB_RANKFILE``)."""

    _how = "LSF (jsrun)"

    @staticmethod
    def detect() -> bool:
        return all(name in os.environ for name in ("LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK"))


class MPIEnvironment(_Unjoined):
    """Processes started by ``mpirun``: detected as Lightning detects it (``mpi4py`` and more than one process)."""

    _how = "MPI (mpirun)"

    @staticmethod
    def detect() -> bool:
        if not any(name in os.environ for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")):
            return False
        size = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1"))
        return int(size) > 1


def detect_environment() -> ClusterEnvironment:
    """The environment this process is in, in Lightning's order: torchrun, Slurm, Kubeflow, else local."""
    for cls in (TorchElasticEnvironment, SLURMEnvironment, KubeflowEnvironment):
        if cls.detect():
            return cls()
    return LightningEnvironment()


class EnvironmentSlot:
    """A strategy's ``cluster_environment``: the environment given to it, else the one detected now.

    Its answers are the variables the strategy reads its ranks from (torchrun's, Slurm's, or those of
    the processes the strategy starts itself).
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self._key = f"_{name}"

    def __get__(self, strategy: Any, owner: type | None = None) -> Any:
        if strategy is None:
            return self
        given = strategy.__dict__.get(self._key)
        return given if given is not None else detect_environment()

    def __set__(self, strategy: Any, env: ClusterEnvironment | None) -> None:
        strategy.__dict__[self._key] = env


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])
