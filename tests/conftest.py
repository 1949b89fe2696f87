"""Fixtures of the test suite; the helpers they use live in ``tests/helpers/``."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import numerics

numerics.pin()  # before torch is imported: the recorded numbers hold on any machine (see tests/helpers/numerics.py)
# pytest-xdist workers run side by side: each gets its share of the cores as torch's threads (and passes it on
# to the processes it starts). torch's default, a thread per core in every worker, oversubscribes the machine.
if workers := os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(workers))))

import torch

from tests.helpers.distributed import restored_environment
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer


@pytest.fixture
def make_trainer(tmp_path: Path) -> Callable[..., Trainer]:
    """``make_trainer(**kwargs)``: :func:`~tests.helpers.trainers.quiet_trainer` rooted in this test's tmp_path."""

    def factory(**kwargs: Any) -> Trainer:
        return quiet_trainer(tmp_path, **kwargs)

    return factory


@pytest.fixture
def clean_distributed_env() -> Iterator[None]:
    """Put ``os.environ`` back afterwards and destroy any process group the test created."""
    with restored_environment():
        yield


_DISTRIBUTED_KEYS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


@pytest.fixture(autouse=True)
def _restore_global_state() -> Iterator[None]:
    """Undo what a test did to torch's global switches and the seed environment variables."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    # The distributed variables too: a test that reads a Slurm environment sets MASTER_ADDR, RANK, ...,
    # and a later test's `geartrain` subprocess would inherit them and wait to join a group.
    keys = ("GEARTRAIN_SEED", "GEARTRAIN_SEED_WORKERS", "PL_GLOBAL_SEED", "PL_SEED_WORKERS", "CUBLAS_WORKSPACE_CONFIG")
    keys = (*keys, *_DISTRIBUTED_KEYS)
    env = {k: os.environ.get(k) for k in keys}
    yield
    torch.use_deterministic_algorithms(deterministic)
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


# Scripts that made the files under tests/data (run with pytorch-lightning, not a dependency): not collected.
collect_ignore_glob = ["data/*"]

#: Collected first, so pytest-xdist starts it at once: the linters' cold run overlaps the other tests.
FIRST = "tests/test_lint.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put :data:`FIRST`'s tests at the front; the rest keep their order (every worker sorts alike)."""
    items.sort(key=lambda item: item.nodeid.split("::")[0] != FIRST)


_STARTED = 0.0


def pytest_sessionstart(session: pytest.Session) -> None:
    """Note when the run started, for the closing line's time."""
    import time

    global _STARTED
    _STARTED = time.monotonic()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> Iterator[None]:
    """One closing line a newcomer can read: what passed, failed and was skipped (and why, grouped), and the time.

    Written after pytest's own sections (failures, ``-ra``'s list); pytest's one-line count stays the last
    line (CI reads it), right after this one.
    """
    yield
    import time
    from collections import Counter

    stats = terminalreporter.stats
    counts = {kind: len(stats.get(kind, [])) for kind in ("passed", "failed", "error", "skipped", "xfailed")}
    if not any(counts.values()):
        return
    reasons: Counter[str] = Counter()
    for report in stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        # A docs block's reason starts with its page and line: group by what follows.
        reasons[reason.split(": ", 1)[1] if reason.count(": ") and ".md:" in reason.split(": ", 1)[0] else reason] += 1
    elapsed = time.monotonic() - _STARTED
    parts = [f"{counts['passed']} passed"]
    if counts["failed"] or counts["error"]:
        parts.append(f"{counts['failed'] + counts['error']} FAILED (listed above)")
    if counts["skipped"]:
        why = "; ".join(f"{n} x {r}" if n > 1 else r for r, n in reasons.most_common(3))
        more = f"; {len(reasons) - 3} other reason{'s' if len(reasons) > 4 else ''} above" if len(reasons) > 3 else ""
        parts.append(f"{counts['skipped']} skipped ({why}{more})")
    parts.append(f"in {int(elapsed // 60)} min {int(elapsed % 60)} s")
    verdict = "geartrain tests: " + ", ".join(parts)
    terminalreporter.write_sep("=", "summary", bold=True)
    terminalreporter.write_line(verdict)
