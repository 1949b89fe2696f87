"""ModelParallelStrategy for real: the charlm on a 2x2 and a 1x2 gloo mesh equals one process.

The 2x2 run writes a sharded checkpoint directory; the 1x2 run and one process resume it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from strategies import SingleDeviceStrategy
from tests.helpers import fsdp2_jobs
from tests.helpers.distributed import spawn

pytestmark = pytest.mark.slow  # every test here starts processes

# Tensor parallelism and FSDP sum float32 partial products in another order than one process does
# (~1e-7 relative per gradient). AdamW divides each gradient by its running RMS, which magnifies
# that for near-zero gradients into at most a learning-rate-sized step (lr 3e-3); over 4-8 steps the
# measured worst is ~5e-6 on weights of ~0.1. A wrong plan (unsummed shards, data not sharded over
# the data-parallel ranks only, a missed gradient average) is off by >1e-3.
ATOL = 2e-5


def _assert_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], atol=ATOL, rtol=0, msg=key)


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One process, the whole batch: one epoch, and two epochs straight."""
    root = tmp_path_factory.mktemp("single")
    one, _ = fsdp2_jobs.charlm_train(str(root / "one"), SingleDeviceStrategy(device="cpu"), fsdp2_jobs.TP_GLOBAL_BATCH)
    two, _ = fsdp2_jobs.charlm_train(
        str(root / "two"), SingleDeviceStrategy(device="cpu"), fsdp2_jobs.TP_GLOBAL_BATCH, epochs=2
    )
    return {"one": fsdp2_jobs.full_weights(one), "two": fsdp2_jobs.full_weights(two)}


@pytest.fixture(scope="module")
def mesh_2x2(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return spawn(fsdp2_jobs.model_parallel_job, str(tmp_path_factory.mktemp("mp22")), 2, 2, world_size=4)


@pytest.fixture(scope="module")
def mesh_1x2(tmp_path_factory: pytest.TempPathFactory, mesh_2x2: list[dict[str, Any]]) -> list[dict[str, Any]]:
    root = str(tmp_path_factory.mktemp("mp12"))
    return spawn(fsdp2_jobs.model_parallel_job, root, 1, 2, mesh_2x2[0]["ckpt"], world_size=2)


@pytest.mark.timeout(600)
def test_2x2_mesh_equals_one_process(mesh_2x2: list[dict[str, Any]], single: dict[str, Any]) -> None:
    for rank, out in enumerate(mesh_2x2):
        assert out["mesh"] == (("data_parallel", "tensor_parallel"), (2, 2))
        # Ranks 0, 1 form one tensor-parallel group and take data shard 0; ranks 2, 3 shard 1.
        assert out["sampler"] == {"num_replicas": 2, "rank": rank // 2}
        assert out["tp_sharded"] and out["steps"] == fsdp2_jobs.TP_STEPS
        _assert_close(out["weights"], single["one"])


@pytest.mark.timeout(600)
def test_1x2_mesh_equals_one_process(mesh_1x2: list[dict[str, Any]], single: dict[str, Any]) -> None:
    for out in mesh_1x2:
        assert out["mesh"] == (("data_parallel", "tensor_parallel"), (1, 2))
        assert out["sampler"] == {"num_replicas": 1, "rank": 0}  # both ranks see every batch
        _assert_close(out["weights"], single["one"])


@pytest.mark.timeout(600)
def test_sharded_checkpoint_of_2x2_resumes_on_1x2_and_on_one_process(
    mesh_2x2: list[dict[str, Any]], mesh_1x2: list[dict[str, Any]], single: dict[str, Any], tmp_path: Path
) -> None:
    ckpt = Path(mesh_2x2[0]["ckpt"])
    assert ckpt.is_dir()  # save_distributed_checkpoint=True: each rank wrote its shards
    for out in mesh_1x2:
        assert out["resumed_steps"] == 2 * fsdp2_jobs.TP_STEPS
        _assert_close(out["resumed"], single["two"])
    module, trainer = fsdp2_jobs.charlm_train(
        str(tmp_path), SingleDeviceStrategy(device="cpu"), fsdp2_jobs.TP_GLOBAL_BATCH, epochs=2, ckpt_path=str(ckpt)
    )
    assert trainer.global_step == 2 * fsdp2_jobs.TP_STEPS
    _assert_close(fsdp2_jobs.full_weights(module), single["two"])
    # The resumed runs continued from the checkpoint, not from scratch.
    assert max(float((single["two"][k] - single["one"][k]).abs().max()) for k in single["one"]) > 100 * ATOL


@pytest.mark.timeout(600)
def test_meta_build_on_a_2x2_mesh_equals_a_normal_build(tmp_path: Path) -> None:
    """Tensor parallel then FSDP over the same dimension (strided shards): each rank materialises its
    piece of every full-size init, so the weights equal a normal build's, bitwise."""
    ranks = spawn(fsdp2_jobs.meta_2d_job, str(tmp_path), 2, 2, world_size=4)
    for out in ranks:
        assert out[True].keys() == out[False].keys()
        for key in out[False]:
            assert torch.equal(out[True][key], out[False][key]), key
