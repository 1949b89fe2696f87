"""A zygote for the command in tests: torch and Hydra imported once, one forked process per command.

Every ``python -m trainer ...`` a test starts spends two of its three seconds of CPU importing
torch, ``torch._dynamo`` (the first ``optimizer.step()`` imports it) and Hydra. This server imports
those third-party packages once (:data:`PRELOAD`) and forks a process for each command a test
sends it, which then runs what ``python -m MODULE ARGS``, ``python SCRIPT ARGS`` or ``python -c CODE``
runs, in the requested folder, with the requested environment and ``sys.path``, with its own pid,
standard streams, signals and exit status. This project's own modules are imported fresh in every
command (none is preloaded, so their import-time behaviour is the command's).

What a fork cannot give is written here so it stays visible: variables that torch or Hydra read
while being imported are the server's (the server runs with the test process's environment), and
the interpreter's start-up options are the server's. Tests that measure start-up itself start a
real interpreter (:func:`tests.helpers.cli.run_geartrain` with ``fresh=True``).

Protocol, over a Unix socket: the client sends a length-prefixed pickle ``(argv, cwd, env,
new_session)`` with the command's stdout and stderr descriptors; the server answers the child's pid
on one line, and its exit status (as :attr:`subprocess.Popen.returncode`) on a second line when it ends.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import os
import pickle
import runpy
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import types
from typing import IO, Any, NoReturn

#: Third-party modules the server imports before it forks; never this project's own.
PRELOAD = ("numpy", "torch", "torch._dynamo", "torch.optim", "torch.utils.data", "torchmetrics", "omegaconf",
           "hydra", "hydra.utils", "hydra.core.utils", "hydra._internal.utils")  # fmt: skip

_HEADER = struct.Struct("!I")


def main(argv: list[str]) -> None:
    """Serve on the socket path ``argv[0]`` until standard input closes (the test process has gone)."""
    for name in PRELOAD:
        importlib.import_module(name)
    import torch

    default_threads = torch.get_num_threads()
    own_entries = {sys.path[0], *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))}
    base_path = [p for p in sys.path if p not in own_entries]

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(argv[0])
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)
    print("ready", flush=True)
    children: dict[int, socket.socket] = {}
    while True:
        for key, _ in selector.select():
            if key.fileobj is sys.stdin:
                if not sys.stdin.readline():
                    return
            elif key.fileobj is listener:
                conn, _ = listener.accept()
                request, fds = _receive(conn)
                pid = os.fork()
                if pid == 0:
                    closing = [listener, conn, *children.values()]
                    _child(request, fds, closing, (wake_r, wake_w), base_path, default_threads)
                for fd in fds:
                    os.close(fd)
                conn.sendall(f"{pid}\n".encode())
                children[pid] = conn
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                _reap(children)


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 2)
    while len(data) < _HEADER.size or len(data) < _HEADER.size + _HEADER.unpack_from(data)[0]:
        more = conn.recv(1 << 16)
        if not more:
            raise EOFError("the client left mid-request")
        data += more
    return pickle.loads(data[_HEADER.size :]), list(fds)


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            conn.close()


def _child(
    request: dict[str, Any],
    fds: list[int],
    closing: list[socket.socket],
    wake: tuple[int, int],
    base_path: list[str],
    default_threads: int,
) -> None:
    """Become ``python -m MODULE ARGS``, ``python SCRIPT ARGS`` or ``python -c CODE`` in ``cwd`` with ``env``;
    never returns."""
    code = 1
    argv: list[str] = request["argv"]
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for sock in closing:
            sock.close()
        for fd in wake:
            os.close(fd)
        if request["new_session"]:
            os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in {devnull, *fds}:
            os.close(fd)
        env: dict[str, str] = request["env"]
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(env)
        _standard_streams(unbuffered=bool(env.get("PYTHONUNBUFFERED")))
        script = None if argv[0] in ("-m", "-c") else argv[0]
        # What the interpreter puts first on sys.path: the folder for ``-m``, the script's own folder for a
        # script; then PYTHONPATH.
        first = (
            {"-m": os.getcwd(), "-c": ""}.get(argv[0]) if script is None else os.path.dirname(os.path.realpath(script))
        )
        sys.path[:] = [first, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep)), *base_path]
        if env.get("PYTHONWARNINGS"):
            import warnings

            warnings._processoptions(env["PYTHONWARNINGS"].split(","))  # type: ignore[attr-defined]
        import numpy
        import torch

        numpy.random.seed()  # a fresh interpreter seeds numpy's global generator from the OS
        torch.set_num_threads(int(env.get("OMP_NUM_THREADS") or default_threads))
        main_module = sys.modules["__main__"] = types.ModuleType("__main__")
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            main_module.__dict__["__builtins__"] = __builtins__
            exec(compile(argv[1], "<string>", "exec"), main_module.__dict__)
        elif argv[0] == "-m":
            sys.argv = argv[1:]
            runpy._run_module_as_main(argv[1], alter_argv=True)  # type: ignore[attr-defined]
        else:
            sys.argv = list(argv)
            runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
    except BaseException as error:  # shown as the interpreter shows it: ``-m`` from runpy's frames on,
        tb = error.__traceback__.tb_next if error.__traceback__ else None  # a script or -c from its own
        own = script or "<string>"
        while argv[0] != "-m" and tb is not None and tb.tb_frame.f_code.co_filename != own:
            tb = tb.tb_next
        error.with_traceback(tb or (error.__traceback__ and error.__traceback__.tb_next))
        sys.excepthook(type(error), error, error.__traceback__)
        code = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
    finally:
        _finish(code)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _finish(code: int) -> None:
    """What the interpreter does at exit: join threads, run ``atexit``, flush; then end with ``code``."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    finally:
        if code < 0:  # an uncaught KeyboardInterrupt: the interpreter ends by the signal itself
            _end_by_signal(-code)
        os._exit(code & 0xFF)


