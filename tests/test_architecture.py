"""The shape of the code, kept: small rooms that say what they are for, and loops that use the
trainer's documented attributes only (DESIGN.md, "Rooms and the direction of imports").

These read the source as text; they fail when a change grows a file past the limit or lets a loop
reach into the trainer's private state again.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

PACKAGES = ("trainer", "strategies", "callbacks")
SOURCES = sorted(p for package in PACKAGES for p in (REPO_ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_source_files_are_small_rooms_that_say_what_they_are_for(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= 400, f"{path.name} has more than 400 lines: split it by responsibility"
    if path.name != "__init__.py" or text.strip():
        assert ast.get_docstring(ast.parse(text)), f"{path.name} has no opening docstring saying what it is for"


def test_loops_reach_the_trainer_through_documented_attributes_only() -> None:
    loop_files = [*(REPO_ROOT / "trainer" / "loops").glob("*.py"), REPO_ROOT / "trainer" / "data" / "microbatch.py"]
    reaches = {p.name: re.findall(r"\btrainer\._\w+", p.read_text()) for p in loop_files}
    assert {name: found for name, found in reaches.items() if found} == {}
