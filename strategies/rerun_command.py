"""The command line a rank that ``strategy="ddp"`` starts runs: the caller's, or the one Hydra job it runs.

See :mod:`strategies.relaunch`. :func:`check_rerunnable` refuses, before any process starts, where
there is no script to run again.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from trainer.common.errors import UserError

__all__ = ["check_rerunnable", "hydra_config", "rerun_command"]


def check_rerunnable(strategy: str) -> None:
    """Refuse, before any process starts, where no script can be run again for the other ranks.

    An interactive session, a notebook, ``python -c`` and ``python -`` (a script read from stdin) have
    no file to run again; a pytest session would run the whole test session again in every rank.
    """
    import __main__

    argv0 = sys.argv[0] if sys.argv else ""
    main_file = getattr(__main__, "__file__", None)
    spec = getattr(__main__, "__spec__", None)
    interactive = hasattr(sys, "ps1") or bool(sys.flags.interactive)
    # A test running (pytest sets PYTEST_CURRENT_TEST; its xdist workers are ``python -c``): said as pytest.
    in_pytest = "pytest" in sys.modules and "PYTEST_CURRENT_TEST" in os.environ
    if not in_pytest and (interactive or argv0 in ("", "-", "-c") or (main_file is None and spec is None)):
        where = "python -c" if argv0 == "-c" else "an interactive session or notebook" if argv0 != "-" else "python -"
        raise UserError(
            f"strategy={strategy!r} runs the script again for every other rank, and {where} has no script to "
            "run again. Run your code as a script (python train.py), or choose a notebook-compatible strategy: "
            "strategy='ddp_notebook' (processes forked from this one)"
        )
    name = (spec.name if spec is not None else Path(argv0).name).split(".")[0]
    if in_pytest or name in ("pytest", "py", "_pytest") or Path(argv0).name in ("pytest", "py.test"):
        raise UserError(
            f"strategy={strategy!r} runs the script again for every other rank, and this process runs pytest "
            "(every rank would run the test session again). In tests use strategy='ddp_spawn' (the module, "
            "trainer and data are pickled into new processes) or run a script in a subprocess"
        )


def rerun_command(rank: int) -> tuple[list[str], str | None]:
    """The command line rank ``rank`` runs, and its working directory (None: this one's).

    A plain script or module runs again with the same arguments. A Hydra job runs again as one job:
    its config flags, its own overrides (a sweep's job gets its values, never the whole sweep), and
    its run directory pinned; ranks other than 0 write no ``.hydra/`` folder and no log file.

    The job runs in Hydra's run mode whatever the config says: a config that sets ``hydra.mode:
    MULTIRUN`` itself (an Optuna search config does, so that ``-m`` may be left out) would otherwise
    make the rank start a sweep of its own, whose first job joins rank 0 and whose next one waits to
    join a group that is gone, while rank 0 waits for it to end before its own next trial.
    """
    import __main__

    spec = getattr(__main__, "__spec__", None)
    hydra = hydra_config()
    if spec is not None and spec.name not in ("__main__", ""):
        command = [sys.executable, "-m", spec.name.removesuffix(".__main__")]
    else:
        # The script as the interpreter found it (an absolute path), else a relative path taken from the
        # folder the program started in: a Hydra job with hydra.job.chdir=True runs in its output folder by now.
        main_file = getattr(__main__, "__file__", None)
        started_in = str(hydra.runtime.cwd) if hydra is not None else os.getcwd()
        script = main_file if isinstance(main_file, str) and os.path.isabs(main_file) else sys.argv[0]
        command = [sys.executable, os.path.join(started_in, script)]
    if hydra is None:
        return command + sys.argv[1:], None
    run_dir = hydra.runtime.output_dir
    overrides = [*_config_flags(sys.argv[1:]), *hydra.overrides.task]
    overrides += [f"hydra.run.dir={_quoted(run_dir)}", "hydra.output_subdir=null", "hydra.mode=RUN"]
    overrides += _job_identity(hydra.job)
    overrides += ["hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    return command + overrides, hydra.runtime.cwd


def hydra_config() -> Any:
    """The running Hydra job's config, or None outside Hydra (Hydra is imported only if the program did)."""
    if "hydra.core.hydra_config" not in sys.modules:
        return None
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None


def _job_identity(job: Any) -> list[str]:
    """Overrides that give the rank's job what rank 0's job holds and a single run would not.

    A sweep's job number and id (code may seed or name things by ``HydraConfig.get().job.num``; in a
    single run they are unset), and ``hydra.job.chdir`` (given on the command line it is a Hydra
    override, which the job's own overrides leave out).
    """
    from omegaconf import OmegaConf

    pinned = []
    if not OmegaConf.is_missing(job, "num"):
        pinned.append(f"hydra.job.num={int(job.num)}")
    if not OmegaConf.is_missing(job, "id"):
        pinned.append(f"hydra.job.id={_quoted(str(job.id))}")
    if job.get("chdir") is not None:
        pinned.append(f"hydra.job.chdir={str(bool(job.chdir)).lower()}")
    return pinned


def _config_flags(argv: list[str]) -> list[str]:
    """Hydra's flags that choose the config (``--config-dir``, ``--config-path``, ``--config-name``) from ``argv``."""
    flags = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn")
    kept: list[str] = []
    take_next = False
    for arg in argv:
        if take_next:
            kept.append(arg)
            take_next = False
        elif arg in flags:
            kept.append(arg)
            take_next = True
        elif arg.startswith(tuple(f"{flag}=" for flag in flags)):
            kept.append(arg)
    return kept


def _quoted(value: str) -> str:
    """``value`` as a quoted string of Hydra's override grammar (a path may hold ``=``, ``,`` or spaces)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
