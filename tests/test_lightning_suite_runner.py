"""The conformance runner (tools/lightning_suite): its aliases, its classes, its restarts, on small made-up inputs.

No Lightning checkout is needed: the alias is checked in a fresh interpreter against geartrain's own
tree, the classifier on report texts written here, and the part runner on a three-file suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tools.lightning_suite import alias, report, run, scope
from tools.lightning_suite import classify as cls

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_alias_is_geartrains_modules_and_names_it_lacks_fail_when_used(tmp_path: Path) -> None:
    alias.write_site(tmp_path)
    done = _python(
        """
        import lightning.pytorch as pl, pytorch_lightning, lightning, trainer.lightning, callbacks
        from lightning.pytorch.callbacks import ModelCheckpoint
        from lightning.pytorch.loops import _FitLoop                      # internal: imports, fails when used
        from lightning.pytorch.no_such_module import load_hparams_from_yaml  # not mapped, not refused
        from lightning.pytorch.utilities import _TORCH_GREATER_EQUAL_2_1  # an environment flag
        assert pl is trainer.lightning and pytorch_lightning is pl and lightning.pytorch is pl
        assert pl.callbacks is sys.modules["trainer.lightning.callbacks"]
        assert ModelCheckpoint is callbacks.ModelCheckpoint and lightning.Trainer is pl.Trainer
        assert bool(_TORCH_GREATER_EQUAL_2_1) is True and str(_TORCH_GREATER_EQUAL_2_1) == "True"
        # A Lightning module that is a file of its own in trainer.lightning (the CLI), not a row of the tree:
        from lightning.pytorch.cli import LightningCLI, _NOT_OURS_EITHER  # a name it lacks: a placeholder
        assert LightningCLI is sys.modules["trainer.lightning.cli"].LightningCLI
        import importlib
        key = next(k for k in trainer.lightning.REFUSED if k.rpartition(".")[0] in trainer.lightning.TREE)
        module, _, name = key.rpartition(".")
        refused = getattr(importlib.import_module(f"lightning.pytorch.{module}"), name)  # imports; use fails
        from unittest.mock import Mock

        uses = (lambda: _FitLoop(), lambda: load_hparams_from_yaml("x"), lambda: refused(), lambda: Mock(spec=_FitLoop))
        for used in uses:
            try:
                used()
            except AttributeError as error:
                print(error)
        """.replace("import lightning.pytorch", "import sys, lightning.pytorch", 1),
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    internal, missing, refused, as_spec = done.stdout.splitlines()
    assert as_spec == internal  # a Mock specced on an internal name uses it
    assert cls.classify("failed", f"E   {refused}")[0] == cls.DOCUMENTED
    assert cls.classify("failed", f"E   {internal}") == (cls.INTERNALS, "internal lightning.pytorch.loops")
    assert cls.classify("failed", f"E   {missing}") == (
        cls.MISSING,
        "missing lightning.pytorch.no_such_module.load_hparams_from_yaml",
    )


def test_patching_a_lightning_modules_dict_is_using_its_internals(tmp_path: Path) -> None:
    alias.write_site(tmp_path)
    done = _python(
        """
        import traceback
        from unittest import mock
        import lightning.pytorch
        try:
            with mock.patch.dict("lightning.pytorch.loggers.mlflow.__dict__", {"_MLFLOW_SYNCHRONOUS_AVAILABLE": False}):
                pass
        except Exception:  # the harness's PlaceholderUsed, then mock's TypeError handling it
            traceback.print_exc(file=sys.stdout)
        """.replace("import traceback", "import sys, traceback", 1),
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "uses Lightning internal lightning.pytorch.loggers.mlflow.__dict__" in done.stdout
    assert cls.classify("failed", done.stdout)[0] == cls.INTERNALS


def test_patching_a_method_through_lightnings_path_patches_geartrains_class(tmp_path: Path) -> None:
    """``mock.patch("lightning.pytorch.loggers.tensorboard.TensorBoardLogger.log_hyperparams")``: the class is
    an attribute of the aliased module, not a submodule to make up, so the patch lands on geartrain's class."""
    alias.write_site(tmp_path)
    done = _python(
        """
        from unittest import mock
        import lightning.pytorch, callbacks
        with mock.patch("lightning.pytorch.loggers.tensorboard.TensorBoardLogger.log_hyperparams") as patched:
            assert callbacks.TensorBoardLogger.log_hyperparams is patched
        assert callbacks.TensorBoardLogger.log_hyperparams is not patched
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr


def test_the_alias_imports_afresh_into_a_sys_modules_without_lightnings_modules(tmp_path: Path) -> None:
    """A test that swaps ``sys.modules`` for a copy without every ``*lightning*`` module and imports
    ``lightning.pytorch`` again gets the whole tree again in that copy."""
    alias.write_site(tmp_path)
    done = _python(
        """
        import sys, importlib
        import lightning.pytorch
        first = sys.modules
        sys.modules = {key: value for key, value in first.items() if "lightning" not in key}
        again = importlib.import_module("lightning.pytorch")
        assert "trainer.lightning.callbacks" in sys.modules and again.Trainer.__name__ == "Trainer"
        sys.modules = first
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("outcome", "text", "expected"),
    [
        ("passed", "", (cls.PASSED, "")),
        ("xfailed", "", (cls.PASSED, "")),
        ("skipped", "Requires: [2 CUDA GPUs]", (cls.SKIPPED, "Requires: [2 CUDA GPUs]")),
        ("failed", "E   Failed: Timeout >60.0s", (cls.CRASH, "timeout")),
        (
            "failed",
            "E   ModuleNotFoundError: No module named 'onnxruntime'",
            (cls.SKIPPED, "a test requirement is not installed here: onnxruntime"),
        ),
        (
            "failed",
            "E   socket.gaierror: [Errno -2] Name or service not known",
            (cls.SKIPPED, "needs the network (downloads a data set): not measured"),
        ),
        (
            "failed",
            "E   FileNotFoundError: [Errno 2] No such file or directory: '/w/tests/legacy/back-compatible-versions.txt'",
            (cls.SKIPPED, "needs Lightning's archive of old checkpoints (its CI downloads it): not measured"),
        ),
        (
            "failed",
            'E   AssertionError: No checkpoints found in folder "/w/tests/legacy/checkpoints/1.9.0"',
            (cls.SKIPPED, "needs Lightning's archive of old checkpoints (its CI downloads it): not measured"),
        ),
        ("crashed", run.CRASHED.format(code=-11), (cls.CRASH, run.CRASHED.format(code=-11))),
        (
            "failed",
            "E   AttributeError: 'Trainer' object has no attribute 'fit_loop'",
            (cls.INTERNALS, "internal Trainer.fit_loop"),
        ),
        (  # read by the test's callback inside a ddp_spawn worker: the worker's traceback, quotes escaped
            "failed",
            "E     AttributeError: \\'Trainer\\' object has no attribute \\'fit_loop\\'\nE   WorkerFailedError",
            (cls.INTERNALS, "internal Trainer.fit_loop"),
        ),
        (  # a private name, read by the test's own code (its file is the frame above) inside a worker
            "failed",
            'E   WorkerFailedError: rank 1 failed\nE     File "/w/tests_pytorch/trainer/test_trainer.py", line 9, in '
            "on_predict_epoch_end\nE       if trainer._accelerator_connector.is_distributed:\nE     AttributeError: "
            "'Trainer' object has no attribute '_accelerator_connector'",
            (cls.INTERNALS, "internal Trainer._accelerator_connector"),
        ),
        (  # ... but a private name geartrain's own code lacks is a difference to look at
            "failed",
            'E   WorkerFailedError: rank 1 failed\nE     File "/w/strategies/ddp.py", line 9, in setup\nE     '
            "AttributeError: 'Trainer' object has no attribute '_accelerator_connector'",
            (cls.BEHAVIOUR, "WorkerFailedError: rank N failed"),
        ),
        (  # ... or inside a run whose error pytest.raises(match=...) did not match
            "failed",
            "E   Expected regex: 'crash'\nE   Actual message: \"'Trainer' object has no attribute 'fit_loop'\"\n"
            "E   AssertionError: Regex pattern did not match.",
            (cls.INTERNALS, "internal Trainer.fit_loop"),
        ),
        (
            "failed",
            "E   AttributeError: type object 'EarlyStopping' has no attribute '_log_info'",
            (cls.INTERNALS, "internal EarlyStopping._log_info"),
        ),
        (
            "failed",
            "E   AttributeError: <module 'x'> does not have the attribute '_run_stage'",
            (cls.INTERNALS, "internal _run_stage"),
        ),
        (
            "failed",
            "E   ModuleNotFoundError: No module named 'lightning.pytorch.trainer.connectors'",
            (cls.INTERNALS, "internal lightning.pytorch.trainer.connectors"),
        ),
        (
            "failed",
            "E   ImportError: cannot import name 'LightningCLI' from 'trainer.lightning.cli' (unknown location)",
            (cls.MISSING, "missing lightning.pytorch.cli.LightningCLI"),
        ),
        (
            "failed",
            "E   AttributeError: 'Trainer' object has no attribute 'is_global_zero_ish'",
            (cls.MISSING, "missing Trainer.is_global_zero_ish"),
        ),
        (
            "failed",
            "E   AttributeError: 'NoneType' object has no attribute 'log_dir'",
            (cls.BEHAVIOUR, "AttributeError: 'NoneType' object has no attribute 'log_dir'"),
        ),
        ("failed", "E   assert 3 == 2\nE    +  where 3 = f()", (cls.BEHAVIOUR, "assert N == N")),
        (
            "failed",
            '    @patch("lightning.fabric.utilities.data._num_cpus_available", return_value=4)\nE   Failed: DID NOT WARN',
            (cls.INTERNALS, "patches internal lightning.fabric.utilities.data._num_cpus_available"),
        ),
        (
            "failed",
            "E   CheckpointError: /tmp/pytest-9/x/epoch=1.ckpt is missing, fit/validate said",
            (cls.BEHAVIOUR, "CheckpointError: <path> is missing, fit/validate said"),
        ),
    ],
)
def test_each_outcome_gets_its_class_and_cause(outcome: str, text: str, expected: tuple[str, str]) -> None:
    assert cls.classify(outcome, text, "tests_pytorch/x/test_y.py::test_z") == expected


