"""The sharded-checkpoint benchmark runs (tiny size, 2 gloo ranks); what it measures is in docs/performance.md."""

from __future__ import annotations

import pytest

from bench import sharded_checkpoint


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_run_gives_the_memory_and_time_rows() -> None:
    rows = sharded_checkpoint.run(quick=True)
    assert [r.name.split(",")[0] for r in rows] == ["sharded save", "sharded save vs full", "sharded load vs full"]
    memory = rows[0]
    # Each of 2 ranks holds half of the state; the full gather adds the whole state on rank 0.
    assert memory.ours >= 0.5 and memory.theirs >= 1.4 and memory.ours < memory.theirs
    assert all(r.ours > 0 and r.theirs > 0 for r in rows[1:])
