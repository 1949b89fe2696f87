"""The ``geartrain`` command: a Hydra app that builds everything from ``conf/`` and runs a task."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from trainer.cli.tuning import TUNER_TASKS, log_trial_hparams, optimized_value, run_tuner_task
from trainer.errors import ConfigError

__all__ = [
    "build_callbacks",
    "can_test",
    "check_config",
    "freeze_startup_objects",
    "main",
    "resolve_ckpt_path",
    "run_task",
]

TASKS = ("fit", "validate", "test", "predict", "fit_test", "lr_find", "scale_batch_size")


def config_dir() -> Path:
    """The packaged configs: ``trainer/conf`` in a wheel, ``<repo>/conf`` in a source checkout.

    Also registers the schemas the YAML files extend, so the folder composes with Hydra's compose API.
    """
    from trainer.cli.config import register_configs

    register_configs()
    here = Path(__file__).resolve().parent.parent  # trainer/
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"geartrain's conf/ folder was not found next to {here}")


def run_task(cfg: Any) -> dict[str, float]:
    """Build module, data, strategy, callbacks and trainer from ``cfg``; run ``cfg.task``.

    Everything the config decides is checked before anything is built or run: the task, the seed,
    values the schemas refuse, and ``ckpt_path`` (a file that exists, or a ``last.ckpt`` to resume).
    A mistake raises :class:`~trainer.errors.ConfigError` naming the key and the fix.

    Returns the final metrics: the fit's last values, then the evaluation's where the task has one.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from trainer import Trainer, seed_everything

    check_config(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path.cwd()
    ckpt = resolve_ckpt_path(cfg.get("ckpt_path"), run_dir)
    seed_everything(int(cfg.seed))
    module = instantiate(cfg.model)
    datamodule = instantiate(cfg.data)
    strategy = instantiate(cfg.strategy)
    trainer_kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert isinstance(trainer_kwargs, dict)
    callbacks = build_callbacks(cfg, trainer_kwargs)
    try:
        trainer = Trainer(
            **{str(k): v for k, v in trainer_kwargs.items()},
            strategy=strategy,
            callbacks=callbacks,
            default_root_dir=run_dir,
            config=cfg,
        )
    except (TypeError, ValueError) as err:
        # Every argument comes from the config's trainer node (or objects built from their groups).
        raise ConfigError(f"trainer: {err}") from err
    metrics: dict[str, float] = {}
    if cfg.task in TUNER_TASKS:
        return run_tuner_task(cfg, trainer, module, datamodule)
    if cfg.task in ("fit", "fit_test"):
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt)
        if trainer.global_step == 0 and ckpt is None and trainer.max_steps != 0 and trainer.limits["fit"] != 0:
            raise ConfigError(
                "the training set gave no batches, so nothing was trained: check the data config "
                "(its path, split sizes and data.batch_size) or use task=validate/test to evaluate only"
            )
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    tests = cfg.task != "fit_test" or can_test(module, datamodule)
    if cfg.task == "fit_test" and not tests and trainer.is_global_zero:
        print("task=fit_test: the module has no test_step or no test data (test_dataloader), so it was fit only")
    if cfg.task in ("validate", "test", "fit_test") and tests:
        stage = "validate" if cfg.task == "validate" else "test"
        eval_ckpt = ckpt if cfg.task != "fit_test" else None
        # fit_test reports the fit's final values (validation included) next to the test's.
        metrics.update(getattr(trainer, stage)(module, datamodule=datamodule, ckpt_path=eval_ckpt, verbose=False)[0])
    if cfg.task == "predict":
        outputs = trainer.predict(module, datamodule=datamodule, ckpt_path=ckpt)
        print(f"predict: {len(outputs or [])} batches of outputs")
    if trainer.is_global_zero and metrics:
        width = max(len(k) for k in metrics)
        print(f"final metrics ({cfg.task}, run directory {run_dir}):")
        for key in sorted(metrics):
            print(f"  {key:<{width}}  {metrics[key]:.4f}")
    value = optimized_value(cfg, metrics)
    if value is not None:
        log_trial_hparams(cfg, trainer, cfg.optimized_metric, value)
    return metrics


def can_test(module: Any, datamodule: Any) -> bool:
    """Whether the module has a ``test_step`` and test data (its own or the datamodule's ``test_dataloader``).

    The default task, ``fit_test``, tests only then: a project without a test set still trains.
    """
    from trainer import DataModule

    def defines_test_data(source: Any) -> bool:
        own = getattr(type(source), "test_dataloader", None)
        return own is not None and own is not getattr(DataModule, "test_dataloader", None)

    has_data = any(defines_test_data(s) for s in (datamodule, module) if s is not None)
    return has_data and callable(getattr(module, "test_step", None))


