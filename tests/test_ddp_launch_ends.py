"""However a ``strategy="ddp"`` run ends, it ends soon, says why, and leaves nothing behind.

Each case runs ``tests/helpers/launch_probe.py`` (the caller is rank 0, rank 1 runs the script again)
in a session of its own with its own temporary folder: no rank, orphan or ``geartrain-ranks-*``
folder may outlive it; the caller's environment after ``fit`` is its own again; a rank's traceback
reaches the user. The cases run side by side: most of each is starting processes.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import termios
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from tests.helpers.distributed import Finished, child_env, run_in_session, session_members

pytestmark = pytest.mark.slow  # every test here starts processes

PROBE = str(REPO_ROOT / "tests" / "helpers" / "launch_probe.py")


def _ours(tmp: Path) -> list[str]:
    """geartrain's folders in the temporary folder ``tmp`` (torch keeps caches of its own there)."""
    return [name for name in os.listdir(tmp) if name.startswith("geartrain")]


def _probe(root: Path, mode: str, timeout: float = 150) -> tuple[Finished, float]:
    """Run the probe in ``mode``; the finished run and when it ended (``time.time()``)."""
    (root / "tmp").mkdir(parents=True)
    result = run_in_session(
        [sys.executable, PROBE, "--root", str(root), "--mode", mode], REPO_ROOT, child_env(TMPDIR=str(root / "tmp")),
        timeout=timeout,
    )  # fmt: skip
    return result, time.time()


@pytest.mark.timeout(240)
def test_each_way_a_run_ends_ends_soon_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    modes = ("env+raise1", "raise0", "fail1")
    with ThreadPoolExecutor(len(modes)) as pool:
        runs = {mode: pool.submit(_probe, tmp_path / mode, mode) for mode in modes}
    results = {mode: run.result() for mode, run in runs.items()}
    for mode, (result, _) in results.items():
        assert result.leftovers == [], mode  # no rank outlives the run
        assert _ours(tmp_path / mode / "tmp") == [], mode  # nor the launcher's work folder

    # After fit the caller's environment is as before: no RANK, WORLD_SIZE, MASTER_PORT or re-run marker.
    assert json.loads((tmp_path / "env+raise1" / "env.json").read_text()) == {}
    # Rank 1 fails after fit: its traceback reaches the user, and the run fails.
    result, _ = results["env+raise1"]
    assert result.returncode == 1, result.stderr[-3000:]
    assert "WorkerFailedError: training process of rank 1 failed" in result.stderr, result.stderr[-3000:]
    assert 'raise RuntimeError("planned failure on rank 1 after fit")' in result.stderr, result.stderr[-3000:]

    # Rank 0's own code fails after fit while rank 1 waits in a collective: the run ends within seconds
    # (not at the group's 30-minute timeout) with rank 0's traceback.
    result, ended = results["raise0"]
    assert result.returncode == 1, result.stderr[-3000:]
    assert "RuntimeError: planned failure on rank 0 after fit" in result.stderr
    took = ended - float((tmp_path / "raise0" / "failed_at").read_text())
    assert took < 30, took

    # Rank 1 fails before fit: the caller says so with its traceback, at once.
    result, ended = results["fail1"]
    assert result.returncode == 1, result.stderr[-3000:]
    assert "RuntimeError: planned failure on rank 1 before fit" in result.stderr, result.stderr[-3000:]
    took = ended - float((tmp_path / "fail1" / "failed_at").read_text())
    assert took < 30, took


def _started(root: Path, mode: str) -> tuple[subprocess.Popen[str], int]:
    """The probe, started in a session of its own; and rank 1's process id once it runs the pre-fit code."""
    (root / "tmp").mkdir(parents=True)
    proc = subprocess.Popen(
        [sys.executable, PROBE, "--root", str(root), "--mode", mode], cwd=REPO_ROOT,
        env=child_env(TMPDIR=str(root / "tmp")), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 90
    while not (root / "rank1-pid").is_file() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert (root / "rank1-pid").is_file(), proc.communicate(timeout=30)
    time.sleep(0.3)  # the pid is written: let the file be whole
    return proc, int((root / "rank1-pid").read_text())


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def _ctrl_c(root: Path) -> tuple[int, str, float]:
    proc, _ = _started(root, "sleep1")
    os.kill(proc.pid, signal.SIGINT)
    sent = time.monotonic()
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        for pid in session_members(proc.pid):
            os.kill(pid, signal.SIGKILL)
    return proc.returncode, err, time.monotonic() - sent


def _kill_9(root: Path) -> bool:
    proc, rank1 = _started(root, "sleep1")
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    try:
        return _gone(rank1, 10)
    finally:
        for pid in session_members(proc.pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(240)
def test_a_signal_while_rank_1_runs_the_scripts_code_before_fit_is_acted_on_at_once(tmp_path: Path) -> None:
    with ThreadPoolExecutor(2) as pool:
        ctrl_c = pool.submit(_ctrl_c, tmp_path / "ctrl-c")
        killed = pool.submit(_kill_9, tmp_path / "kill-9")
        code, err, took = ctrl_c.result()
        rank1_gone = killed.result()
    # Ctrl-C: the run ends within seconds (not when rank 1 would reach fit), as interrupted.
    assert code != 0, err[-3000:]
    assert took < 20, took
    assert "Interrupted: the launcher received SIGINT" in err, err[-3000:]
    assert _ours(tmp_path / "ctrl-c" / "tmp") == []
    # kill -9 of the caller: rank 1 dies with it.
    assert rank1_gone


def _read_until(fd: int, text: str, seconds: float) -> str:
    """What the terminal showed up to ``text`` (or all of it, when ``seconds`` ran out first)."""
    seen = ""
    deadline = time.monotonic() + seconds
    while text not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                seen += os.read(fd, 4096).decode(errors="replace")
            except OSError:  # every process of the terminal has closed it
                break
    return seen


@pytest.mark.timeout(200)
def test_input_before_fit_in_a_terminal_reaches_each_rank(tmp_path: Path) -> None:
    # The caller runs in a terminal of its own (a pseudo-terminal, as its controlling terminal). Rank 1
    # asks too when its run of the script gets there; in a background process group the terminal would
    # stop it (SIGTTIN) and the run would wait forever.
    (tmp_path / "tmp").mkdir()
    terminal, side = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, PROBE, "--root", str(tmp_path), "--mode", "input"], cwd=REPO_ROOT,
        env=child_env(TMPDIR=str(tmp_path / "tmp")), stdin=side, stdout=side, stderr=side, start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )  # fmt: skip
    os.close(side)
    try:
        shown = _read_until(terminal, "rank 0? ", 90)
        assert "rank 0? " in shown, shown[-3000:]
        os.write(terminal, b"zero\n")
        shown = _read_until(terminal, "rank 1? ", 90)
        assert "rank 1? " in shown, shown[-3000:]
        os.write(terminal, b"one\n")
        shown += _read_until(terminal, "\x00never", 60 if proc.poll() is None else 0)
        assert proc.wait(timeout=60) == 0, shown[-3000:]
    finally:
        for pid in session_members(proc.pid):
            os.kill(pid, signal.SIGKILL)
        os.close(terminal)
    assert (tmp_path / "answer-0").read_text() == "zero"
    assert (tmp_path / "answer-1").read_text() == "one"
