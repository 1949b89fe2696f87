"""FSDP2 and model-parallel options in one process: precision mapping, names, refusals."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from strategies import FSDPStrategy, ModelParallelStrategy
from strategies.fsdp_precision import PolicyPrecision, ScaledPolicyPrecision, mixed_precision_policy
from strategies.precision import HalfPrecision, Precision
from strategies.registry import resolve_strategy
from tests.helpers import jobs
from tests.helpers.trainers import quiet_trainer


def test_bf16_mixed_under_fsdp_is_a_policy_without_autocast() -> None:
    strategy = FSDPStrategy(device="cpu", precision="bf16-mixed")
    assert isinstance(strategy.precision, PolicyPrecision)
    assert type(strategy.precision).forward_context is Precision.forward_context  # nothing entered per step
    policy = mixed_precision_policy(strategy.precision)
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert strategy.precision.name == "bf16-mixed"


def test_16_mixed_under_fsdp_keeps_its_scaler_and_gathers_fp16() -> None:
    strategy = resolve_strategy("fsdp", precision="16-mixed", accelerator="cpu")
    assert isinstance(strategy.precision, ScaledPolicyPrecision)
    assert strategy.precision.scaler is not None
    assert mixed_precision_policy(strategy.precision).param_dtype == torch.float16


def test_true_precisions_and_float32_have_no_policy() -> None:
    for name in ("32-true", "bf16-true"):
        strategy = FSDPStrategy(device="cpu", precision=name)
        assert mixed_precision_policy(strategy.precision).param_dtype is None
    assert isinstance(FSDPStrategy(device="cpu", precision="bf16-true").precision, HalfPrecision)


def test_model_parallel_keeps_autocast_as_lightning() -> None:
    assert not isinstance(ModelParallelStrategy(precision="bf16-mixed").precision, PolicyPrecision)


def test_fsdp_options_and_names() -> None:
    assert resolve_strategy("fsdp_cpu_offload", accelerator="cpu").cpu_offload.offload_params  # type: ignore[attr-defined]
    assert FSDPStrategy(device="cpu", reshard_after_forward=2).reshard_after_forward == 2
    with pytest.raises(ValueError, match="reshard_after_forward"):
        FSDPStrategy(device="cpu", reshard_after_forward=0)
    strategy = resolve_strategy("model_parallel", devices=4, accelerator="cpu")
    assert isinstance(strategy, ModelParallelStrategy) and strategy.world_size == 4


def test_fsdp_takes_lightning_fsdp1_arguments() -> None:
    from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    default = FSDPStrategy(device="cpu")
    assert default.sharding_strategy == ShardingStrategy.FULL_SHARD and default.kwargs == {"use_orig_params": True}
    assert default.cpu_offload == CPUOffload(offload_params=False)
    strategy = FSDPStrategy(
        device="cpu",
        sharding_strategy="shard_grad_op",
        cpu_offload=True,
        mixed_precision=MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float32),
        auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}),
        parallel_devices=[torch.device("cpu")] * 2,
    )
    options = strategy._shard_options()
    assert strategy.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP and options["reshard_after_forward"] is False
    assert strategy.cpu_offload == CPUOffload(offload_params=True)
    assert isinstance(options["offload_policy"], CPUOffloadPolicy)
    assert (options["mp_policy"].param_dtype, options["mp_policy"].reduce_dtype) == (torch.float16, torch.float32)
    assert strategy.mixed_precision_config == strategy.mixed_precision
    assert strategy.layer_classes == [torch.nn.Linear] and strategy.world_size == 2
    assert FSDPStrategy(device="cpu", sharding_strategy=ShardingStrategy.FULL_SHARD).reshard_after_forward is True


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sharding_strategy": "NO_SHARD"}, "use strategy='ddp'"),
        ({"sharding_strategy": "HYBRID_SHARD"}, "use ModelParallelStrategy"),
        ({"sharding_strategy": "SPREAD"}, "expected one of FULL_SHARD"),
        ({"use_orig_params": False}, "always keeps the original parameters"),
        ({"process_group": object()}, r"keyword arguments \['process_group'\]"),
        ({"activation_checkpointing_policy": lambda *_: True}, "not a callable policy"),
        ({"cpu_offload": "yes"}, "takes a bool or a CPUOffload"),
    ],
)
def test_fsdp_refuses_lightning_arguments_fsdp2_cannot_honour(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        FSDPStrategy(device="cpu", **kwargs)


def test_fsdp_refuses_mixed_precision_fields_fsdp2_lacks() -> None:
    from torch.distributed.fsdp import MixedPrecision

    with pytest.raises(ValueError, match="does not cast buffers"):
        FSDPStrategy(device="cpu", mixed_precision=MixedPrecision(buffer_dtype=torch.float16))
    with pytest.raises(ValueError, match="keep_low_precision_grads=False"):
        FSDPStrategy(device="cpu", mixed_precision=MixedPrecision(keep_low_precision_grads=True))


@pytest.mark.parametrize(
    ("dp", "tp", "shape"), [("auto", "auto", (1, 4)), (2, "auto", (2, 2)), ("auto", 2, (2, 2)), (4, 1, (4, 1))]
)
def test_model_parallel_mesh_shape(dp: Any, tp: Any, shape: tuple[int, int]) -> None:
    strategy = ModelParallelStrategy(dp, tp, devices=4)
    assert strategy.mesh_shape() == shape


def test_model_parallel_refuses_sizes_that_do_not_fill_the_world() -> None:
    with pytest.raises(ValueError, match="3 x 1 = 3 ranks, but 4 processes"):
        ModelParallelStrategy(3, 1, devices=4).mesh_shape()
    with pytest.raises(ValueError, match="tensor_parallel_size must be 'auto' or an int >= 1"):
        ModelParallelStrategy(1, 0)


def test_model_parallel_requires_configure_model(tmp_path: Any) -> None:
    trainer = quiet_trainer(tmp_path, strategy=ModelParallelStrategy(device="cpu"), max_steps=1)
    with pytest.raises(TypeError, match="required to override the `configure_model\\(\\)` hook"):
        trainer.fit(jobs.BlockNet(), DataLoader(jobs.dataset(8), batch_size=4))