def check_config(cfg: Any) -> None:
    """Refuse, naming the key, what composing the config let through: the task, the seed, schema checks.

    Hydra checks a typed node's keys and value types as it composes; the checks a schema makes in
    ``__post_init__`` (``trainer/cli/config.py``) run here, by building the schema objects.
    """
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if cfg.task not in TASKS:
        raise ConfigError(f"task={cfg.task}: no such task; choose one of {', '.join(TASKS)}")
    if not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool):
        raise ConfigError(f"seed={cfg.seed}: the seed must be a whole number, e.g. seed=42")
    for key in ("trainer", "strategy", "optim"):
        node = cfg.get(key)
        if isinstance(node, DictConfig) and OmegaConf.get_type(node) not in (dict, None):
            try:
                OmegaConf.to_object(node)
            except ValueError as err:
                raise ConfigError(str(err)) from err
            except OmegaConfBaseException as err:
                raise ConfigError(f"{key}: {str(err).splitlines()[0]}") from err


def resolve_ckpt_path(ckpt_path: str | None, run_dir: Path) -> str | None:
    """``"last"`` means this run's ``checkpoints/last.ckpt``, else the newest ``last.ckpt`` of an earlier run like it.

    Earlier runs are searched under ``outputs/`` and ``multirun/`` of the folder ``geartrain`` was
    started in, among runs of the same experiment (in a sweep: the same job), see
    :func:`trainer.cli.run_dirs.resolve_last_checkpoint`; the choice is printed, so a resume never
    silently picks the wrong file. Any other value must name a file (or a sharded checkpoint's
    folder) that exists.
    """
    from hydra.core.hydra_config import HydraConfig

    base = Path(HydraConfig.get().runtime.cwd) if HydraConfig.initialized() else Path.cwd()
    if ckpt_path is None or ckpt_path == "best":  # "best": the Trainer's own, of this run
        return ckpt_path
    if ckpt_path != "last":
        path = Path(ckpt_path) if Path(ckpt_path).is_absolute() else base / ckpt_path
        if not os.path.lexists(path):  # a link that loops or dangles is the loader's to describe
            raise ConfigError(
                f"ckpt_path={ckpt_path}: no such file ({path}). Give the path of a .ckpt file, or "
                "ckpt_path=last for the newest last.ckpt under outputs/ and multirun/"
            )
        return str(path)
    from hydra.types import RunMode

    from trainer.cli.run_dirs import resolve_last_checkpoint

    hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else None
    overrides = list(hydra_cfg.overrides.task) if hydra_cfg is not None else []
    sweep = hydra_cfg is not None and hydra_cfg.mode == RunMode.MULTIRUN
    return resolve_last_checkpoint(base, run_dir, overrides, sweep)


def group_position(env: dict[str, str] | None = None) -> tuple[int, int]:
    """``(rank, world size)`` of this process in a torchrun or srun job; ``(0, 1)`` when it is alone."""
    from strategies.launch import slurm_environment

    env = dict(os.environ) if env is None else env
    slurm = slurm_environment(env) if "TORCHELASTIC_RUN_ID" not in env else None
    source = slurm or env
    return int(source.get("RANK", "0")), int(source.get("WORLD_SIZE", "1"))


def shared_run_dir_overrides(env: dict[str, str] | None = None) -> list[str]:
    """Hydra overrides that make every process of a torchrun/srun job use one run directory.

    Each process started by ``torchrun`` or ``srun`` runs this command and so Hydra; without
    agreement each would pick its own time-stamped folder. Under torchrun, rank 0 picks the folder
    and publishes it in the launcher's key-value store (the first attempt's choice sticks, so an
    elastic restart resumes in the same folder); under Slurm the folder is named after the job.
    Ranks other than 0 also write no ``.hydra/`` and no log file. Returns ``[]`` for a single
    process, or when the user set ``hydra.run.dir`` themselves.
    """
    env = dict(os.environ) if env is None else env
    rank, world = group_position(env)
    if world <= 1:
        return []
    if any(arg.startswith("hydra.run.dir=") for arg in sys.argv[1:]):
        return []
    import time

    from strategies.launch import slurm_environment

    if "TORCHELASTIC_RUN_ID" not in env and slurm_environment(env) is not None:
        chosen = f"outputs/slurm-{env.get('SLURM_JOB_ID', 'job')}"
    else:
        from datetime import timedelta

        import torch.distributed as dist

        # A client of the store torchrun's agent serves: no process group, so nothing is left behind
        # for the strategy's own group to trip over.
        store = dist.TCPStore(
            env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timedelta(minutes=5)
        )
        key = f"geartrain/run_dir/{env.get('TORCHELASTIC_RUN_ID', '')}"
        if rank == 0:
            from trainer.cli.run_dirs import claim_run_dir

            if not store.check([key]):  # an elastic restart keeps the first attempt's folder
                claimed = claim_run_dir(Path(time.strftime("outputs/%Y-%m-%d/%H-%M-%S"))).as_posix()
                store.compare_set(key, "", claimed)
        chosen = store.get(key).decode()
    overrides = [f"hydra.run.dir={chosen}"]
    if rank != 0:
        overrides += ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    return overrides


