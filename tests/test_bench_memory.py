"""The memory benchmark runs end to end at a small size and measures real, plausible figures."""

from __future__ import annotations

import math

import pytest

from bench import memory

pytestmark = pytest.mark.slow  # every test here starts processes


@pytest.mark.timeout(180)
def test_quick_memory_benchmark_measures_both_comparisons() -> None:
    rows = memory.run(quick=True)
    assert [row["name"] for row in rows] == [
        "peak memory, geartrain fit vs hand-written loop (MiB)",
        "peak memory, activation checkpointing on vs off (MiB)",
    ]
    for row in rows:
        assert set(row) == {"name", "geartrain", "baseline", "ratio", "target", "ok"}
        assert row["geartrain"] > 1 and row["baseline"] > 1  # MiB above baseline: training allocates
        assert math.isclose(row["ratio"], row["geartrain"] / row["baseline"], rel_tol=1e-2)
        assert row["ok"] == (row["ratio"] <= row["target"])
    loop, checkpointing = rows
    assert checkpointing["baseline"] == loop["geartrain"]  # the same geartrain run, measured once
    # ~10 MiB of activations at this size: recomputing the blocks' must keep fewer resident.
    assert checkpointing["geartrain"] < checkpointing["baseline"]
