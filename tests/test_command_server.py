"""The tests' command server runs a command as a new interpreter would (tests/helpers/command_server.py).

Most command tests fork their ``python -m trainer`` from a server that imported torch and Hydra once;
what they prove holds only if a served command behaves as a freshly started one. Each case here runs
the same module both ways and compares what a test can see: exit status, output, files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from tests.helpers.cli import run_geartrain
from tests.helpers.command_server import Served

MODULES = {
    # sys.path as the interpreter makes it for ``-m``: the folder first, then PYTHONPATH.
    "paths": """
        import os, sys, sibling
        print(sibling.NAME, sys.path[0] == os.getcwd(), os.environ["EXTRA"], sys.argv[1:])
    """,
    "raises": "raise ValueError('bad value')",
    "exits_with_text": "import sys; sys.exit('stopped: because')",
    "exits_3": "import sys; print('out'); sys.exit(3)",
    "interrupted": "raise KeyboardInterrupt",
    # Non-daemon threads are joined and atexit handlers run before the exit, output flushed.
    "at_exit": """
        import atexit, threading, time
        atexit.register(lambda: print('atexit ran'))
        threading.Thread(target=lambda: (time.sleep(0.2), print('thread ended'))).start()
        print('main ended', end='')
    """,
    "unbuffered": "import sys; print('a'); print('b', file=sys.stderr); print('c')",
}


@pytest.mark.parametrize("how", ["-m", "script", "-c"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_served_command_equals_a_fresh_one(name: str, how: str, tmp_path: Path) -> None:
    (tmp_path / "sibling.py").write_text("NAME = 'sibling'\n")
    code = textwrap.dedent(MODULES[name])
    (tmp_path / f"{name}.py").write_text(code)
    if how == "-c" and name == "paths":
        code = code.replace("sys.path[0] == os.getcwd()", "sys.path[0] == ''")
    argv = {"-m": ["-m", name], "script": [str(tmp_path / f"{name}.py")], "-c": ["-c", code]}[how]
    env = {**os.environ, "EXTRA": "extra", "PYTHONPATH": str(tmp_path if how == "-c" else REPO_ROOT)}
    fresh = subprocess.run([sys.executable, *argv, "x", "--flag"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    served = Served([*argv, "x", "--flag"], str(tmp_path), env)
    out, err = served.communicate(60)
    assert (served.returncode, out, err) == (fresh.returncode, fresh.stdout, fresh.stderr)
    expected = {"paths": 0, "raises": 1, "exits_with_text": 1, "exits_3": 3, "interrupted": -2, "at_exit": 0}
    assert served.returncode == expected.get(name, 0)


def test_a_served_trainer_command_says_what_a_fresh_one_says(tmp_path: Path) -> None:
    args = ("--cfg", "job", "trainer.max_epochs=3", "model.hidden=7")
    fresh, served = (run_geartrain(*args, cwd=tmp_path, timeout=120, fresh=f) for f in (True, False))
    assert served.returncode == fresh.returncode == 0
    assert served.stdout == fresh.stdout and "max_epochs: 3" in served.stdout
    typo = ("trainer.max_epoch=3",)
    fresh, served = (run_geartrain(*typo, cwd=tmp_path, timeout=120, fresh=f) for f in (True, False))
    assert served.returncode == fresh.returncode == 1
    assert served.stderr == fresh.stderr and "max_epoch" in served.stderr


def _echo(tmp_path: Path, text: str) -> str:
    served = Served(["-c", f"print({text!r})"], str(tmp_path), dict(os.environ))
    out, _ = served.communicate(60)
    assert served.returncode == 0
    return out


def test_a_forked_child_ending_with_atexit_leaves_its_parents_server_alone(tmp_path: Path) -> None:
    """A test that forks and lets the child run ``atexit`` must not stop the worker's server."""
    import atexit

    from tests.helpers import command_server

    assert _echo(tmp_path, "before") == "before\n"
    path, proc = command_server._SERVER
    pid = os.fork()
    if pid == 0:
        try:
            atexit._run_exitfuncs()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert proc.poll() is None and os.path.exists(path)
    assert _echo(tmp_path, "after") == "after\n" and command_server._SERVER[1] is proc


def test_a_server_that_has_gone_is_started_again(tmp_path: Path) -> None:
    from tests.helpers import command_server

    assert _echo(tmp_path, "first") == "first\n"
    _, proc = command_server._SERVER
    proc.kill()
    proc.wait(10)
    assert _echo(tmp_path, "second") == "second\n"
    assert command_server._SERVER[1] is not proc and command_server._SERVER[1].poll() is None


def test_the_stand_ins_run_as_the_programs_they_stand_for(tmp_path: Path) -> None:
    """``geartrain``, ``python`` and ``torchrun`` on PATH (the docs' shell blocks): same output, exit status, folder;
    ``python`` with other options becomes the interpreter itself."""
    from tests.helpers import command_server

    (tmp_path / "script.py").write_text("import os, sys; print(os.getcwd(), sys.argv[1:]); sys.exit(4)\n")
    script = "geartrain --version; python script.py a b || echo status $?; python -c 'print(6 * 7)'; python -V"
    bin_dir = os.path.dirname(sys.executable)
    runs = {}
    for name, first in (("stand-ins", command_server.stand_ins()), ("programs", bin_dir)):
        env = {
            **os.environ,
            "PATH": os.pathsep.join([first, bin_dir, os.environ["PATH"]]),
            "PYTHONPATH": str(REPO_ROOT),
        }
        runs[name] = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                                    timeout=120)  # fmt: skip
    assert (runs["stand-ins"].returncode, runs["stand-ins"].stdout) == (0, runs["programs"].stdout)
    assert f"{tmp_path} ['a', 'b']\nstatus 4\n42\nPython 3." in runs["stand-ins"].stdout
    served = subprocess.run(["bash", "-c", "python -c 'import os; print(os.getppid())'"],
                            env={**os.environ, "PATH": os.pathsep.join([command_server.stand_ins(), os.environ["PATH"]])},
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert served.stdout == f"{command_server._SERVER[1].pid}\n"  # forked by the server, not started by bash
    assert shutil.which("torchrun", path=command_server.stand_ins())


def test_an_xdist_worker_and_the_commands_it_serves_compute_on_its_share_of_the_cores(tmp_path: Path) -> None:
    """tests/conftest.py: under pytest-xdist each worker takes cores // workers threads (at least one), and so
    do the commands it starts; a thread per core in every worker would oversubscribe the machine."""
    import torch

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    share = max(1, (os.cpu_count() or 1) // workers) if workers else torch.get_num_threads()
    assert torch.get_num_threads() == share
    served = Served(["-c", "import torch; print(torch.get_num_threads())"], str(tmp_path), dict(os.environ))
    assert served.communicate(60)[0] == f"{share}\n"
