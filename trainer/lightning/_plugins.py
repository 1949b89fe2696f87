"""Lightning's ``lightning.pytorch.plugins`` tree over geartrain's objects (a part of ``trainer.lightning.TREE``).

Precision plugins are the strategies' own (:mod:`strategies.precision`, :mod:`strategies.fsdp_precision`),
cluster environments are :mod:`strategies.environments`, checkpoint IO is
:mod:`trainer.checkpoint.plugin_io`, ``LayerSync``/``TorchSyncBatchNorm`` are :mod:`trainer.plugins`.
"""

from __future__ import annotations

__all__ = ["PLUGINS_REFUSED", "PLUGINS_TREE"]


_PRECISION = "strategies.precision"
_FSDP = "strategies.fsdp_precision"
_ENV = "strategies.environments"
_IO = "trainer.checkpoint.plugin_io"
_SYNC = "trainer.plugins"

_PRECISIONS = {
    "Precision": _PRECISION,
    "MixedPrecision": _PRECISION,
    "HalfPrecision": _PRECISION,
    "DoublePrecision": _PRECISION,
    "FSDPPrecision": _FSDP,
}
_IOS = dict.fromkeys(("CheckpointIO", "TorchCheckpointIO", "AsyncCheckpointIO"), _IO)
_SYNCS = dict.fromkeys(("LayerSync", "TorchSyncBatchNorm"), _SYNC)
_ENVIRONMENTS = dict.fromkeys(
    (
        "ClusterEnvironment",
        "KubeflowEnvironment",
        "LSFEnvironment",
        "LightningEnvironment",
        "MPIEnvironment",
        "SLURMEnvironment",
        "TorchElasticEnvironment",
    ),
    _ENV,
)

#: Lightning module path -> {name: home}, as :data:`trainer.lightning.TREE`'s entries.
PLUGINS_TREE: dict[str, dict[str, str]] = {
    "plugins": {
        **_PRECISIONS,
        **_IOS,
        **_SYNCS,
        **{sub: "/" for sub in ("environments", "io", "layer_sync", "precision")},
    },
    "plugins.environments": _ENVIRONMENTS,
    "plugins.io": {**_IOS, **{sub: "/" for sub in ("async_plugin", "checkpoint_plugin", "torch_plugin", "wrapper")}},
    "plugins.io.async_plugin": {"AsyncCheckpointIO": _IO},
    "plugins.io.checkpoint_plugin": {"CheckpointIO": _IO},
    "plugins.io.torch_plugin": {"TorchCheckpointIO": _IO},
    "plugins.io.wrapper": {},
    "plugins.layer_sync": _SYNCS,
    "plugins.precision": {
        **_PRECISIONS,
        **{sub: "/" for sub in ("amp", "double", "fsdp", "half", "precision")},
    },
    "plugins.precision.amp": {"MixedPrecision": _PRECISION},
    "plugins.precision.double": {"DoublePrecision": _PRECISION},
    "plugins.precision.fsdp": {"FSDPPrecision": _FSDP},
    "plugins.precision.half": {"HalfPrecision": _PRECISION},
    "plugins.precision.precision": {"Precision": _PRECISION},
}

_NOT_OFFERED = (
    "not offered by geartrain (no TPU/XLA, DeepSpeed, bitsandbytes or Transformer Engine): "
    "use Trainer(precision='16-mixed', 'bf16-mixed', 'bf16-true', '16-true' or '64-true')"
)
#: The plugin paths and names geartrain refuses, with the reason (merged into ``REFUSED``).
PLUGINS_REFUSED: dict[str, str] = {
    **{
        f"{where}.{name}": _NOT_OFFERED
        for where in ("plugins", "plugins.precision")
        for name in ("BitsandbytesPrecision", "DeepSpeedPrecision", "TransformerEnginePrecision", "XLAPrecision")
    },
    "plugins.XLACheckpointIO": _NOT_OFFERED,
    "plugins.io.XLACheckpointIO": _NOT_OFFERED,
    "plugins.io.xla_plugin": _NOT_OFFERED,
    "plugins.environments.XLAEnvironment": _NOT_OFFERED,
    "plugins.precision.bitsandbytes": _NOT_OFFERED,
    "plugins.precision.deepspeed": _NOT_OFFERED,
    "plugins.precision.transformer_engine": _NOT_OFFERED,
    "plugins.precision.xla": _NOT_OFFERED,
    "plugins.precision.double.LightningDoublePrecisionModule": (
        "Lightning 1.x's wrapper of a module under double precision: Trainer(precision='64-true') converts "
        "the module itself"
    ),
}
