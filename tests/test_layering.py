"""The direction of imports (docs/architecture.md, "Rooms and the direction of imports"): the leaf
imports nothing of ours, strategies import torch and the leaf only, callbacks reach the trainer
through its public API (type-only imports).

Two checks for each rule: what importing a module really loads (in a fresh interpreter, so modules
other tests imported do not hide a dependency), and the import statements themselves, which also
finds imports made inside functions, which only run later.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

OURS = ("trainer", "strategies", "callbacks")

# For each module given on the command line: forget every module of ours, import it, and report which
# of ours it loaded. One interpreter for all (torch is imported once); each module starts clean.
_PROBE = """
import importlib, json, sys
import torch
ours = {ours!r}
loaded = {{}}
for name in sys.argv[1:]:
    for key in [k for k in sys.modules if k.split(".")[0] in ours]:
        del sys.modules[key]
    importlib.import_module(name)
    loaded[name] = sorted(k for k in sys.modules if k.split(".")[0] in ours)
print(json.dumps(loaded))
"""


def _modules(package: str) -> list[str]:
    folder = REPO_ROOT / Path(*package.split("."))
    return [f"{package}.{path.stem}" if path.stem != "__init__" else package for path in sorted(folder.glob("*.py"))]


def _loaded_by(modules: list[str]) -> dict[str, list[str]]:
    """Which of our modules importing each of ``modules`` loads, each in a clean state."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(ours=OURS), *modules],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    loaded: dict[str, list[str]] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


def _allowed(module: str, *, package: str) -> bool:
    """True for modules of the leaf, the ``trainer`` package itself (its lazy ``__init__``) and ``package``."""
    return module == "trainer" or module.startswith("trainer.common") or module.split(".")[0] == package


def test_leaf_modules_import_nothing_of_ours() -> None:
    loaded = _loaded_by(_modules("trainer.common"))
    wrong = {
        name: [m for m in mods if not (m == "trainer" or m.startswith("trainer.common"))]
        for name, mods in loaded.items()
    }
    assert all(not mods for mods in wrong.values()), wrong
    assert "trainer.common.tree" in loaded


def test_strategies_import_only_the_leaf_at_runtime() -> None:
    loaded = _loaded_by(_modules("strategies"))
    assert len(loaded) >= 10  # every file of the package was probed
    wrong = {name: [m for m in mods if not _allowed(m, package="strategies")] for name, mods in loaded.items()}
    assert all(not mods for mods in wrong.values()), wrong


def test_callbacks_import_only_the_leaf_at_runtime() -> None:
    loaded = _loaded_by(_modules("callbacks"))
    assert len(loaded) >= 10
    wrong = {name: [m for m in mods if not _allowed(m, package="callbacks")] for name, mods in loaded.items()}
    assert all(not mods for mods in wrong.values()), wrong


def _runtime_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``path`` outside ``if TYPE_CHECKING:`` blocks, functions included."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return found


@pytest.mark.parametrize("package", ["strategies", "callbacks"])
def test_no_runtime_import_of_the_trainer_even_inside_functions(package: str) -> None:
    forbidden = ("callbacks",) if package == "strategies" else ("strategies",)
    bad = []
    for path in sorted((REPO_ROOT / package).glob("*.py")):
        for line, name in _runtime_imports(path):
            root = name.split(".")[0]
            if (root == "trainer" and not name.startswith("trainer.common.")) or root in forbidden:
                bad.append(f"{path.name}:{line} imports {name}")
    assert not bad, "\n".join(bad)


def test_leaf_imports_only_the_standard_library_and_torch() -> None:
    lazy_ok = {"numpy", "omegaconf", "psutil"}  # imported inside the functions that need them
    bad = []
    for path in sorted((REPO_ROOT / "trainer" / "common").glob("*.py")):
        tree = ast.parse(path.read_text())
        top_level = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
                names = [node.module]
            else:
                continue
            for name in names:
                root = name.split(".")[0]
                if (
                    root in sys.stdlib_module_names
                    or root in ("__future__", "torch")
                    or name.startswith("trainer.common")
                ):
                    continue
                if root in lazy_ok and id(node) not in top_level:
                    continue
                bad.append(f"{path.name}:{node.lineno} imports {name}")
    assert not bad, "\n".join(bad)


def test_the_core_never_imports_the_loops() -> None:
    """The loops import the core (the module, the data room, the run state), never the other way round:
    ``manual_backward`` reaches the loops' policy through the run state, ``Window`` is run state."""
    core = [REPO_ROOT / "trainer" / name for name in ("module.py", "run_state.py", "data/loaders.py")]
    bad = [
        f"{path.relative_to(REPO_ROOT)}:{line} imports {name}"
        for path in core
        for line, name in _runtime_imports(path)
        if name.startswith("trainer.loops")
    ]
    assert not bad, "\n".join(bad)