def test_documented_differences_match_by_test_or_by_error() -> None:
    rows = [
        cls.Documented("test:tests_pytorch/a/test_b.py::test_c", "exact resume keeps the RNG"),
        cls.Documented("error:val_check_interval=.* is refused", "time-based validation refused"),
    ]
    by_id = cls.classify("failed", "E   assert 1 == 2", "tests_pytorch/a/test_b.py::test_c[1-2]", rows)
    by_error = cls.classify("failed", "E   ValueError: val_check_interval='00:01' is refused", "t::u", rows)
    other = cls.classify("failed", "E   assert 1 == 2", "tests_pytorch/a/test_b.py::test_cd", rows)
    assert by_id == (cls.DOCUMENTED, "exact resume keeps the RNG")
    assert by_error == (cls.DOCUMENTED, "time-based validation refused")
    assert other[0] == cls.BEHAVIOUR
    with pytest.raises(ValueError, match="'test:<node id>' or 'error:<regex>'"):
        cls.Documented("regex:x", "y").matches("a", "b")


def test_the_documented_file_reads_and_every_row_names_a_cause() -> None:
    rows = cls.load_documented()
    assert all(row.match.partition(":")[0] in ("test", "error") for row in rows)
    assert all("(docs/lightning.md, " in row.cause for row in rows), "each cause says where it is documented"


