"""The ``geartrain`` process: its entry point, the order of its arguments, ``--version`` and ``--help``,
the run directory held while Hydra runs the job, and how a process of a group exits.

What the job itself does (build everything from ``conf/`` and run a task) is :mod:`trainer.cli.app`'s.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from trainer.cli.app import config_dir, group_position, run_job, shared_run_dir_overrides

__all__ = ["freeze_startup_objects", "geartrain_version", "leave_group_process", "main", "options_first"]


def main() -> None:
    """Entry point of ``geartrain`` and ``python -m trainer``.

    A process of a group of several (torchrun, srun) ends with :func:`leave_group_process`."""
    try:
        _main()
    except BrokenPipeError:
        _reader_left()
    except SystemExit as exc:
        leave_group_process(exc.code)
        raise
    leave_group_process(0)


#: Options that only print (the help page, the composed config): a reader that stops early got what it asked for.
_PRINT_ONLY = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--version"}


def _reader_left() -> None:
    """Stdout was a pipe whose reader stopped reading (``geartrain --help | head``): end without a traceback.

    Stdout is pointed at ``/dev/null`` so the interpreter's last flush cannot fail again. Printing
    commands end with 0, as the reader took what it wanted; a job ends with 1 and says why on stderr.
    """
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if any(arg in _PRINT_ONLY for arg in sys.argv[1:]):
        sys.exit(0)
    print("geartrain: stopped: the program reading its output through a pipe closed it", file=sys.stderr)
    sys.exit(1)


def leave_group_process(code: Any) -> None:
    """End a process that belongs to a process group of several, skipping the interpreter's finalization.

    A gloo process group keeps worker threads, and a thread that releases a finished collective's
    tensors takes the GIL to drop their Python objects. When the main thread is already finalizing the
    interpreter, CPython ends a thread that asks for the GIL with ``pthread_exit``; unwinding through
    the C++ destructor that asked calls ``std::terminate``, and the process aborts (SIGABRT, "terminate
    called without an active exception") after its work is done. Here the ``atexit`` handlers run
    (files and logs are flushed and closed, and the GIL is still there for the threads to take), a
    collection finalizes what reference cycles hold (a callback's unclosed gzip file writes its end),
    then the process exits with its status at once, without the finalization. Anything else
    (one process, an exception on its way out) returns and exits as usual.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return
    import atexit

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message") prints the message and exits with 1
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    # What the finalization would do for the objects left in reference cycles: run their finalizers (a
    # callback's gzip file writes its end), with the raw files under them still open. The objects imported
    # before the user's code are frozen (freeze_startup_objects): this walks only what the run made.
    from strategies.rank_process import close_files_in_cycles

    close_files_in_cycles()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, or a pipe whose reader left
            stream.flush()
    os._exit(status)


def _main() -> None:
    freeze_startup_objects()
    import hydra

    # The user's own code (``model._target_=my_project.Net``) is importable from where they run.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    from trainer.cli.errors import remove_empty, reported
    from trainer.common.errors import Interrupted

    if "--version" in sys.argv[1:]:
        print(f"geartrain {geartrain_version()}")
        return
    sys.argv[1:] = options_first(sys.argv[1:])
    from trainer.cli.trace import short_warnings

    short_warnings()

    try:
        with reported():
            from trainer.cli.advice import resume_dir_overrides
            from trainer.cli.run_dir_guard import guarded_run_dir
            from trainer.cli.run_dirs import held_folder, unique_run_dir_overrides

            shared = shared_run_dir_overrides()
            # A resumed fit continues in the run's own folder, so its TensorBoard curve is one line.
            resumed = [] if shared else resume_dir_overrides(sys.argv[1:], Path.cwd())
            # Joined processes get the group's folder (or the user's hydra.run.dir, which claims nothing).
            claimed = [] if shared or resumed else unique_run_dir_overrides(sys.argv[1:])
            sys.argv.extend(shared or resumed or claimed)
            # The folder's lock is taken before Hydra writes into it (rank 0 of a group holds it for all).
            rank, world = group_position()
            folder = held_folder(sys.argv[1:]) if world <= 1 or rank == 0 else None
            held = guarded_run_dir(folder, claimed=bool(claimed)) if folder else contextlib.nullcontext()
            try:
                with held:
                    # config_dir() also registers the schemas: once, as each registration builds the structured configs.
                    app = hydra.main(version_base=None, config_path=str(config_dir()), config_name="config")(run_job)
                    try:
                        with help_without_schemas(sys.argv[1:]):
                            app()
                    finally:  # while the folder's lock is still held
                        for override in claimed + resumed:  # Hydra's log file, when nothing was logged to it
                            log = Path(override.partition("=")[2]) / "cli.log"
                            if log.is_file() and log.stat().st_size == 0:
                                log.unlink()
            finally:
                for override in claimed:  # a folder no job used (an error before the job, --cfg, ...): gone again
                    remove_empty(Path(override.partition("=")[2]), stop_at=Path.cwd())
    except Interrupted as err:  # a signal stopped the processes before they saved: say so, and what is left
        print(f"geartrain: interrupted: {err}", file=sys.stderr)
        sys.exit(128 + err.signal)
    except SystemExit as end:  # a KeyboardInterrupt inside a Trainer entry point ends it as Lightning's: exit 1
        if not isinstance(end.__context__, KeyboardInterrupt):
            raise
        print("geartrain: interrupted (Ctrl-C); nothing was saved after the last checkpoint", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:  # Ctrl-C outside training, or a second one during it: nothing more was saved
        run = sys.modules.get("trainer.run")
        if run is None or not run.FITS_STARTED[0]:
            print("geartrain: interrupted (Ctrl-C) before training started; nothing was saved", file=sys.stderr)
        else:
            print("geartrain: interrupted (Ctrl-C); nothing was saved after the last checkpoint", file=sys.stderr)
        sys.exit(130)


#: Hydra's options that take a value (``--config-dir DIR``); ``--info`` takes one of its words, if one follows.
_VALUED = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd"}
_VALUED |= {"--experimental-rerun"}
_INFO_WORDS = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


def options_first(args: list[str]) -> list[str]:
    """The command line with Hydra's options before the overrides, so they may be given in any order.

    Hydra's parser takes the overrides as one run of positional words: ``a=1 --config-dir d b=2``
    would leave ``b=2`` unrecognised (and so would the run-directory override geartrain appends).

    >>> options_first(["model=net", "--config-dir", "my_conf", "-m", "lr=1,2"])
    ['--config-dir', 'my_conf', '-m', 'model=net', 'lr=1,2']
    """
    options: list[str] = []
    overrides: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-"):  # an override never does (they start with a key, +, ++ or ~)
            options.append(arg)
            takes = arg in _VALUED or (arg in ("--info", "-i") and i + 1 < len(args) and args[i + 1] in _INFO_WORDS)
            if takes and i + 1 < len(args):
                options.append(args[i + 1])
                i += 1
        else:
            overrides.append(arg)
        i += 1
    return options + overrides


def geartrain_version() -> str:
    """The installed distribution's version (``pyproject.toml``'s, in a checkout run from its folder)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("geartrain")
    except PackageNotFoundError:
        return "(not installed)"


@contextlib.contextmanager
def help_without_schemas(args: list[str]) -> Any:
    """``--help``: Hydra's page without the ``schema/*`` groups (the YAML files' typed bases, not choices)."""
    if not any(a in ("--help", "-h") for a in args):
        yield
        return
    import io

    page = io.StringIO()
    try:
        with contextlib.redirect_stdout(page):
            yield
    finally:  # Hydra may end the help with sys.exit(0)
        print("\n".join(line for line in page.getvalue().splitlines() if not line.startswith("schema/")))


def freeze_startup_objects() -> None:
    """Take the objects alive now (torch's and geartrain's, made while importing) out of the cycle collector's sight.

    They live as long as the process, yet every full collection walks them again: while
    ``torch._dynamo`` (which every optimizer imports) and Hydra import, and once more when the
    interpreter exits. ``gc.freeze()`` moves them to the permanent generation; about 0.4 s of CPU
    less for a one-step job on a 2-core machine, a fifth of its whole process. Everything made later
    (the user's module, data, loggers, files) is collected as usual, and the exit stays the normal
    one: threads joined, ``atexit`` hooks run, files flushed and closed. The one difference: the
    modules imported before (torch, geartrain) are left to the operating system at exit instead of
    being collected, as Python allows. Called first thing in :func:`main`, before the user's code is
    imported, so nothing of the user's is among them (``tests/test_startup.py``).
    """
    import gc

    # The package imports its names lazily: import the Trainer (torch, the loops, the callbacks' base)
    # now, so that what every run imports anyway is made before the freeze and is among the frozen.
    import trainer.trainer  # noqa: F401

    gc.freeze()
