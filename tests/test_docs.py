"""Every Python and shell block in README.md and docs/ runs as written.

The blocks of one page run in order, in one temporary folder per page (a later block may use a file
an earlier one wrote), with the repository's ``.venv`` first on ``PATH`` (what
``source .venv/bin/activate`` gives) and the checkout on ``PYTHONPATH`` (what running from the
repository root gives). Python blocks run as a script with this interpreter; shell blocks with bash
``-euo pipefail``, with stand-ins for ``geartrain``, ``python`` and ``torchrun`` first on ``PATH``
(each runs the real program forked from the tests' command server, tests/helpers/command_server.py).
Two HTML comments right before a fence change what happens to it:

- ``<!-- skip-test: REASON -->``: not run (a GPU, a cluster, a server, a long run); the test is
  reported as skipped with REASON, so ``pytest -ra`` lists each one.
- ``<!-- file: PATH -->``: the block is written to PATH in the page's folder instead of run.
- ``<!-- expect: TEXT -->`` (any number): the block's output (stdout and stderr) must hold TEXT;
  ``<!-- expect-once: TEXT -->``: exactly once (a script whose ranks all print shows it once per rank);
  ``<!-- expect-not: TEXT -->``: it must not. A block is checked for what matters, not only its exit code.
- ``<!-- folder: NAME -->``: the block runs in (or writes to) a folder NAME of its own, outside any
  checkout: no links to the repository, no ``PYTHONPATH``; what a newcomer's own project folder has
  is the installed ``geartrain`` (the venv) and what earlier blocks wrote there.

Other languages (``text``, ``yaml``, output listings) are shown, not run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import REPO_ROOT, command_server

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("**/*.md"))]
RUN = {"python": "python", "py": "python", "bash": "shell", "sh": "shell", "shell": "shell"}
TIMEOUT_S = 240
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)\s*$")
MARK = re.compile(
    r"^\s*<!--\s*(?P<kind>skip-test|file|expect|expect-once|expect-not|folder):\s*(?P<value>.*?)\s*-->\s*$"
)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    skip: str | None = None
    file: str | None = None
    expect: tuple[str, ...] = ()
    expect_not: tuple[str, ...] = ()
    folder: str | None = None
    expect_once: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO_ROOT).as_posix()}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` with the markers right before them."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, lang = len(opening["indent"]), opening["lang"].lower()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        code = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
        marks: dict[str, list[str]] = {}
        k = i - 1
        while k >= 0 and (mark := MARK.match(lines[k])):
            marks.setdefault(mark["kind"], []).insert(0, mark["value"])
            k -= 1
        one = {kind: values[-1] for kind, values in marks.items()}
        found.append(
            Block(
                page,
                i + 1,
                lang,
                code,
                one.get("skip-test"),
                one.get("file"),
                tuple(marks.get("expect", [])),
                tuple(marks.get("expect-not", [])),
                one.get("folder"),
                tuple(marks.get("expect-once", [])),
            )
        )
        i = end + 1
    return found


ALL = [b for page in PAGES for b in blocks(page) if b.lang in RUN or b.file is not None]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[Any, Path]:
    """One working folder per page, made on first use."""
    return {}


def top_level_entries() -> set[str]:
    """The repository's tracked top-level files and folders."""
    out = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    return {line.split("/", 1)[0] for line in out.splitlines()}


def folder_for(block: Block, folders: dict[Any, Path], factory: pytest.TempPathFactory) -> Path:
    """The page's folder: a stand-in for the repository root whose entries link to this checkout's.

    Commands that name repository paths (``tests/...``, ``conf/...``, ``.venv/bin/activate``) work
    as from the root, while what the blocks write (``outputs/``, ``my_project/``) stays in the folder.
    A block marked ``folder: NAME`` gets an empty folder of that name instead, one per page.
    """
    if block.folder is not None:
        key = (block.page, block.folder)
        if key not in folders:
            folders[key] = factory.mktemp(block.folder)
        return folders[key]
    if block.page not in folders:
        folder = factory.mktemp(block.page.stem.lower())
        for name in top_level_entries():
            (folder / name).symlink_to(REPO_ROOT / name)
        (folder / ".venv").symlink_to(Path(sys.executable).parent.parent, target_is_directory=True)
        folders[block.page] = folder
    return folders[block.page]


def environment(outside: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "HYDRA_FULL_ERROR"))}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(Path(sys.executable).parent.parent)
    if outside:  # only what the installed geartrain gives
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    env["PYTHONUNBUFFERED"] = "1"
    env["COLUMNS"] = "120"
    return env


def test_the_pages_have_blocks_to_run() -> None:
    assert len(PAGES) > 1, PAGES
    assert sum(b.skip is None and b.file is None for b in ALL) >= 10


