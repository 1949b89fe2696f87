"""The shape of the code, kept: rooms that say what they are for, a map of every file, loops that use
the trainer's documented attributes only, and options described once (docs/architecture.md, "Rooms and
the direction of imports").

These read the source as text; they fail when a file is added without a place on the map, when a
file grows long without a reason on record, or when a loop reaches into the trainer's private state.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

PACKAGES = ("trainer", "strategies", "callbacks")
SOURCES = sorted(p for package in PACKAGES for p in (REPO_ROOT / package).rglob("*.py"))
ARCHITECTURE = (REPO_ROOT / "docs" / "architecture.md").read_text()


def _table_paths(section: str) -> list[str]:
    """The backticked paths in the first column of the table under ``## section``."""
    body = ARCHITECTURE.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([\w/.]+\.py)` \|", body, flags=re.M)


def _rel(path: Path) -> str:
    return path.relative_to(REPO_ROOT).as_posix()


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_source_files_say_what_they_are_for_and_long_ones_why(path: Path) -> None:
    text = path.read_text()
    if path.name != "__init__.py" or text.strip():
        assert ast.get_docstring(ast.parse(text)), f"{path.name} has no opening docstring saying what it is for"
    if len(text.splitlines()) > 400:
        assert _rel(path) in _table_paths("Long files"), (
            f"{_rel(path)} has more than 400 lines: split it by responsibility, or say in docs/architecture.md "
            "('Long files') why it is one subject"
        )


def test_the_map_names_every_source_file_once() -> None:
    listed = _table_paths("Every file")
    doubles = sorted({p for p in listed if listed.count(p) > 1})
    assert not doubles, f"named twice in docs/architecture.md: {doubles}"
    on_disk = {_rel(p) for p in SOURCES}
    assert sorted(on_disk - set(listed)) == [], "add these files to docs/architecture.md's 'Every file' table"
    assert sorted(set(listed) - on_disk) == [], "docs/architecture.md names files that no longer exist"


def test_long_files_on_record_are_still_long() -> None:
    for name in _table_paths("Long files"):
        assert len((REPO_ROOT / name).read_text().splitlines()) > 400, f"{name} is short now: take it off the list"


def test_every_trainer_argument_is_described_once() -> None:
    from trainer import Trainer
    from trainer.arguments import TRAINER_ARGS

    described = re.findall(r"^        (\w+): ", TRAINER_ARGS, flags=re.M)
    parameters = [name for name in inspect.signature(Trainer).parameters]
    assert sorted({d for d in described if described.count(d) > 1}) == []
    missing = [name for name in parameters if name not in described]
    assert missing == [], f"describe these Trainer arguments in trainer/arguments.py TRAINER_ARGS: {missing}"
    unknown = [name for name in described if name not in parameters]
    assert unknown == [], f"TRAINER_ARGS describes arguments the Trainer does not take: {unknown}"


def test_loops_reach_the_trainer_through_documented_attributes_only() -> None:
    loop_files = [*(REPO_ROOT / "trainer" / "loops").glob("*.py"), REPO_ROOT / "trainer" / "data" / "microbatch.py"]
    reaches = {p.name: re.findall(r"\btrainer\._\w+", p.read_text()) for p in loop_files}
    assert {name: found for name, found in reaches.items() if found} == {}


def test_only_the_trainer_and_lightnings_settable_attributes_are_assigned_from_outside() -> None:
    """The run's state is written in the run state, not on the Trainer (docs/architecture.md, "The run state")."""
    settable = {"should_stop", "optimizers", "lr_scheduler_configs", "accumulate_grad_batches"}
    # Code as ruff formats it (spaces around the operator); prose such as ``trainer.max_epochs=3`` is not.
    pattern = re.compile(r"(?<![\w.`])(?:trainer|t|self\.trainer|self\._trainer)\.([a-z_]+) (?:=|\+=|-=) ")
    found: dict[str, set[str]] = {}
    for path in SOURCES:
        if _rel(path) == "trainer/trainer.py":
            continue
        for line in path.read_text().splitlines():
            for name in pattern.findall(line):
                if name not in settable:
                    found.setdefault(name, set()).add(_rel(path))
    assert found == {}


def test_no_file_points_to_a_design_page_outside_the_repository() -> None:
    """The rules live in docs/architecture.md: no tracked file cites a page a maintainer cannot open."""
    import subprocess

    outside = ("DESIGN" + ".md", "STYLE" + ".md")  # spelled apart, so this file does not name them
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    citing = [
        name
        for name in tracked.stdout.splitlines()
        if (REPO_ROOT / name).is_file()
        and any(page in (REPO_ROOT / name).read_text(errors="replace") for page in outside)
    ]
    assert not citing, f"these cite pages that are not in the repository (say it in docs/architecture.md): {citing}"
