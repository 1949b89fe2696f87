"""A pytest plugin that appends every test's outcome to a JSON-lines file as it happens.

Loaded with ``-p suite_plugin``; the file is ``$GT_SUITE_RESULTS``. A ``start`` line is written before
each test, so a test that kills the interpreter (a segfault, an ``os._exit``) is known afterwards as
the one that started and never finished.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest


def _write(record: dict[str, Any]) -> None:
    path = os.environ.get("GT_SUITE_RESULTS")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _write({"event": "start", "nodeid": nodeid})


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    _write({"event": "end", "nodeid": nodeid})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    outcome: str = report.outcome
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    if report.when != "call" and outcome == "passed":
        return
    text = report.longreprtext if report.failed or report.skipped else ""
    _write(
        {
            "event": "report",
            "nodeid": report.nodeid,
            "when": report.when,
            "outcome": outcome,
            "longrepr": kept(text),
            "duration": round(report.duration, 3),
        }
    )


def kept(text: str, limit: int = 8000) -> str:
    """The report text, cut to ``limit`` characters: its start (an assertion's message) and its end (the error)."""
    if len(text) <= limit:
        return text
    head = limit // 4
    return text[:head] + "\n[...]\n" + text[-(limit - head) :]


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _write({"event": "collect_error", "nodeid": report.nodeid, "longrepr": kept(report.longreprtext)})