def _end_by_signal(sig: int) -> None:
    """End this process by ``sig`` with its default action, as a process killed by it ends."""
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)


def _standard_streams(unbuffered: bool) -> None:
    """New ``sys.stdin/stdout/stderr`` on descriptors 0-2, buffered as a fresh interpreter buffers them."""

    def text(fd: int, mode: str, errors: str, line: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, mode, closefd=False)
        buffered: Any = (
            raw if unbuffered and mode == "wb" else (io.BufferedWriter if mode == "wb" else io.BufferedReader)(raw)
        )
        return io.TextIOWrapper(
            buffered, encoding="utf-8", errors=errors, line_buffering=line, write_through=unbuffered
        )

    sys.stdin = sys.__stdin__ = text(0, "rb", "strict", False)
    sys.stdout = sys.__stdout__ = text(1, "wb", "strict", False)
    sys.stderr = sys.__stderr__ = text(2, "wb", "backslashreplace", True)


# ------------------------------------------------------------------ the client (in the test process)
def _request(server: str, argv: list[str], cwd: str, env: dict[str, str], new_session: bool,
             fds: list[int]) -> tuple[socket.socket, IO[str], int]:  # fmt: skip
    """Send one command to ``server`` with ``fds`` as its stdout and stderr: the connection, its reply
    stream and the served process's pid (the reply's first line)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(server)
    payload = pickle.dumps({"argv": list(argv), "cwd": cwd, "env": env, "new_session": new_session})
    socket.send_fds(conn, [_HEADER.pack(len(payload))], fds)
    conn.sendall(payload)
    reply = conn.makefile("r")
    return conn, reply, int(reply.readline())


def _exit_status(line: str) -> int:
    """The reply's second line as :attr:`subprocess.Popen.returncode`; none when the server went away."""
    return int(line) if line else -signal.SIGKILL


