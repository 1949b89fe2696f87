"""The benchmarks run (tiny sizes; no timing is asserted: ``python -m bench`` measures, tests only run it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import core, ddp, gpu_lm
from bench.__main__ import main as bench_main
from bench.core import Result, format_table, paired
from tests.helpers import REPO_ROOT


def test_paired_alternates_and_takes_the_median_ratio() -> None:
    calls: list[str] = []
    times = iter([1.0, 2.0, 3.0, 1.0, 2.0, 2.0, 9.0, 1.0])

    def ours() -> float:
        calls.append("A")
        return next(times)

    def theirs() -> float:
        calls.append("B")
        return next(times)

    a, b, ratio, ratios = paired(ours, theirs, pairs=3, warmup=1)
    assert calls == ["A", "B", "A", "B", "B", "A", "A", "B"]  # warm-up, then A B, B A, A B
    assert ratios == [3.0 / 1.0, 2.0 / 2.0, 9.0 / 1.0] and ratio == 3.0
    assert (a, b) == (3.0, 1.0)


def test_table_marks_pass_and_falls_short() -> None:
    table = format_table([Result("x", 1.0, 1.0, 1.0, "<= 1.03x", True), Result("y", 2.0, 1.0, 2.0, "<= 1.10x", False)])
    assert "| x " in table and "pass" in table and "falls short" in table


@pytest.mark.timeout(120)
def test_quick_run_of_in_process_benchmarks(capsys: pytest.CaptureFixture[str]) -> None:
    results = bench_main(["overhead", "checkpoint", "--quick", "--pairs", "1"])
    names = [r.name for r in results]
    assert names == [
        "step overhead, no callbacks",
        "step overhead, no callbacks, self.log every step",
        "step overhead, default callbacks",
        "step overhead, MLflow logger",
        "evaluation loop",
        "checkpoint stall (async save)",
    ]
    assert all(r.ours > 0 and r.theirs > 0 for r in results)
    assert "| benchmark" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_ddp_benchmark_pairs_run_in_two_processes_and_train_alike() -> None:
    out = ddp.measure(quick=True, pairs=1)
    assert out["ours"] > 0 and out["theirs"] > 0 and len(out["ratios"]) == 1
    # Both sides did the same optimisation: Trainer(strategy="ddp") and the hand-written DDP loop
    # end with bitwise-equal weights, so the ratio compares like with like.
    assert out["same_weights"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_import_benchmark_runs_as_a_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "import", "--quick", "--pairs", "1"],
        cwd=REPO_ROOT,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "from trainer import Trainer vs import torch" in out.stdout


@pytest.mark.timeout(120)
def test_gpu_lm_runs_tiny_on_cpu() -> None:
    result = gpu_lm.main(["--tiny"])
    assert result["tokens_per_s"] > 0 and result["hand_tokens_per_s"] > 0 and result["ratio"] > 0


def test_gpt2_small_shape_is_124m_parameters() -> None:
    import torch

    with torch.device("meta"):
        model = gpu_lm.GPT(gpu_lm.GPTConfig(50304, 1024, 12, 12, 768, 0.0))
    assert 123e6 < model.num_parameters() < 126e6
    assert gpu_lm.flops_per_token(model) > 6 * 123e6


def test_gpu_check_says_so_and_exits_cleanly_without_cuda(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("sys.argv", ["gpu_check.py"])
    spec = importlib.util.spec_from_file_location("gpu_check", REPO_ROOT / "bench" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    assert gpu_check.main() == 0
    assert "CUDA is not available" in capsys.readouterr().out


def _stand_in_callgrind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, totals: list[int]) -> Path:
    """A stand-in for valgrind's callgrind_control on PATH: it logs its arguments, and a dump writes the
    next of ``totals`` (the last one again when they run out) as the dump's total; returns the log."""
    bin_dir, folder = tmp_path / "bin", tmp_path / "dumps"
    bin_dir.mkdir()
    folder.mkdir()
    (tmp_path / "totals.txt").write_text("".join(f"{t}\n" for t in totals))
    (tmp_path / "count").write_text("0")
    tool = bin_dir / "callgrind_control"
    tool.write_text(
        "#!/bin/sh\n"
        f'echo "$1" >> {tmp_path}/log\n'
        'case "$1" in --dump=*)\n'
        f"  n=$(( $(cat {tmp_path}/count) + 1 )); echo $n > {tmp_path}/count\n"
        f'  t=$(sed -n "${{n}}p" {tmp_path}/totals.txt); [ -n "$t" ] || t=$(tail -n 1 {tmp_path}/totals.txt)\n'
        f"  printf 'desc: x\\ntotals: %s\\n' \"$t\" > {folder}/cg.out.$n;;\n"
        "esac\n"
    )
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(core.CALLGRIND_ENV, str(folder))
    monkeypatch.setattr(core, "_CLOCK", [core._CLOCK[0]])  # the CPU clock comes back afterwards
    return tmp_path / "log"


def test_the_instruction_clock_counts_the_measured_pairs_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log_file = _stand_in_callgrind(tmp_path, monkeypatch, [5, 300, 7, 200])
    folder = tmp_path / "dumps"

    def measured() -> float:
        start = core.clock()
        return core.clock() - start

    assert core.use_instruction_counts()
    result = core.ratio_result("row", measured, measured, pairs=1, limit=1.6)
    # The warm-up pair reads 0 (not counted); then ours saw 300 instructions, the hand-written side 200.
    assert (result.ours, result.theirs, result.ratio, result.unit) == (300 / 1e6, 200 / 1e6, 1.5, "M instr")
    assert result.passed
    log = log_file.read_text().split()
    assert log == ["--zero", "--instr=on", *["--dump=clock"] * 4, "--instr=off"]
    assert not list(folder.iterdir())  # each dump is read once and removed


def test_the_overhead_command_reads_instructions_under_callgrind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As the command runs once valgrind started it: every row is read on the instruction clock.
    _stand_in_callgrind(tmp_path, monkeypatch, [1000])
    results = bench_main(["overhead", "--instructions", "--quick"])
    assert results and all(r.unit == "M instr" and r.ratio == 1.0 for r in results)
    assert "instructions executed" in capsys.readouterr().out


def test_instructions_are_counted_for_the_overhead_rows_only() -> None:
    with pytest.raises(SystemExit) as refused:
        bench_main(["import", "--instructions"])
    assert refused.value.code == 2