def build_callbacks(cfg: Any, trainer_kwargs: dict[Any, Any]) -> list[Any]:
    """Instantiate every entry of the ``callbacks`` and ``logger`` groups.

    Where the config has those groups they are the whole set: ``trainer_kwargs`` is changed so the
    Trainer adds no default progress bar, checkpoint or TensorBoard logger of its own (otherwise
    ``~callbacks.progress_bar`` would bring one back). The trainer flags still work as switches:
    ``trainer.enable_progress_bar=false``, ``trainer.enable_checkpointing=false`` and
    ``trainer.logger=false`` drop the matching entries.
    """
    from hydra.utils import instantiate

    import callbacks as cbs

    built: list[Any] = []
    for group in ("callbacks", "logger"):
        node = cfg.get(group)
        if node:
            for name, entry in node.items():
                if entry is None:
                    continue
                callback = instantiate(entry)
                if isinstance(callback, cbs.Callback):
                    callback.config_key = f"{group}.{name}"  # its messages name the overrides that change it
                built.append(callback)
    switches = (
        ("enable_progress_bar", "callbacks", lambda cb: isinstance(cb, cbs.ProgressBar)),
        ("enable_checkpointing", "callbacks", lambda cb: isinstance(cb, cbs.ModelCheckpoint)),
        ("logger", "logger", lambda cb: getattr(cb, "is_logger", False)),
    )
    for flag, group, matches in switches:
        if trainer_kwargs.get(flag) is False:  # None: the Trainer's default, which is on
            built = [cb for cb in built if not matches(cb)]
        if group in cfg:
            trainer_kwargs[flag] = False
    return built


def main() -> None:
    """Entry point of ``geartrain`` and ``python -m trainer``.

    A process of a group of several (torchrun, srun) ends with :func:`leave_group_process`."""
    try:
        _main()
    except SystemExit as exc:
        leave_group_process(exc.code)
        raise
    leave_group_process(0)


def leave_group_process(code: Any) -> None:
    """End a process that belongs to a process group of several, skipping the interpreter's finalization.

    A gloo process group keeps worker threads, and a thread that releases a finished collective's
    tensors takes the GIL to drop their Python objects. When the main thread is already finalizing the
    interpreter, CPython ends a thread that asks for the GIL with ``pthread_exit``; unwinding through
    the C++ destructor that asked calls ``std::terminate``, and the process aborts (SIGABRT, "terminate
    called without an active exception") after its work is done. Here the ``atexit`` handlers run
    (files and logs are flushed and closed, and the GIL is still there for the threads to take),
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

    try:
        with reported():
            from trainer.cli.run_dirs import unique_run_dir_overrides

            shared = shared_run_dir_overrides()
            # Joined processes get the group's folder (or the user's hydra.run.dir, which claims nothing).
            claimed = [] if shared else unique_run_dir_overrides(sys.argv[1:])
            sys.argv.extend(shared or claimed)
            try:
                # config_dir() also registers the schemas: once, as each registration builds the structured configs.
                app = hydra.main(version_base=None, config_path=str(config_dir()), config_name="config")(run_job)
                app()
            finally:
                for override in claimed:  # a folder no job used (an error before the job, --cfg, ...): gone again
                    remove_empty(Path(override.partition("=")[2]), stop_at=Path.cwd())
    except Interrupted as err:  # a signal stopped the processes before they saved: say so, and what is left
        print(f"geartrain: interrupted: {err}", file=sys.stderr)
        sys.exit(128 + err.signal)


def run_job(cfg: Any) -> float | None:
    """The Hydra task: :func:`run_task`; a run that fails before writing anything leaves no run directory.

    Returns the value of ``optimized_metric`` (None when it is null), for Hydra's sweepers to optimise.
    """
    from hydra.core.hydra_config import HydraConfig

    from trainer.cli.errors import remove_if_untouched, untouched
    from trainer.cli.run_dirs import locked_run_dir

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    fresh = untouched(run_dir)  # not a folder reused with hydra.run.dir=..., which holds files of its own
    rank, world = group_position()
    try:
        # Rank 0 of a torchrun/srun job holds the folder's lock for the group; the others share it.
        with contextlib.nullcontext() if world > 1 and rank != 0 else locked_run_dir(run_dir):
            return optimized_value(cfg, run_task(cfg))
    except BaseException:
        if fresh:
            remove_if_untouched(run_dir, stop_at=Path(hydra_cfg.runtime.cwd))
        raise


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
