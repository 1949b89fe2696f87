"""Which parts of Lightning's ``tests/tests_pytorch`` are run, in which order, and what is left out and why."""

from __future__ import annotations

from pathlib import Path

#: Folders (and top-level files) run first, the most used features first, so a partial run says the most.
FOLDER_ORDER: tuple[str, ...] = (
    "trainer",
    "callbacks",
    "loops",
    "core",
    "checkpointing",
    "loggers",
    "models",
    "tuner",
    "utilities",
    "strategies",
    "profilers",
    "accelerators",
    "plugins",
    "overrides",
    "test_cli.py",
    "helpers",
)

#: Path below ``tests_pytorch`` (folder, file, or a file name's part) -> why it is not run.
EXCLUDED: dict[str, str] = {
    "serve": "Lightning's model-serving helpers (`ServableModule`): geartrain has no serving component",
    "graveyard": "names Lightning removed before 2.0: nothing to conform to",
    "deprecated_api": "Lightning's deprecation shims: geartrain never had the deprecated names",
    "demos": "Lightning's demo models are used as fixtures by the other tests, not tested themselves here",
    "tpu": "TPU/XLA hardware: geartrain does not run on TPUs",
    "xla": "TPU/XLA hardware: geartrain does not run on TPUs",
    "hpu": "Habana HPU hardware: not offered by geartrain",
    "deepspeed": "DeepSpeed strategy: not offered by geartrain (refused by name)",
    "bitsandbytes": "bitsandbytes precision plugin: not offered by geartrain (refused by name)",
    "transformer_engine": "NVIDIA transformer-engine precision plugin: not offered by geartrain (refused by name)",
}


def exclusion_reason(relative: str) -> str | None:
    """Why ``relative`` (a path below ``tests_pytorch``) is not run, or None when it is in scope."""
    parts = Path(relative).parts
    for key, why in EXCLUDED.items():
        if key == parts[0] or any(_names(key, part) for part in parts):
            return why
    return None


def _names(key: str, part: str) -> bool:
    """Whether ``part`` (a folder or file name) names ``key`` as a whole word (``test_tpu.py``, not ``throughput``)."""
    stem = part.removesuffix(".py")
    return key in stem.split("_") or ("_" in key and key in stem)


def in_scope_files(suite: Path, only: list[str] | None = None, files: list[str] | None = None) -> dict[str, list[Path]]:
    """The in-scope test files of ``suite`` (a ``tests_pytorch`` folder) by part, in :data:`FOLDER_ORDER`.

    A part is a top-level folder or a top-level test file; parts not in the order come last,
    alphabetically. ``only`` keeps the parts named there; ``files`` the files whose path below
    ``suite`` contains one of its strings.
    """
    parts: dict[str, list[Path]] = {}
    for path in sorted(suite.rglob("test_*.py")):
        relative = path.relative_to(suite).as_posix()
        if exclusion_reason(relative) is not None or (files and not any(f in relative for f in files)):
            continue
        part = relative.split("/")[0]
        parts.setdefault(part, []).append(path)
    rank = {name: i for i, name in enumerate(FOLDER_ORDER)}
    ordered = sorted(parts, key=lambda name: (rank.get(name, len(rank)), name))
    return {name: parts[name] for name in ordered if only is None or name in only}


def excluded_files(suite: Path) -> dict[str, str]:
    """Every test file of ``suite`` left out, with its reason (for the report)."""
    out: dict[str, str] = {}
    for path in sorted(suite.rglob("test_*.py")):
        relative = path.relative_to(suite).as_posix()
        why = exclusion_reason(relative)
        if why is not None:
            out[relative] = why
    return out
