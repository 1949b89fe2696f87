"""Every test's outcome sorted into one class, with a cause that groups failures of one reason.

Classes, in the order they are decided:

* ``passed`` (an expected failure that failed, ``xfailed``, is Lightning's outcome too: passed);
* ``crash or hang``: the per-test timeout, or the process died or was interrupted in the test;
* ``needs Lightning internals``: the test used a private name, the loops, a connector, patched a
  private name, or used a fixture that fakes hardware by patching Lightning (see
  ``harness/gt_suite_rules.py``): such a test says nothing about a program's behaviour, whatever
  else it meets;
* ``documented difference``: the test or its error matches a row of ``data/documented.csv``, which
  names the difference documented in docs/lightning.md;
* ``missing public name``: the test used a public Lightning name geartrain does not map;
* ``behaviour difference``: everything else; its cause is the error line with numbers and paths
  blanked, so equal reasons group together.

Skipped tests are counted apart (not in scope of the pass rate), and so are tests that fail for
want of the network (Lightning's MNIST helpers download their data) or of a test requirement not
installed in the scratch environment (a third-party ``ModuleNotFoundError``).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from tools.lightning_suite.harness import gt_suite_rules as rules

PASSED = "passed"
CRASH = "crash or hang"
DOCUMENTED = "documented difference"
INTERNALS = "needs Lightning internals"
MISSING = "missing public name"
BEHAVIOUR = "behaviour difference"
SKIPPED = "skipped"
CLASSES = (PASSED, INTERNALS, MISSING, DOCUMENTED, BEHAVIOUR, CRASH)

DOCUMENTED_CSV = Path(__file__).parent / "data" / "documented.csv"

_INTERNAL_USED = re.compile(r"harness: the test uses Lightning internal (\S+)")
_MISSING_USED = re.compile(r"harness: the test uses a public name geartrain lacks: (\S+)")
_REFUSED_USED = re.compile(
    r"harness: the test uses a name geartrain refuses by name: \S+ \((.*?)(; see docs/lightning\.md)?\)$", re.M
)
_FIXTURE = "harness: this fixture fakes hardware by patching Lightning internals"
_NO_MODULE = re.compile(r"No module named '([\w.]+)'")
_CANNOT_IMPORT = re.compile(r"cannot import name '(\w+)' from '([\w.]+)'")
_MODULE_ATTR = re.compile(r"module '([\w.]+)' has no attribute '(\w+)'")
_OBJECT_ATTR = re.compile(r"'(\w+)' object has no attribute '(\w+)'|type object '(\w+)' has no attribute '(\w+)'")
_MOCK_ATTR = re.compile(r"does not have the attribute '(\w+)'")
#: An ``AttributeError`` anywhere in a report, its quotes possibly escaped (a worker's traceback in a message).
_WRAPPED_ATTR = re.compile(
    r"(?:AttributeError: |Actual message: \")[\\]*'(\w+)[\\]*' object has no attribute [\\]*'(\w+)[\\]*'"
)
_NETWORK = re.compile(r"socket\.gaierror|Name or service not known|Temporary failure in name resolution")
#: Lightning's back-compatibility tests read an archive of old checkpoints its CI downloads (``tests/legacy``).
_LEGACY_ARCHIVE = re.compile(
    r"No such file or directory: '[^']*/legacy/(back-compatible-versions\.txt|checkpoints/)"
    r"|No checkpoints found in folder \"[^\"]*/legacy/checkpoints/"
)
_OURS = ("trainer", "callbacks", "strategies", "lightning", "tests_pytorch")
#: Lightning's migration tests assert that no ``pytorch_lightning`` module exists: the alias is one.
_ALIAS_IS_STANDALONE = "Should not import standalone package"
_INTERRUPTED = "a KeyboardInterrupt left this test"
#: A test that patches a private name of Lightning's (``@patch("lightning.fabric.utilities.data._num_cpus_available")``).
_PATCHES_PRIVATE = re.compile(r"[\"'](?:lightning|pytorch_lightning)\.[\w.]*?\._\w+[\"']")
_PLACEHOLDER_TYPE = re.compile(r"got 'Placeholder'")
_TIMEOUT = re.compile(r"Failed: Timeout \(?>|\+{5} Timeout \+{5}")
#: Classes whose missing attributes are Lightning public API when the name is public.
_API_CLASSES = frozenset(
    {
        *("Trainer", "TrainModule", "LightningModule", "DataModule", "LightningDataModule", "Callback", "Tuner"),
        *("RunningStage", "TrainerFn", "TrainerState", "TrainerStatus", "CombinedLoader", "AttributeDict"),
        *("ModelCheckpoint", "EarlyStopping", "LearningRateMonitor", "ModelSummary", "Timer", "ProgressBar"),
        *("TQDMProgressBar", "RichProgressBar", "BasePredictionWriter", "StochasticWeightAveraging"),
        *("Logger", "TensorBoardLogger", "CSVLogger", "Strategy", "SingleDeviceStrategy", "DDPStrategy"),
        *("FSDPStrategy", "Profiler", "SimpleProfiler", "AdvancedProfiler", "PyTorchProfiler"),
        *("BoringModel", "BoringDataModule", "DemoModel"),  # Lightning's test models: LightningModule's attributes
    }
)


@dataclass(frozen=True)
class Documented:
    """A row of ``data/documented.csv``: which tests or errors, and the difference they show."""

    match: str
    cause: str

    def matches(self, nodeid: str, text: str) -> bool:
        """Whether this row covers the test ``nodeid`` failing with ``text``."""
        kind, _, value = self.match.partition(":")
        if kind == "test":
            return nodeid == value or nodeid.startswith(value + "[") or nodeid.startswith(value + "::")
        if kind == "error":
            return re.search(value, text) is not None
        raise ValueError(f"documented.csv: a match is 'test:<node id>' or 'error:<regex>', not {self.match!r}")


def load_documented(path: Path = DOCUMENTED_CSV) -> list[Documented]:
    """The rows of the documented-differences file (columns ``match``, ``cause``)."""
    with path.open(encoding="utf-8", newline="") as handle:
        return [Documented(row["match"], row["cause"]) for row in csv.DictReader(handle)]


def error_line(text: str) -> str:
    """The line of a pytest report that says what went wrong (its first ``E`` line), else its last line."""
    lines = text.splitlines()
    for line in lines:
        if line.startswith("E ") or line == "E":
            stripped = line[1:].strip()
            if stripped:
                return stripped
    for line in lines:
        if line.startswith("harness:"):
            return line
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def normalise(line: str) -> str:
    """``line`` with addresses, paths, numbers and long quotes blanked, so one reason is one cause."""
    line = re.sub(r"0x[0-9a-f]+", "0x…", line)
    line = re.sub(r"(?<![\w)])(/[\w.\-=]+){2,}/?", "<path>", line)
    line = re.sub(r"\b\d+(\.\d+)?(e-?\d+)?\b", "N", line)
    line = re.sub(r"'[^']{60,}'", "'…'", line)
    return line[:200]


def _lightning_name(module: str, name: str | None) -> tuple[str, str] | None:
    """(class, cause) for a Lightning module path (and name) that the test could not get, or None."""
    path = rules.canonical(module)
    if path is None:
        return None
    full = ".".join(part for part in ("lightning.pytorch", path, name) if part)
    internal = rules.is_internal_module(path) or (name is not None and rules.is_private(name))
    return (INTERNALS, f"internal {full}") if internal else (MISSING, f"missing {full}")


def classify(outcome: str, text: str, nodeid: str = "", documented: list[Documented] | None = None) -> tuple[str, str]:
    """(class, cause) of one test from its outcome and report text."""
    if outcome in ("passed", "xfailed"):
        return PASSED, ""
    if outcome == "skipped":
        return SKIPPED, error_line(text)
    if _NETWORK.search(text):
        return SKIPPED, "needs the network (downloads a data set): not measured"
    if _LEGACY_ARCHIVE.search(text):
        return SKIPPED, "needs Lightning's archive of old checkpoints (its CI downloads it): not measured"
    found = _NO_MODULE.search(error_line(text))
    if found and rules.canonical(found.group(1)) is None and not found.group(1).startswith(_OURS):
        return SKIPPED, f"a test requirement is not installed here: {found.group(1).split('.')[0]}"
    if outcome == "crashed" and _INTERRUPTED in text:
        return (
            BEHAVIOUR,
            "KeyboardInterrupt raised inside a run reached the caller (Lightning: caught, run marked interrupted)",
        )
    if outcome == "crashed" or _TIMEOUT.search(text):
        return CRASH, "timeout" if _TIMEOUT.search(text) else error_line(text)
    line = error_line(text)
    internal = _internal(text, line)
    if internal:
        return INTERNALS, internal
    for row in documented or ():
        if row.matches(nodeid, text):
            return DOCUMENTED, row.cause
    found = _REFUSED_USED.search(text)
    if found:
        return (
            DOCUMENTED,
            f"refused by name in trainer.lightning.REFUSED: {found.group(1)} (docs/lightning.md, module tree)",
        )
    found = _MISSING_USED.search(text)
    if found:
        return MISSING, f"missing {found.group(1)}"
    for pattern, module_group, name_group in ((_NO_MODULE, 1, None), (_CANNOT_IMPORT, 2, 1), (_MODULE_ATTR, 1, 2)):
        found = pattern.search(line)
        if found:
            verdict = _lightning_name(found.group(module_group), found.group(name_group) if name_group else None)
            if verdict:
                return verdict
    owner, attr = _owner_attr(line)
    if owner in _API_CLASSES:
        return MISSING, f"missing {owner}.{attr}"
    return BEHAVIOUR, normalise(line)


def _internal(text: str, line: str) -> str | None:
    """The Lightning internal a failed test needed (its cause), or None."""
    if _FIXTURE in text:
        return "fixture that fakes hardware (cuda_count_N, tpu_available, ...)"
    if _ALIAS_IS_STANDALONE in text:
        return "Lightning's checkpoint migration (its test sees the alias's pytorch_lightning module)"
    found = _INTERNAL_USED.search(text)
    if found:
        return f"internal {_short(found.group(1))}"
    found = _PATCHES_PRIVATE.search(text)
    if found:
        return f"patches internal {_short(found.group(0).strip(chr(34) + chr(39)))}"
    if _PLACEHOLDER_TYPE.search(line):
        return "internal used as an exception type"
    for pattern, module_group, name_group in ((_NO_MODULE, 1, None), (_CANNOT_IMPORT, 2, 1), (_MODULE_ATTR, 1, 2)):
        found = pattern.search(line)
        if found:
            verdict = _lightning_name(found.group(module_group), found.group(name_group) if name_group else None)
            if verdict and verdict[0] == INTERNALS:
                return verdict[1]
    owner, attr = _owner_attr(line)
    if owner and (rules.is_private(attr) or attr in rules.INTERNAL_ATTRS):
        return f"internal {owner}.{attr}"
    found = _MOCK_ATTR.search(line)
    if found and (rules.is_private(found.group(1)) or found.group(1) in rules.INTERNAL_ATTRS):
        return f"internal {found.group(1)}"
    # The test's own code read a loop attribute inside the run, and the error reached the test wrapped:
    # a ``ddp_spawn`` worker's traceback, or the "Actual message" of ``pytest.raises(match=...)``.
    for found in _WRAPPED_ATTR.finditer(text):
        if found.group(2) in rules.INTERNAL_ATTRS or (
            rules.is_private(found.group(2)) and _read_by_the_test(text[: found.start()])
        ):
            return f"internal {found.group(1)}.{found.group(2)}"
    return None


def _read_by_the_test(before: str) -> bool:
    """Whether the traceback frame just before an error (the last ``File "..."`` line of ``before``) is a file of
    Lightning's tests: their own code read the private name (``trainer._accelerator_connector`` in a callback run by
    a ``ddp_spawn`` worker), not geartrain's."""
    frames = re.findall(r'File [\\]*"([^"\\]+)', before)
    return bool(frames) and "tests_pytorch/" in frames[-1]


def _owner_attr(line: str) -> tuple[str, str]:
    """(class, attribute) of an ``AttributeError`` about an object's or a class's attribute, else ("", "")."""
    found = _OBJECT_ATTR.search(line)
    if not found:
        return "", ""
    return (found.group(1), found.group(2)) if found.group(1) else (found.group(3), found.group(4))


def _short(name: str) -> str:
    """An internal's name cut after its first private or internal part (``lightning.pytorch.loops``)."""
    parts = name.split(".")
    for i in range(2, len(parts) + 1):
        path = rules.canonical(".".join(parts[:i]))
        if path and rules.is_internal_module(path):
            return ".".join(parts[:i])
    return ".".join(parts[:5])
