"""Running the suite part by part: one pytest process per folder, restarted past a test that kills it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tools.lightning_suite import alias, scope

CRASHED = "harness: the test process died (exit code {code}) while this test ran"
INTERRUPTED = "harness: a KeyboardInterrupt left this test and ended pytest's session"
PART_TIMEOUT = "harness: the part ran past {seconds} s while this test ran (a hang)"


@dataclass
class Settings:
    """How to run: where, with which interpreter, how long a test and a part may take."""

    checkout: Path
    work: Path
    python: str = sys.executable
    test_timeout: int = 60
    part_timeout: int = 3600
    workers: int = 0
    nice: int = 19


def read_records(path: Path) -> list[dict]:
    """The JSON lines of a results file (a last line cut short by a crash is dropped)."""
    records = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def unfinished(records: list[dict]) -> list[str]:
    """Tests that started and never ended (the one a crash or a hang stopped)."""
    started = [r["nodeid"] for r in records if r["event"] == "start"]
    ended = {r["nodeid"] for r in records if r["event"] in ("end", "crash")}
    return [nodeid for nodeid in started if nodeid not in ended]


def command(settings: Settings, files: list[Path], deselect: list[str]) -> list[str]:
    """The pytest command line of one part."""
    cmd = ["nice", "-n", str(settings.nice)] if settings.nice else []
    cmd += [
        settings.python,
        "-m",
        "pytest",
        "-p",
        "suite_plugin",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rN",
        "--continue-on-collection-errors",
    ]
    cmd += ["--timeout", str(settings.test_timeout), "--timeout-method", "signal", "-o", "console_output_style=classic"]
    if settings.workers:
        cmd += ["-n", str(settings.workers)]
    cmd += [str(f) for f in files]
    for nodeid in deselect:
        cmd += ["--deselect", nodeid]
    return cmd


def environment(settings: Settings, results: Path) -> dict[str, str]:
    """The part's environment: the alias first on the path, where results go, the demos' source.

    A ``PYTHONPATH`` the caller set comes after the alias, so a checkout of geartrain other than the
    installed one can be measured (``PYTHONPATH=/path/to/checkout python -m tools.lightning_suite ...``).
    """
    env = dict(os.environ)
    tests = settings.work / "tests"
    paths = [str(settings.work / "site"), str(tests)]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH", "")] if p])
    env["GT_SUITE_RESULTS"] = str(results)
    env["GT_SUITE_DEMOS"] = str(alias.demos_source(settings.checkout))
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PL_DISABLE_FORK"] = "0"
    return env


def run_part(settings: Settings, name: str, files: list[Path], results: Path, log: Path) -> float:
    """Run one part until every test has an outcome; returns the wall time. Appends to ``results``."""
    began = time.monotonic()
    tests = settings.work / "tests"
    for _attempt in range(50):
        records = read_records(results)
        done = sorted({r["nodeid"] for r in records if r["event"] in ("end", "crash")})
        cmd = command(settings, files, done)
        with log.open("a", encoding="utf-8") as out:
            out.write(f"\n=== {name}: {' '.join(cmd[:12])} ... ({len(done)} done)\n")
            out.flush()
            try:
                code = subprocess.run(
                    cmd,
                    cwd=tests,
                    env=environment(settings, results),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=settings.part_timeout,
                    check=False,
                ).returncode
                reason = INTERRUPTED if code == 2 else CRASHED.format(code=code)
            except subprocess.TimeoutExpired:
                code = None
                reason = PART_TIMEOUT.format(seconds=settings.part_timeout)
        if code in (0, 1, 5):  # passed, some failed, nothing collected
            break
        stopped = unfinished(read_records(results))
        if not stopped:
            break  # died outside a test: nothing to skip past
        with results.open("a", encoding="utf-8") as handle:
            for nodeid in stopped:
                handle.write(json.dumps({"event": "crash", "nodeid": nodeid, "longrepr": reason}) + "\n")
    return time.monotonic() - began


def run(
    settings: Settings, out: Path, only: list[str] | None = None, fresh: bool = True, files: list[str] | None = None
) -> dict[str, float]:
    """Build the scratch folder and run every in-scope part (or ``only`` those, or the ``files`` matching);
    results go to ``out/raw``."""
    suite = alias.build(settings.checkout, settings.work)
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    for name, paths in scope.in_scope_files(suite, only, files).items():
        results = raw / f"{name}.jsonl"
        if fresh and results.exists():
            results.unlink()
        times[name] = run_part(settings, name, paths, results, out / "pytest.log")
        (out / "times.json").write_text(json.dumps(times, indent=1), encoding="utf-8")
    return times
