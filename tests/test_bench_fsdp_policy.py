"""``bench/fsdp_policy.py``: the bf16 policy all-gathers half the bytes autocast did, measured on 2 ranks."""

from __future__ import annotations

import pytest

from bench import fsdp_policy


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_policy_all_gathers_half_the_bytes_of_autocast() -> None:
    out = fsdp_policy.measure(steps=2)
    assert out["autocast"] > 0
    # bfloat16 is 2 bytes, float32 4: the same parameters, shards and padding, half the bytes.
    assert out["ratio"] == 0.5