class Served:
    """A command forked by the server: the part of :class:`subprocess.Popen` the tests use.

    ``merge``: stderr goes to stdout's pipe, as ``stderr=subprocess.STDOUT``. Output is text with
    universal newlines, as ``text=True`` gives.
    """

    def __init__(self, argv: list[str], cwd: str, env: dict[str, str], *, merge: bool = False,
                 new_session: bool = False) -> None:  # fmt: skip
        """``argv``: what follows ``python``: ``["-m", module, *args]``, ``[script, *args]`` or ``["-c", code, *args]``."""
        self.args = [sys.executable, *argv]
        self.returncode: int | None = None
        out_r, out_w = os.pipe()
        err_r, err_w = (out_r, out_w) if merge else os.pipe()
        # Text with universal newlines, as Popen(text=True) gives.
        self.stdout: IO[str] | None = open(out_r, encoding="utf-8", errors="replace")  # noqa: SIM115
        self.stderr: IO[str] | None = None if merge else open(err_r, encoding="utf-8", errors="replace")  # noqa: SIM115
        try:
            self._conn, self._reply, self.pid = _request(_server(), argv, str(cwd), env, new_session, [out_w, err_w])
        finally:
            os.close(out_w)
            if not merge:
                os.close(err_w)

    def poll(self) -> int | None:
        if self.returncode is None and select_ready(self._conn, 0):
            self._read_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select_ready(self._conn, timeout):
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._read_status()
        assert self.returncode is not None
        return self.returncode

    def _read_status(self) -> None:
        self.returncode = _exit_status(self._reply.readline())
        self._reply.close()
        self._conn.close()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        """Read the pipes to their end (children that hold them included, as Popen does), then the status."""
        texts: dict[int, str] = {}
        pipes = [pipe for pipe in (self.stdout, self.stderr) if pipe is not None]
        readers = [
            threading.Thread(target=lambda i, pipe: texts.__setitem__(i, pipe.read()), args=(i, pipe), daemon=True)
            for i, pipe in enumerate(pipes)
        ]  # fmt: skip
        for reader in readers:
            reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if any(reader.is_alive() for reader in readers):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        for pipe in pipes:
            pipe.close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return texts[0], (texts[1] if self.stderr is not None else None)


def select_ready(sock: socket.socket, timeout: float | None) -> bool:
    import select

    return bool(select.select([sock], [], [], timeout)[0])


#: What :func:`start` gives: a served process, or a new interpreter's Popen.
Started = Served | subprocess.Popen[str]


def start(
    argv: list[str],
    cwd: str | os.PathLike[str],
    env: dict[str, str],
    *,
    merge: bool = False,
    new_session: bool = False,
    fresh: bool = False,
) -> Started:
    """``python ARGV`` started in ``cwd``, output on text pipes (``merge``: stderr into stdout).

    Forked from the server; a new interpreter with ``fresh``, for other interpreter options than
    ``-m``/``-c``, or for every command with ``GEARTRAIN_TESTS_FRESH=1`` in the environment.
    """
    if (
        fresh
        or os.environ.get("GEARTRAIN_TESTS_FRESH") == "1"
        or (argv[0].startswith("-") and argv[0] not in ("-m", "-c"))
    ):
        return subprocess.Popen(
            [sys.executable, *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge else subprocess.PIPE, text=True, start_new_session=new_session,
        )  # fmt: skip
    return Served(argv, str(cwd), env, merge=merge, new_session=new_session)


def run(
    argv: list[str], cwd: str | os.PathLike[str], env: dict[str, str], timeout: float, *, fresh: bool = False
) -> subprocess.CompletedProcess[str]:
    """``python ARGV`` to its end, output captured: :func:`subprocess.run` for :func:`start`.

    Past ``timeout`` the process is killed and :class:`subprocess.TimeoutExpired` raised, as ``subprocess.run`` does.
    """
    proc = start(argv, cwd, env, fresh=fresh)
    try:
        out, err = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.wait(), out, err or "")


