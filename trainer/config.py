"""Dataclass schemas behind the Hydra config groups, registered in Hydra's ConfigStore.

A YAML file in ``conf/trainer/``, ``conf/strategy/`` or ``conf/optim/`` names its schema first in its defaults list
(``- /schema/strategy@_here_: single``),
so a typo'd key (``trainer.max_epoch=3``) or a value of the wrong type (``trainer.max_epochs=abc``)
fails while the config is composed, before anything runs, with a message naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional  # noqa: UP035

__all__ = ["OptimConfig", "SGDOptimConfig", "TrainerConfig", "register_configs"]


# OmegaConf reads these annotations at run time: they must be typing forms it knows (Optional, Any),
# not PEP 604 unions.
@dataclass
class TrainerConfig:
    """Every ``Trainer`` option that a config can set (``strategy`` and ``callbacks`` come from their groups)."""

    accelerator: str = "auto"
    devices: Any = "auto"
    num_nodes: int = 1
    #: A name ("16-mixed") or Lightning's short spellings (16, "bf16", 64).
    precision: Any = None
    max_epochs: Optional[int] = None  # noqa: UP045
    min_epochs: Optional[int] = None  # noqa: UP045
    max_steps: int = -1
    min_steps: Optional[int] = None  # noqa: UP045
    #: "DD:HH:MM:SS" or a dict such as {hours: 5}.
    max_time: Any = None
    overfit_batches: Any = 0.0
    accumulate_grad_batches: int = 1
    gradient_clip_val: Optional[float] = None  # noqa: UP045
    gradient_clip_algorithm: str = "norm"
    val_check_interval: Any = None
    check_val_every_n_epoch: Optional[int] = 1  # noqa: UP045
    limit_train_batches: Any = None
    limit_val_batches: Any = None
    limit_test_batches: Any = None
    limit_predict_batches: Any = None
    num_sanity_val_steps: int = 2
    fast_dev_run: Any = False
    log_every_n_steps: int = 50
    #: true, false or "warn".
    deterministic: Any = False
    enable_progress_bar: bool = True
    enable_checkpointing: bool = True
    enable_model_summary: Optional[bool] = None  # noqa: UP045
    logger: bool = True
    benchmark: Optional[bool] = None  # noqa: UP045
    inference_mode: bool = True
    use_distributed_sampler: bool = True
    detect_anomaly: bool = False
    barebones: bool = False
    sync_batchnorm: bool = False
    reload_dataloaders_every_n_epochs: int = 0
    #: Refused until they exist (the Trainer's message names the alternative).
    profiler: Any = None
    plugins: Any = None
    enable_autolog_hparams: bool = True
    model_registry: Optional[str] = None  # noqa: UP045
    on_nonfinite: Optional[str] = None  # noqa: UP045
    max_nonfinite_in_a_row: int = 3
    preemption_exit_code: Optional[int] = 0  # noqa: UP045
    slurm_requeue: bool = True
    compile: bool = False
    compile_kwargs: Optional[Dict[str, Any]] = None  # noqa: UP006, UP045
    #: "auto", a positive int, or null (no micro-batching).
    micro_batch_size: Any = None
    #: Dotted class paths of blocks whose activations are recomputed in backward.
    activation_checkpointing: Optional[List[str]] = None  # noqa: UP006, UP045

    def __post_init__(self) -> None:
        mbs = self.micro_batch_size
        if mbs is not None and mbs != "auto" and not (isinstance(mbs, int) and not isinstance(mbs, bool) and mbs > 0):
            raise ValueError(f"trainer.micro_batch_size must be 'auto', a positive int or null, got {mbs!r}")
        if self.gradient_clip_algorithm not in ("norm", "value"):
            raise ValueError(
                f"trainer.gradient_clip_algorithm must be 'norm' or 'value', got {self.gradient_clip_algorithm!r}"
            )


@dataclass
class _OneDeviceStrategyConfig:
    _target_: str = ""
    precision: Optional[str] = None  # noqa: UP045
    device: Optional[str] = None  # noqa: UP045


@dataclass
class SingleStrategyConfig(_OneDeviceStrategyConfig):
    """``strategy=single``: one process on one device."""

    _target_: str = "strategies.SingleDeviceStrategy"


@dataclass
class AMPStrategyConfig(_OneDeviceStrategyConfig):
    """``strategy=amp``: one device, mixed precision by default."""

    _target_: str = "strategies.AMPStrategy"


@dataclass
class _ParallelStrategyConfig:
    _target_: str = ""
    devices: Any = "auto"
    num_nodes: int = 1
    precision: Optional[str] = None  # noqa: UP045
    device: Optional[str] = None  # noqa: UP045
    process_group_backend: Optional[str] = None  # noqa: UP045
    timeout: float = 1800.0
    max_restarts: int = 0


@dataclass
class DDPStrategyConfig(_ParallelStrategyConfig):
    """``strategy=ddp``: one process per device, gradients all-reduced in backward."""

    _target_: str = "strategies.DDPStrategy"
    find_unused_parameters: bool = False
    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    #: "popen" (the other ranks run the command again), "spawn" (ddp_spawn: pickled) or "fork" (ddp_fork).
    start_method: str = "popen"
    #: Seconds the processes started here get to save after SIGTERM/SIGINT/SIGHUP/SIGUSR1.
    preemption_grace_period: float = 30.0


@dataclass
class DDPAliasConfig(_ParallelStrategyConfig):
    """Lightning's DDP names (``strategy=ddp_fork``, ``ddp_spawn``, ...): ``null`` keeps the alias's choice."""

    _target_: str = "strategies.registry.build_strategy"
    name: str = "ddp"
    find_unused_parameters: Optional[bool] = None  # noqa: UP045
    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    start_method: Optional[str] = None  # noqa: UP045
    preemption_grace_period: Optional[float] = None  # noqa: UP045


@dataclass
class SingleAliasConfig(_OneDeviceStrategyConfig):
    """``strategy=single_device``: Lightning's name for ``single``."""

    _target_: str = "strategies.registry.build_strategy"
    name: str = "single_device"


