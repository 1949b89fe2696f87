"""The run's outcomes as files: per test (JSON lines, CSV), per part (a table), by cause (a list)."""

from __future__ import annotations

import ast
import csv
import json
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from tools.lightning_suite import classify as cls
from tools.lightning_suite import scope
from tools.lightning_suite.run import read_records


@dataclass
class Row:
    """One test's outcome and class."""

    part: str
    nodeid: str
    outcome: str
    klass: str
    cause: str
    error: str
    duration: float


def final_outcomes(records: list[dict]) -> dict[str, dict]:
    """One outcome per test: a failed set-up or tear-down wins over the call; a crash over everything."""
    final: dict[str, dict] = {}
    for record in records:
        nodeid = record["nodeid"]
        if record["event"] == "crash":
            final[nodeid] = {"outcome": "crashed", "longrepr": record["longrepr"], "duration": 0.0}
        elif record["event"] == "report":
            kept = final.get(nodeid)
            bad = record["outcome"] in ("failed", "crashed")
            if kept is None or (bad and kept["outcome"] not in ("failed", "crashed")):
                final[nodeid] = {k: record[k] for k in ("outcome", "longrepr", "duration")}
                if record["when"] != "call" and record["outcome"] == "failed":
                    final[nodeid]["outcome"] = "failed"
    return final


def tests_in_file(path: Path) -> list[str]:
    """The test functions of a file that failed to import (their parametrisations not expanded)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return []
    names = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            names.append(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names += [
                f"{node.name}::{f.name}"
                for f in node.body
                if isinstance(f, ast.FunctionDef) and f.name.startswith("test")
            ]
    return names


def rows_of(out: Path, documented: list[cls.Documented]) -> list[Row]:
    """Every test's row, from ``out/raw/*.jsonl``."""
    rows: list[Row] = []
    tests_root = out / "work" / "tests"
    for raw in sorted((out / "raw").glob("*.jsonl")):
        part = raw.stem
        records = read_records(raw)
        for nodeid, result in final_outcomes(records).items():
            klass, cause = cls.classify(result["outcome"], result["longrepr"], nodeid, documented)
            error = cls.error_line(result["longrepr"]) if klass != cls.PASSED else ""
            rows.append(Row(part, nodeid, result["outcome"], klass, cause, error[:300], result["duration"]))
        # A restarted part collects its files again: one collection error per file.
        collect_errors = {r["nodeid"]: r for r in records if r["event"] == "collect_error"}
        for record in collect_errors.values():
            klass, cause = cls.classify("failed", record["longrepr"], record["nodeid"], documented)
            error = cls.error_line(record["longrepr"])[:300]
            for name in tests_in_file(tests_root / record["nodeid"]) or ["<file>"]:
                rows.append(Row(part, f"{record['nodeid']}::{name}", "collect error", klass, cause, error, 0.0))
    return rows


def part_table(rows: list[Row]) -> str:
    """The per-part table (markdown): counts per class and the pass rate of tests needing no internals."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for row in rows:
        counts[row.part][row.klass] += 1
    order = {name: i for i, name in enumerate(scope.FOLDER_ORDER)}
    head = ["part", "tests", "skipped", *cls.CLASSES, "pass rate without internals"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    total: Counter[str] = Counter()
    for part in sorted(counts, key=lambda p: (order.get(p, len(order)), p)):
        total.update(counts[part])
        lines.append(_line(part, counts[part]))
    lines.append(_line("**all**", total))
    return "\n".join(lines) + "\n"


def _line(part: str, count: Counter[str]) -> str:
    tests = sum(count.values())
    measured = tests - count[cls.SKIPPED] - count[cls.INTERNALS]
    rate = f"{100 * count[cls.PASSED] / measured:.0f}% ({count[cls.PASSED]}/{measured})" if measured else "-"
    cells = [part, str(tests), str(count[cls.SKIPPED]), *(str(count[k]) for k in cls.CLASSES), rate]
    return "| " + " | ".join(cells) + " |"


def causes(rows: list[Row], top: int | None = 40) -> str:
    """Failures by cause (markdown), most tests first, with two example tests and an error line each.

    ``top`` causes per class (None: every cause).
    """
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in rows:
        if row.klass not in (cls.PASSED, cls.SKIPPED):
            groups[(row.klass, row.cause)].append(row)
    lines = []
    for klass in (cls.BEHAVIOUR, cls.MISSING, cls.CRASH, cls.DOCUMENTED, cls.INTERNALS):
        ranked = sorted(((k, v) for k, v in groups.items() if k[0] == klass), key=lambda kv: -len(kv[1]))
        if not ranked:
            continue
        lines.append(f"\n## {klass}: {sum(len(v) for _, v in ranked)} tests\n")
        for (_, cause), members in ranked[:top]:
            lines.append(f"- **{len(members)}** `{cause}`")
            for row in members[:2]:
                lines.append(f"  - `{row.nodeid}`: `{row.error[:200]}`")
        if top is not None and len(ranked) > top:
            lines.append(f"- ... {len(ranked) - top} more causes, {sum(len(v) for _, v in ranked[top:])} tests")
    return "\n".join(lines) + "\n"


def write(out: Path) -> str:
    """Write ``outcomes.jsonl``, ``outcomes.csv``, ``table.md`` and ``causes.md`` into ``out``; return the table."""
    rows = rows_of(out, cls.load_documented())
    with (out / "outcomes.jsonl").open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(asdict(row)) + "\n")
    with (out / "outcomes.csv").open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(Row.__dataclass_fields__))
        writer.writeheader()
        writer.writerows(asdict(row) for row in rows)
    table = part_table(rows)
    (out / "table.md").write_text(table, encoding="utf-8")
    (out / "causes.md").write_text("# Failures by cause\n" + causes(rows), encoding="utf-8")
    (out / "causes-all.md").write_text("# Failures by cause\n" + causes(rows, top=None), encoding="utf-8")
    return table
