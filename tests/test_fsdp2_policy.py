"""FSDP2 as FSDP2 is meant to be used: MixedPrecisionPolicy, CPUOffloadPolicy, meta-device builds.

Two gloo processes run every scenario once (:func:`tests.helpers.fsdp2_jobs.fsdp_job`); each test
checks one of them against a hand-written loop or a run without the feature.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.helpers import fsdp2_jobs
from tests.helpers.distributed import spawn


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return spawn(fsdp2_jobs.fsdp_job, str(tmp_path_factory.mktemp("fsdp2")), world_size=2)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# The reference reproduces each rank's bfloat16 forward and backward op for op; what remains is the
# order in which float32 gradients are summed over the ranks and applied, a few float32 ulps per step
# (float32 eps is 1.2e-7, the weights are below 1, lr 0.1, 6 steps). A run that all-gathered float32
# weights (autocast's way) or reduced in bfloat16 (eps 2**-8 = 3.9e-3) is off by ~1e-4 here, which
# the second assertion makes sure the tolerance separates.
BF16_TOLERANCE = 1e-7


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bf16_mixed_policy_equals_a_handwritten_bf16_loop(ranks: list[dict[str, Any]]) -> None:
    reference = fsdp2_jobs.bf16_reference(world=2)
    for rank in ranks:
        assert _max_diff(rank["bf16"], reference) <= BF16_TOLERANCE
        assert _max_diff(rank["bf16_compile"], reference) <= BF16_TOLERANCE  # compile=True composes
    assert _max_diff(ranks[0]["fp32"], reference) > 100 * BF16_TOLERANCE  # float32 training is not it


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bf16_mixed_gathers_bf16_and_keeps_float32_master_weights(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert rank["bf16_compute"] == ["torch.bfloat16"]  # what each Linear's forward saw
        assert rank["bf16_master"] == ["torch.float32"]  # the sharded parameters (DTensor and local shard)
        assert rank["bf16_grads"] == ["torch.float32"]  # gradients reduced and stored in float32
        assert rank["bf16_dtensor"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_activation_checkpointing_and_cpu_offload_change_no_weight(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert _max_diff(rank["bf16_ac"], rank["bf16"]) == 0.0  # recomputation replays the same ops
        assert _max_diff(rank["offload"], rank["fp32"]) == 0.0  # CPUOffloadPolicy only moves storage


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_lightning_fsdp1_arguments_train_as_their_fsdp2_equivalents(ranks: list[dict[str, Any]]) -> None:
    """SHARD_GRAD_OP, CPUOffload, MixedPrecision(bf16) and an activation checkpointing policy (Lightning's
    arguments) train the same weights as precision="bf16-mixed" does, and each took effect."""
    for rank in ranks:
        assert rank["lightning_compute"] == ["torch.bfloat16"]  # the MixedPrecision became the policy
        assert rank["lightning_checkpointed"] > 0  # the Linear blocks are recomputed in backward
        assert _max_diff(rank["lightning"], rank["bf16"]) == 0.0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_meta_build_in_configure_model_equals_a_normal_build(ranks: list[dict[str, Any]]) -> None:
    """The same seed before both builds gives the same weights: materialisation draws each submodule's
    full-size init from the global RNG in construction order, and each rank keeps its shard."""
    total = sum(p.numel() for p in fsdp2_jobs.MetaNet().parameters())
    for rank in ranks:
        assert rank["mesh_size"] == 2  # configure_model saw the device mesh
        assert _max_diff(rank["meta"], rank["fp32"]) == 0.0
        assert rank["meta_local_numel"] < total  # each rank allocated its shards only
    torch.manual_seed(0)
    untrained = {f"net.{k}": v.detach() for k, v in fsdp2_jobs.MetaNet().named_parameters()}
    assert _max_diff(ranks[0]["meta"], untrained) > 0  # and training moved them