@dataclass
class FSDPStrategyConfig(_ParallelStrategyConfig):
    """``strategy=fsdp``: parameters, gradients and optimizer state sharded over the processes."""

    _target_: str = "strategies.FSDPStrategy"
    layer_classes: Optional[List[str]] = None  # noqa: UP006, UP045
    reshard_after_forward: Any = True  # a bool, or a rank count to reshard to
    cpu_offload: bool = False
    state_dict_type: str = "sharded"


@dataclass
class ModelParallelStrategyConfig(_ParallelStrategyConfig):
    """``strategy=model_parallel``: a (data-parallel x tensor-parallel) mesh for the module's configure_model."""

    _target_: str = "strategies.ModelParallelStrategy"
    data_parallel_size: Any = "auto"
    tensor_parallel_size: Any = "auto"
    save_distributed_checkpoint: bool = True


@dataclass
class DPStrategyConfig:
    """``strategy=dp``: ``nn.DataParallel`` over the visible GPUs in one process."""

    _target_: str = "strategies.DataParallelStrategy"
    devices: Any = "auto"
    precision: Optional[str] = None  # noqa: UP045


@dataclass
class OptimConfig:
    """``optim=adamw``: the values its ``optimizer`` and ``scheduler`` entries interpolate.

    ``optimizer`` and ``scheduler`` are ``_partial_`` objects for ``hydra.utils.instantiate``, handed
    to the model, which calls them with its parameters and its optimizer.
    """

    lr: float = 1e-3
    weight_decay: float = 0.0
    optimizer: Any = None
    scheduler: Any = None

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"optim.lr must be a positive learning rate, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")


@dataclass
class SGDOptimConfig(OptimConfig):
    """``optim=sgd``: also the momentum."""

    momentum: float = 0.9

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.momentum < 0:
            raise ValueError(f"optim.momentum must be >= 0, got {self.momentum}")


def register_configs() -> None:
    """Put the schemas into Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(group="schema/trainer", name="trainer", node=TrainerConfig)
    cs.store(group="schema/strategy", name="single", node=SingleStrategyConfig)
    cs.store(group="schema/strategy", name="amp", node=AMPStrategyConfig)
    cs.store(group="schema/strategy", name="ddp", node=DDPStrategyConfig)
    cs.store(group="schema/strategy", name="fsdp", node=FSDPStrategyConfig)
    cs.store(group="schema/strategy", name="dp", node=DPStrategyConfig)
    cs.store(group="schema/strategy", name="ddp_alias", node=DDPAliasConfig)
    cs.store(group="schema/strategy", name="single_alias", node=SingleAliasConfig)
    cs.store(group="schema/strategy", name="model_parallel", node=ModelParallelStrategyConfig)
    cs.store(group="schema/optim", name="adamw", node=OptimConfig)
    cs.store(group="schema/optim", name="sgd", node=SGDOptimConfig)
