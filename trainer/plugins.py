"""``Trainer(plugins=...)``: Lightning's plugin objects, each handed to what already does its job.

A precision plugin (``strategies.precision.Precision`` and its subclasses, which are Lightning's
``MixedPrecision``, ``HalfPrecision``, ``DoublePrecision``, ``FSDPPrecision``) replaces the strategy's;
a cluster environment (:mod:`strategies.environments`, or Lightning's own object) is the strategy's
``cluster_environment``, and a ``SLURMEnvironment``'s ``auto_requeue``/``requeue_signal`` set the
preemption's requeue; a checkpoint IO (:mod:`trainer.checkpoint.plugin_io`) writes, reads and removes
the run's checkpoint files; ``TorchSyncBatchNorm`` is ``sync_batchnorm=True``. One of each kind at
most, and a precision plugin together with ``precision=`` is refused, with Lightning's messages.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch import nn

from strategies.base import Strategy
from strategies.environments import ClusterEnvironment
from strategies.precision import Precision, normalize_precision
from trainer.checkpoint.plugin_io import CheckpointIO, TorchCheckpointIO, _WrappingCheckpointIO, is_default_io
from trainer.common.errors import MisconfigurationException

__all__ = ["LayerSync", "Plugins", "TorchSyncBatchNorm", "split_plugins", "trainer_precision", "use_plugins"]


class LayerSync:
    """Lightning's ``LayerSync``: what turns a module's layers into synchronised ones under several processes."""

    def apply(self, model: nn.Module) -> nn.Module:
        """The module with its layers synchronised."""
        raise NotImplementedError

    def revert(self, model: nn.Module) -> nn.Module:
        """The module with its layers back to plain ones."""
        raise NotImplementedError


class TorchSyncBatchNorm(LayerSync):
    """BatchNorm layers as ``torch.nn.SyncBatchNorm``: ``Trainer(plugins=[TorchSyncBatchNorm()])`` is
    ``Trainer(sync_batchnorm=True)``."""

    def apply(self, model: nn.Module) -> nn.Module:
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)

    def revert(self, model: nn.Module) -> nn.Module:
        raise NotImplementedError(
            "TorchSyncBatchNorm.revert is not supported: geartrain converts the module's BatchNorm layers in "
            "place when several processes train; build a new module to get plain BatchNorm layers"
        )


@dataclass
class Plugins:
    """The plugins of ``Trainer(plugins=...)``, one of each kind at most (None: not given)."""

    precision: Precision | None = None
    checkpoint_io: CheckpointIO | None = None
    cluster_environment: ClusterEnvironment | None = None
    layer_sync: LayerSync | None = None


def trainer_precision(precision: str | int | None) -> str | None:
    """``Trainer(precision=...)`` as its name in ``PRECISIONS``; Lightning's legacy half-precision spellings
    (``16``, ``"16"``, ``"bf16"``) warn as Lightning warns, ``32``/``64`` do not."""
    if precision is None:
        return None
    name = normalize_precision(precision)
    if str(precision) in ("16", "bf16"):
        warnings.warn(
            f"`precision={precision}` is supported for historical reasons but its usage is discouraged. "
            f"Please set your precision to {name} instead!",
            UserWarning,
            stacklevel=3,
        )
    return name


def split_plugins(plugins: Any, precision: str | int | None, sync_batchnorm: bool) -> Plugins:
    """Sort ``plugins`` (one object or an iterable of them) by kind, with Lightning's checks and messages."""
    found = Plugins()
    if plugins is None:
        return found
    given = list(plugins) if isinstance(plugins, Iterable) and not isinstance(plugins, str) else [plugins]
    counts: dict[str, int] = {}
    for plugin in given:
        if isinstance(plugin, Precision):
            kind, found.precision = "Precision", plugin
        elif isinstance(plugin, CheckpointIO):
            kind, found.checkpoint_io = "CheckpointIO", plugin
        elif isinstance(plugin, ClusterEnvironment):
            _check_environment(plugin)
            kind, found.cluster_environment = "ClusterEnvironment", plugin
        elif isinstance(plugin, LayerSync):
            if not isinstance(plugin, TorchSyncBatchNorm):
                raise ValueError(
                    f"Trainer(plugins=[{type(plugin).__name__}()]) is not supported: geartrain synchronises "
                    "BatchNorm layers only (TorchSyncBatchNorm, or Trainer(sync_batchnorm=True))"
                )
            kind, found.layer_sync = "TorchSyncBatchNorm", plugin
        else:
            raise MisconfigurationException(
                f"Found invalid type for plugin {plugin}. Expected one of: Precision, "
                "CheckpointIO, ClusterEnvironment, or LayerSync."
            )
        counts[kind] = counts.get(kind, 0) + 1
    repeated = [kind for kind, count in counts.items() if count > 1]
    if repeated:
        raise MisconfigurationException(
            f"Received multiple values for {', '.join(repeated)} flags in `plugins`."
            " Expected one value for each type at most."
        )
    if found.precision is not None and precision is not None:
        raise ValueError(f"Received both `precision={precision}` and `plugins={found.precision}`. Choose one.")
    return found


#: The environments whose answers are the variables the strategies read (Lightning's classes of the same name too).
_READ_AS_OURS = ("LightningEnvironment", "TorchElasticEnvironment", "SLURMEnvironment", "KubeflowEnvironment")


def _check_environment(env: ClusterEnvironment) -> None:
    """Refuse an environment whose ranks geartrain would not use: the strategies read launcher variables."""
    name = type(env).__name__
    ours = type(env).__module__ == "strategies.environments"
    lightnings = type(env).__module__.startswith(("lightning_fabric.", "lightning.fabric.")) and name in _READ_AS_OURS
    if not (ours or lightnings):
        raise ValueError(
            f"Trainer(plugins=[{name}(...)]) is not supported: geartrain's strategies read their ranks from the "
            "variables torchrun and srun set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, or SLURM_*), "
            "not from a cluster environment object; set those variables in the launcher instead"
        )


def use_plugins(strategy: Strategy, plugins: Plugins) -> None:
    """Hand the plugins to the strategy: its precision plugin, checkpoint IO and cluster environment.

    Without a checkpoint IO the strategy gets geartrain's own (:class:`TorchCheckpointIO`); a wrapping
    IO given without a base (``AsyncCheckpointIO()``) gets that one as its base, as in Lightning.
    """
    if plugins.precision is not None:
        strategy.precision = plugins.precision
    if plugins.checkpoint_io is not None and not is_default_io(strategy.checkpoint_io):
        raise MisconfigurationException("checkpoint_io set through both strategy class and plugins, choose one")
    given_env = getattr(strategy, "__dict__", {}).get("_cluster_environment")
    if plugins.cluster_environment is not None and given_env is not None:
        raise MisconfigurationException("cluster_environment set through both strategy class and plugins, choose one")
    io = plugins.checkpoint_io if plugins.checkpoint_io is not None else strategy.checkpoint_io
    if io is None:
        io = TorchCheckpointIO()
    elif isinstance(io, _WrappingCheckpointIO):
        io.checkpoint_io = TorchCheckpointIO()  # only where its base is not set yet
    strategy.checkpoint_io = io
    if plugins.cluster_environment is not None and hasattr(strategy, "cluster_environment"):
        strategy.cluster_environment = plugins.cluster_environment
