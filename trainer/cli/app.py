"""The ``geartrain`` command: a Hydra app that builds everything from ``conf/`` and runs a task."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

from trainer.cli.errors import checkpoints_in_run_dir, warn_no_last_checkpoint
from trainer.cli.tuning import TUNER_TASKS, log_trial_hparams, optimized_value, run_tuner_task
from trainer.errors import ConfigError

__all__ = [
    "build_callbacks",
    "can_test",
    "check_config",
    "config_dir",
    "group_position",
    "resolve_ckpt_path",
    "run_job",
    "run_task",
    "shared_run_dir_overrides",
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
    from trainer.cli.advice import command_line_keys, record_precision, recorded_config, refuse_unused_optim, run_line
    from trainer.cli.checks import check_model_arguments

    check_config(cfg)
    explicit = command_line_keys()
    refuse_unused_optim(cfg, explicit)
    if HydraConfig.initialized():
        choices = HydraConfig.get().runtime.choices
        check_model_arguments(cfg, list(HydraConfig.get().overrides.task), choices.get("model"))
    run_dir = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path.cwd()
    from strategies.relaunch import started_by_rerun

    # A rank that rank 0 started gets rank 0's choice in fit (resolving "last" again could differ).
    fresh_if_no_last = cfg.task in ("fit", "fit_test")
    if started_by_rerun():
        ckpt = cfg.get("ckpt_path")
    else:
        ckpt = resolve_ckpt_path(cfg.get("ckpt_path"), run_dir, fresh_if_no_last=fresh_if_no_last)
    choice = HydraConfig.get().runtime.choices.get("strategy") if HydraConfig.initialized() else None
    seed_everything(int(cfg.seed))
    module = instantiate(cfg.model)
    datamodule = instantiate(cfg.data)
    strategy = instantiate(cfg.strategy)
    trainer_kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert isinstance(trainer_kwargs, dict)
    callbacks = build_callbacks(cfg, trainer_kwargs, explicit)
    checkpoints_in_run_dir(callbacks, run_dir)
    try:
        trainer = Trainer(
            **{str(k): v for k, v in trainer_kwargs.items()},
            strategy=strategy,
            callbacks=callbacks,
            default_root_dir=run_dir,
            config=record_precision(recorded_config(cfg), strategy.precision.name),
        )
    except (TypeError, ValueError) as err:
        # Every argument comes from the config's trainer node (or objects built from their groups).
        raise ConfigError(f"trainer: {err}") from err
    if trainer.is_global_zero and not started_by_rerun():
        print(run_line(cfg, trainer, str(choice or cfg.strategy.get("name", "custom"))), flush=True)
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
    from trainer.hooks import is_overridden

    def defines_test_data(source: Any) -> bool:
        own = getattr(type(source), "test_dataloader", None)
        return own is not None and own is not getattr(DataModule, "test_dataloader", None)

    has_data = any(defines_test_data(s) for s in (datamodule, module) if s is not None)
    return has_data and is_overridden("test_step", module)


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
    from hydra.core.hydra_config import HydraConfig

    from trainer.cli.checks import check_before_start

    check_before_start(cfg, Path(HydraConfig.get().runtime.cwd) if HydraConfig.initialized() else Path.cwd())
    for key in ("trainer", "strategy", "optim"):
        node = cfg.get(key)
        if isinstance(node, DictConfig) and OmegaConf.get_type(node) not in (dict, None):
            try:
                OmegaConf.to_object(node)
            except ValueError as err:
                raise ConfigError(str(err)) from err
            except OmegaConfBaseException as err:
                raise ConfigError(f"{key}: {str(err).splitlines()[0]}") from err


def resolve_ckpt_path(ckpt_path: str | None, run_dir: Path, fresh_if_no_last: bool = False) -> str | None:
    """``"last"`` means this run's ``checkpoints/last.ckpt``, else the newest ``last.ckpt`` of an earlier run like it.

    Earlier runs are searched under ``outputs/`` and ``multirun/`` of the folder ``geartrain`` was
    started in, among runs of the same experiment (in a sweep: the same job), see
    :func:`trainer.checkpoint.resolve.resolve_last_checkpoint`; the choice is printed, so a resume never
    silently picks the wrong file. Any other value must name a file (or a sharded checkpoint's
    folder) that exists, or a run folder (its ``checkpoints/``' ``last.ckpt``, else newest). ``fresh_if_no_last`` (training): ``"last"`` with none yet warns, gives None.
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
        if path.is_dir() and (path / "checkpoints").is_dir():  # a run folder: that run's newest checkpoint
            from trainer.checkpoint.resolve import run_folder_checkpoint

            return run_folder_checkpoint(path)
        return str(path)
    from trainer.checkpoint.resolve import resolve_last_checkpoint

    hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else None
    overrides = list(hydra_cfg.overrides.task) if hydra_cfg is not None else []
    try:
        return resolve_last_checkpoint(base, run_dir, overrides)
    except ConfigError as err:
        if not fresh_if_no_last:
            raise
        warn_no_last_checkpoint(err, group_position()[0] == 0)
        return None


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


def build_callbacks(cfg: Any, trainer_kwargs: dict[Any, Any], explicit: dict[str, str] | None = None) -> list[Any]:
    """Instantiate every entry of the ``callbacks`` and ``logger`` groups.

    Where the config has those groups they are the whole set: ``trainer_kwargs`` is changed so the
    Trainer adds no default progress bar, checkpoint or TensorBoard logger of its own (otherwise
    ``~callbacks.progress_bar`` would bring one back). The trainer flags still work as switches:
    ``trainer.enable_progress_bar=false``, ``trainer.enable_checkpointing=false`` and
    ``trainer.logger=false`` drop the matching entries. A ``monitor`` in ``explicit`` (the command
    line's keys) is held to: never logged, it ends the run (:func:`~trainer.cli.advice.hold_explicit_monitors`).
    """
    from hydra.utils import instantiate

    import callbacks as cbs
    from trainer.cli.advice import hold_explicit_monitors

    built: list[Any] = []
    for group in ("callbacks", "logger"):
        node = cfg.get(group)
        if node:
            hold_explicit_monitors(node, group, explicit or {})
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
            # The group's entries are the whole set: no default of the Trainer's. A progress bar or a
            # checkpoint callback in the group is the one (False beside one is refused, as in Lightning).
            given = (lambda cb: isinstance(cb, cbs.Checkpoint)) if flag == "enable_checkpointing" else matches
            trainer_kwargs[flag] = flag != "logger" and any(given(cb) for cb in built)
    return built


def run_job(cfg: Any) -> float | None:
    """The Hydra task: :func:`run_task`; a run that fails before writing anything leaves no run directory.

    What Hydra wrote as the job started is recorded as this run's, so a failure removes only that
    (:mod:`trainer.cli.run_dir_guard`). Returns the value of ``optimized_metric`` (None when it is
    null), for Hydra's sweepers to optimise.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from trainer.cli.run_dir_guard import job_held
    from trainer.cli.sweep_summary import optimising_sweep
    from trainer.cli.trace import ReportedMistake

    rank, world = group_position()
    try:
        with job_held(Path(HydraConfig.get().runtime.output_dir), shared=world > 1 and rank != 0):
            value = optimized_value(cfg, run_task(cfg))
    except Exception as err:
        if HydraConfig.get().mode == RunMode.RUN:
            # Past Hydra untouched, which would print a line of its own first; reported() shows it.
            raise ReportedMistake(err) from err
        raise
    if value is not None and math.isnan(value) and optimising_sweep():
        # Hydra's Optuna sweeper cannot take a NaN (it fails telling the study); a raised trial it records as failed.
        raise FloatingPointError(f"{cfg.optimized_metric} ended as nan")
    return value