def test_scope_keeps_the_parts_in_order_and_lists_each_exclusion_with_its_reason(tmp_path: Path) -> None:
    for relative in [
        "callbacks/test_throughput_monitor.py",
        "trainer/flags/test_a.py",
        "serve/test_servable.py",
        "strategies/test_deepspeed.py",
        "accelerators/test_xla.py",
        "zzz/test_new.py",
    ]:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("")
    parts = scope.in_scope_files(tmp_path)
    assert list(parts) == ["trainer", "callbacks", "zzz"]  # "throughput" does not name "hpu"
    assert set(scope.excluded_files(tmp_path)) == {
        "serve/test_servable.py",
        "strategies/test_deepspeed.py",
        "accelerators/test_xla.py",
    }
    assert list(scope.in_scope_files(tmp_path, only=["zzz"])) == ["zzz"]
    assert {p.name for ps in scope.in_scope_files(tmp_path, files=["flags/"]).values() for p in ps} == {"test_a.py"}


def test_a_part_runs_past_a_test_that_kills_its_process_and_reports_every_test(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    suite = checkout / "tests" / "tests_pytorch"
    (suite / "helpers").mkdir(parents=True)
    (suite / "conftest.py").write_text("")
    (suite / "__init__.py").write_text("")
    (suite / "demo").mkdir()
    (suite / "demo" / "test_one.py").write_text(
        textwrap.dedent(
            """
            import os

            def test_a_pass():
                pass

            def test_b_dies():
                os._exit(3)

            def test_c_fails():
                assert 3 == 2

            def test_d_after():
                pass
            """
        )
    )
    (suite / "demo" / "test_broken.py").write_text(
        "from lightning.pytorch.no_such_module import y\n\n\ndef test_x():\n    y()\n"
    )
    (suite / "demo" / "test_unimportable.py").write_text("raise RuntimeError('no')\n\n\ndef test_y():\n    pass\n")
    out = tmp_path / "out"
    settings = run.Settings(checkout=checkout, work=out / "work", test_timeout=30, part_timeout=300, nice=0)
    run.run(settings, out)
    table = report.write(out)
    rows = {
        json.loads(line)["nodeid"].rpartition("::")[2]: json.loads(line) for line in (out / "outcomes.jsonl").open()
    }
    assert rows["test_a_pass"]["klass"] == cls.PASSED and rows["test_d_after"]["klass"] == cls.PASSED
    assert rows["test_b_dies"]["klass"] == cls.CRASH and "exit code 3" in rows["test_b_dies"]["cause"]
    assert rows["test_c_fails"]["klass"] == cls.BEHAVIOUR
    assert rows["test_x"]["klass"] == cls.MISSING  # the import works; the call names the missing module
    assert rows["test_y"]["outcome"] == "collect error"  # once, though the part was collected twice
    assert "| demo | 6 | 0 | 2 | 0 | 1 | 0 | 2 | 1 | 33% (2/6) |" in table
    assert "test_c_fails" in (out / "causes.md").read_text()


def test_a_callers_pythonpath_follows_the_alias(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout named on PYTHONPATH is what the part imports, after the alias (which must win)."""
    settings = run.Settings(checkout=tmp_path / "pl", work=tmp_path / "work")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere/geartrain")
    paths = run.environment(settings, tmp_path / "r.jsonl")["PYTHONPATH"].split(os.pathsep)
    assert paths[0] == str(tmp_path / "work" / "site")
    assert paths[-1] == "/elsewhere/geartrain"
    monkeypatch.delenv("PYTHONPATH")
    assert "" not in run.environment(settings, tmp_path / "r.jsonl")["PYTHONPATH"].split(os.pathsep)


def test_a_long_report_keeps_its_start_and_its_end() -> None:
    """An assertion's message comes first and the error last: a cut keeps both (the classes read them)."""
    sys.path.insert(0, str(Path(alias.__file__).parent / "harness"))
    try:
        import suite_plugin
    finally:
        sys.path.pop(0)
    text = "AssertionError: Should not import standalone package\n" + "x" * 20000 + "\nE   assert not True"
    kept = suite_plugin.kept(text)
    assert len(kept) <= 8000 + 10 and kept.startswith("AssertionError: Should not import")
    assert kept.endswith("E   assert not True")
    assert suite_plugin.kept("short") == "short"