def test_the_files_the_pages_name_exist() -> None:
    """Paths such as ``tests/test_resume.py`` or ``conf/callbacks/default.yaml`` in the text are real files."""
    named = re.compile(
        r"`((?:tests|conf|examples|bench|trainer|strategies|callbacks|docs)/[\w./-]+\.(?:py|yaml|md|png|npz|txt))"
    )
    missing = [
        f"{page.relative_to(REPO_ROOT)}: {path}"
        for page in PAGES
        for path in named.findall(page.read_text())
        if not (REPO_ROOT / path).exists() and not re.search(r"[A-Z]{4,}", path)  # not a placeholder (GROUP)
    ]
    assert not missing, missing


def test_every_skip_says_why() -> None:
    for block in ALL:
        assert block.skip is None or len(block.skip) > 8, f"{block.name}: say why it is skipped"


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 30)
@pytest.mark.parametrize("block", ALL, ids=[b.name for b in ALL])
def test_block_runs(block: Block, folders: dict[Any, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    if block.skip is not None:
        pytest.skip(f"{block.name}: {block.skip}")
    cwd = folder_for(block, folders, tmp_path_factory)
    if block.file is not None:
        target = cwd / block.file
        assert target.resolve().is_relative_to(cwd.resolve()), (
            f"{block.name}: {block.file} would write into the checkout"
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.code)
        return
    env = environment(outside=block.folder is not None)
    if RUN[block.lang] == "python":
        # ``python block_N.py``, forked from the tests' command server (tests/helpers/command_server.py).
        script = cwd / f"block_{block.line}.py"
        script.write_text(block.code)
        result = command_server.run([script.name], cwd, env, TIMEOUT_S)
    else:
        # ``geartrain``, ``python`` and ``torchrun`` in the block are stand-ins that run on the same server.
        env["PATH"] = os.pathsep.join([command_server.stand_ins(), env["PATH"]])
        command = [shutil.which("bash") or "/bin/bash", "-euo", "pipefail", "-c", block.code]
        result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, (
        f"{block.name} failed:\n{block.code}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    )
    output = result.stdout + result.stderr
    for text in block.expect:
        assert text in output, f"{block.name}: the output lacks {text!r}:\n{output[-3000:]}"
    for text in block.expect_once:
        assert output.count(text) == 1, (
            f"{block.name}: the output holds {text!r} {output.count(text)} times:\n{output[-3000:]}"
        )
    for text in block.expect_not:
        assert text not in output, f"{block.name}: the output holds {text!r}:\n{output[-3000:]}"


def test_the_readme_leads_in_at_most_250_lines() -> None:
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move the detail to docs/"
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[0].startswith("## Why geartrain"), headings


#: The README's sentence after its script: each strategy it names, written as it says.
SWITCHES = {
    "fsdp": 'strategy="fsdp", devices=2',
    "dp": 'strategy="dp"' if torch.cuda.device_count() < 2 else 'strategy="dp", devices=2',  # 2 needs 2 GPUs
    "single": 'strategy="single"',
    "amp": 'strategy="amp"',
}


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_the_readme_script_trains_with_every_strategy_its_sentence_names(tmp_path: Path) -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    (script,) = [
        b for b in blocks(REPO_ROOT / "README.md") if b.lang == "python" and 'strategy="ddp", devices=2' in b.code
    ]
    for name in SWITCHES:
        assert f'"{name}"' in readme[readme.index("in place of") - 200 : readme.index("in place of") + 300], name
    running = {}
    for name, written in SWITCHES.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "train.py").write_text(script.code.replace('strategy="ddp", devices=2', written))
        running[name] = command_server.start(["train.py"], folder, environment(outside=True), merge=True)
    for name, proc in running.items():
        output, _ = proc.communicate(timeout=TIMEOUT_S)
        assert proc.returncode == 0 and output.count("val/loss 0.") == 1, f"strategy {name}:\n{output[-3000:]}"


def test_make_test_ends_with_a_line_a_newcomer_can_read(tmp_path: Path) -> None:
    """The suite's conftest adds one line before pytest's count: passed, skipped with reasons, time."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_sessionstart, pytest_terminal_summary\n")
    (tmp_path / "test_small.py").write_text(
        "import pytest\n\ndef test_one():\n    pass\n\ndef test_two():\n    pytest.skip('needs a GPU')\n"
    )
    env = {**environment(), "PYTHONPATH": str(REPO_ROOT)}
    # A new interpreter: forked from the server, pytest would warn that Hydra's plugin was imported before it.
    argv = ["-m", "pytest", "-p", "no:cacheprovider", "-ra", str(tmp_path)]
    result = command_server.run(argv, tmp_path, env, 120, fresh=True)
    lines = result.stdout.strip().splitlines()
    assert re.fullmatch(r"geartrain tests: 1 passed, 1 skipped \(needs a GPU\), in 0 min \d+ s", lines[-2]), lines[-6:]
    assert re.search(r"1 passed, 1 skipped in", lines[-1]), lines[-1]  # pytest's own, last, for CI