def forward(argv: list[str], server: str) -> NoReturn:
    """Run ``python ARGV`` on ``server`` with this process's folder, environment and standard output and
    error, and end as it ends: the body of a stand-in command (:func:`stand_ins`).

    Interrupt and termination signals sent to the stand-in are passed on to the served process.
    """
    _, reply, pid = _request(server, argv, os.getcwd(), dict(os.environ), False, [1, 2])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: os.kill(pid, number))
    code = _exit_status(reply.readline())
    if code < 0:  # ended by a signal: so does the stand-in, as the shell expects of a killed command
        _end_by_signal(-code)
    sys.exit(code)


def stand_in(name: str, real: str, server: str) -> NoReturn:
    """What the stand-in ``name`` for the program at ``real`` does with its arguments (:func:`stand_ins`)."""
    args = sys.argv[1:]
    if name != "python":  # a console script (geartrain, torchrun): ``python SCRIPT ARGS``
        forward([real, *args], server)
    if args and ((args[0] in ("-m", "-c") and len(args) > 1) or not args[0].startswith("-")):
        forward(args, server)
    os.execv(real, [real, *args])  # other interpreter options, or none: the interpreter itself


#: The commands :func:`stand_ins` puts in its folder, each found beside this interpreter.
STAND_INS = ("geartrain", "python", "torchrun")


def stand_ins() -> str:
    """A folder of stand-ins for ``geartrain``, ``python`` and ``torchrun`` that run on this worker's server.

    Put first on ``PATH``, the shell commands of a test (the docs' blocks) start these without a new
    interpreter importing torch and Hydra (``python`` with other options than ``-m``/``-c`` or a script
    becomes the interpreter itself); each stand-in starts without ``site``, in a few milliseconds.
    """
    server = _server()
    folder = os.path.join(os.path.dirname(server), "bin")
    if not os.path.isdir(folder):
        from tests.helpers import REPO_ROOT

        os.mkdir(folder)
        for name in STAND_INS:
            real = sys.executable if name == "python" else os.path.join(os.path.dirname(sys.executable), name)
            path = os.path.join(folder, name)
            with open(path, "w") as f:
                f.write(f"#!{sys.executable} -S\nimport sys\nsys.path.insert(0, {str(REPO_ROOT)!r})\n"
                        "from tests.helpers.command_server import stand_in\n"
                        f"stand_in({name!r}, {real!r}, {server!r})\n")  # fmt: skip
            os.chmod(path, 0o755)
    return folder


_SERVER: list[Any] = []


def _server() -> str:
    """The socket of this process's server, started at the first call (one per pytest worker).

    Started again if it has gone (its process ended or its socket was removed), so one lost server
    costs a start, not every later command of the worker.
    """
    if _SERVER and (_SERVER[1].poll() is not None or not os.path.exists(_SERVER[0])):
        print(f"tests: the command server has gone (exit {_SERVER[1].poll()}); starting another", file=sys.stderr)
        _SERVER.clear()
    if not _SERVER:
        import tempfile

        folder = tempfile.mkdtemp(prefix="geartrain-commands-")
        path = os.path.join(folder, "socket")
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PYTHONWARNINGS")}
        from tests.helpers import REPO_ROOT

        env["PYTHONPATH"] = str(REPO_ROOT)
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.command_server", path],
            cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the command server did not start (exit {proc.wait()})")
        _SERVER[:] = [path, proc]
        atexit.register(_stop, proc, folder, os.getpid())
    return str(_SERVER[0])


def _stop(proc: subprocess.Popen[str], folder: str, owner: int) -> None:
    """Stop the server and remove its folder; only in the process that started it (a forked child that
    runs ``atexit`` at its end must not take its parent's server with it)."""
    import shutil

    if os.getpid() != owner:
        return
    with contextlib.suppress(OSError):
        assert proc.stdin is not None
        proc.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    if proc.poll() is None:
        proc.kill()
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
