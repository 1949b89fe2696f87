"""Every public module path of ``lightning.pytorch`` resolves under ``trainer.lightning`` or is refused by name.

The walk is Lightning 2.6.5's own tree (``tests/data/lightning_tree.py``: module paths and their
public names, recorded as data). A path or name resolves to an object, or importing it raises an
``ImportError`` carrying its refusal from ``trainer.lightning.REFUSED``, which docs/lightning.md lists.
Also here: the import lines real Lightning programs stopped at, and ``lightning_utilities``'
``rank_zero_only.rank``, which importing Lightning sets and programs read.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import trainer.lightning as pl
from tests.data.lightning_tree import LIGHTNING_2_6_5
from tests.helpers import REPO_ROOT
from trainer.lightning import REFUSED

DOCS = (REPO_ROOT / "docs" / "lightning.md").read_text()


def _refused_key(path: str) -> str | None:
    parts = path.split(".")
    return next((k for k in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if k in REFUSED), None)


@pytest.mark.parametrize("path", sorted(LIGHTNING_2_6_5))
def test_every_lightning_module_path_resolves_or_is_refused_by_name(path: str) -> None:
    full = f"trainer.lightning.{path}" if path else "trainer.lightning"
    key = _refused_key(path) if path else None
    if key is not None:
        with pytest.raises(ImportError, match=re.escape(REFUSED[key])):
            importlib.import_module(full)
        return
    module = importlib.import_module(full)
    for name in LIGHTNING_2_6_5[path]:
        refused = _refused_key(f"{path}.{name}" if path else name)
        if refused is None:
            assert getattr(module, name) is not None, f"lightning.pytorch.{path}: {name}"
            exec(f"from {full} import {name}", {})  # a program's import line
            continue
        with pytest.raises(ImportError, match=re.escape(REFUSED[refused])):
            exec(f"from {full} import {name}", {})


def test_every_refusal_is_a_lightning_path_and_is_named_in_the_docs() -> None:
    names = {f"{path}.{name}" if path else name for path, names in LIGHTNING_2_6_5.items() for name in names}
    stale = [key for key in REFUSED if key not in LIGHTNING_2_6_5 and key not in names]
    assert stale == [], "refusals of paths Lightning 2.6.5 does not have"
    undocumented = [key for key in REFUSED if f"`{key}`" not in DOCS]
    assert undocumented == [], "docs/lightning.md must name each refused path"


def test_the_import_lines_real_programs_stopped_at() -> None:
    namespace: dict[str, object] = {}
    exec(
        "from trainer.lightning.utilities.imports import _TORCHVISION_AVAILABLE, _RICH_AVAILABLE\n"
        "from trainer.lightning.utilities.model_helpers import get_torchvision_model, is_overridden\n"
        "from trainer.lightning.utilities.rank_zero import rank_prefixed_message, rank_zero_only\n"
        "from trainer.lightning.cli import LightningCLI\n"
        "from trainer.lightning import cli_lightning_logo\n",
        namespace,
    )
    assert bool(namespace["_RICH_AVAILABLE"]) is True  # rich is one of geartrain's dependencies
    flag = namespace["_TORCHVISION_AVAILABLE"]
    assert bool(flag) == (importlib.util.find_spec("torchvision") is not None)
    if not flag:  # as in Lightning: the missing requirement, named
        with pytest.raises(ModuleNotFoundError, match="torchvision"):
            namespace["get_torchvision_model"]("resnet18")  # type: ignore[operator]
    assert pl.cli.LightningCLI is namespace["LightningCLI"]
    assert namespace["rank_prefixed_message"]("hi", 1) == "[rank: 1] hi"  # type: ignore[operator]


def _rank_after(code: str, **env: str) -> str:
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "", **env},
        cwd=REPO_ROOT,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_importing_trainer_sets_lightning_utilities_rank_as_lightning_does() -> None:
    before = "from lightning_utilities.core.rank_zero import rank_zero_only\nimport trainer\nprint(rank_zero_only.rank)"
    after = "import trainer.lightning\nfrom lightning_utilities.core.rank_zero import rank_zero_only\nprint(rank_zero_only.rank)"
    kept = (
        "from lightning_utilities.core.rank_zero import rank_zero_only\nrank_zero_only.rank = 3\n"
        "import trainer\nprint(rank_zero_only.rank)"
    )
    cold = "import sys, trainer\nprint('lightning_utilities' in sys.modules)"
    assert _rank_after(before) == "0"
    assert _rank_after(before, RANK="1") == "1"
    assert _rank_after(after, SLURM_PROCID="2") == "2"  # imported later: set then
    assert _rank_after(kept, RANK="1") == "3"  # a rank already set stays, as in Lightning
    assert _rank_after(cold) == "False"  # `import trainer` does not import the package itself


#: A stand-in for lightning_fabric's two warning modules, as fabric 2.6 writes them (this venv lacks fabric).
_FABRIC = {
    "lightning_fabric/__init__.py": "",
    "lightning_fabric/utilities/__init__.py": "",
    "lightning_fabric/utilities/rank_zero.py": (
        "from lightning_utilities.core import rank_zero as rank_zero_module\n"
        "class LightningDeprecationWarning(DeprecationWarning): pass\n"
        "rank_zero_module.rank_zero_deprecation_category = LightningDeprecationWarning\n"
    ),
    "lightning_fabric/utilities/warnings.py": (
        "from lightning_fabric.utilities.rank_zero import LightningDeprecationWarning\n"
        "class PossibleUserWarning(UserWarning): pass\n"
    ),
}
_ONE_CLASS = (
    "import warnings\n"
    "from lightning_fabric.utilities import rank_zero, warnings as fabric\n"
    "from lightning_utilities.core.rank_zero import rank_zero_deprecation_category\n"
    "from trainer.common import errors\n"
    "from trainer.lightning.utilities.warnings import PossibleUserWarning\n"
    "from trainer.lightning.utilities.rank_zero import LightningDeprecationWarning\n"
    "assert PossibleUserWarning is errors.PossibleUserWarning is fabric.PossibleUserWarning\n"
    "assert LightningDeprecationWarning is rank_zero.LightningDeprecationWarning is fabric.LightningDeprecationWarning\n"
    "assert rank_zero_deprecation_category is LightningDeprecationWarning\n"
    "assert trainer.options.PossibleUserWarning is PossibleUserWarning\n"  # what the trainer warns with
    "print('ok')\n"
)


@pytest.mark.parametrize("first", ["fabric", "trainer"])
def test_fabric_warning_classes_are_geartrains_whichever_is_imported_first(first: str, tmp_path: Path) -> None:
    # Lightning re-exports fabric's classes: a filter or pytest.warns given fabric's must match the trainer's warnings.
    for name, text in _FABRIC.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    head = "import trainer.options\n"  # the trainer's warnings module, imported before or after fabric's
    if first == "fabric":
        head = "import lightning_fabric.utilities.warnings\n" + head
    assert _rank_after(head + _ONE_CLASS, PYTHONPATH=str(tmp_path)) == "ok"


@pytest.fixture
def lightning_utilities_rank() -> Iterator[object]:
    from lightning_utilities.core.rank_zero import rank_zero_only

    before = getattr(rank_zero_only, "rank", None)
    yield rank_zero_only
    rank_zero_only.rank = before


def test_a_run_sets_the_rank_to_its_global_rank(
    lightning_utilities_rank: object, make_trainer: object, tmp_path: Path
) -> None:
    from torch.utils.data import DataLoader

    from tests.helpers.jobs import BlockNet, dataset

    lightning_utilities_rank.rank = 7  # type: ignore[attr-defined]
    make_trainer(max_steps=1).fit(BlockNet(), DataLoader(dataset(8), batch_size=4))  # type: ignore[operator]
    assert lightning_utilities_rank.rank == 0  # type: ignore[attr-defined]


def test_rank_zero_experiment_gives_other_ranks_a_dummy(monkeypatch: pytest.MonkeyPatch) -> None:
    # Lightning's docs write a custom logger's `experiment` this way.
    from trainer.lightning.loggers.logger import DummyExperiment, Logger, rank_zero_experiment

    from trainer.common.rank_zero import rank_zero_only

    class Mine(Logger):
        @property
        @rank_zero_experiment
        def experiment(self) -> str:
            return "the real one"

    monkeypatch.setattr(rank_zero_only, "_rank", 1)
    experiment = Mine().experiment
    assert isinstance(experiment, DummyExperiment)
    assert experiment.add_scalar("loss", 1.0) is None and experiment["anything"] is experiment
    monkeypatch.setattr(rank_zero_only, "_rank", 0)
    assert Mine().experiment == "the real one"
