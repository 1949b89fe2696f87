"""The ``geartrain`` command: a Hydra app that builds everything from ``conf/`` and runs a task."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["build_callbacks", "freeze_startup_objects", "main", "run_task"]

TASKS = ("fit", "validate", "test", "predict", "fit_test")


def config_dir() -> Path:
    """The packaged configs: ``trainer/conf`` in a wheel, ``<repo>/conf`` in a source checkout.

    Also registers the schemas the YAML files extend, so the folder composes with Hydra's compose API.
    """
    from trainer.config import register_configs

    register_configs()
    here = Path(__file__).resolve().parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"geartrain's conf/ folder was not found next to {here}")


def run_task(cfg: Any) -> dict[str, float]:
    """Build module, data, strategy, callbacks and trainer from ``cfg``; run ``cfg.task``.

    Returns the final metrics: the fit's last values, then the evaluation's where the task has one.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from trainer import Trainer, seed_everything

    if cfg.task not in TASKS:
        raise ValueError(f"task={cfg.task!r} is not one of {', '.join(TASKS)}")
    seed_everything(int(cfg.seed))
    run_dir = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path.cwd()
    module = instantiate(cfg.model)
    datamodule = instantiate(cfg.data)
    strategy = instantiate(cfg.strategy)
    trainer_kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert isinstance(trainer_kwargs, dict)
    callbacks = build_callbacks(cfg, trainer_kwargs)
    trainer = Trainer(
        **{str(k): v for k, v in trainer_kwargs.items()},
        strategy=strategy,
        callbacks=callbacks,
        default_root_dir=run_dir,
        config=cfg,
    )
    ckpt = resolve_ckpt_path(cfg.get("ckpt_path"), run_dir)
    metrics: dict[str, float] = {}
    if cfg.task in ("fit", "fit_test"):
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    if cfg.task in ("validate", "test", "fit_test"):
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
    return metrics


def resolve_ckpt_path(ckpt_path: str | None, run_dir: Path) -> str | None:
    """``"last"`` means this run's ``checkpoints/last.ckpt``, else the newest ``last.ckpt`` of earlier runs.

    Earlier runs are searched under ``outputs/`` and ``multirun/`` of the folder ``geartrain`` was
    started in; the choice is printed, so a resume never silently picks the wrong file.
    """
    if ckpt_path != "last":
        return ckpt_path
    own = run_dir / "checkpoints" / "last.ckpt"
    if own.is_file():
        return str(own)
    from hydra.core.hydra_config import HydraConfig

    base = Path(HydraConfig.get().runtime.cwd) if HydraConfig.initialized() else Path.cwd()
    found = [p for root in ("outputs", "multirun") for p in (base / root).glob("**/last.ckpt")]
    if not found:
        raise FileNotFoundError(
            f"ckpt_path=last: no last.ckpt in {own.parent} nor under {base / 'outputs'} or {base / 'multirun'}"
        )
    newest = max(found, key=lambda p: p.stat().st_mtime)
    print(f"ckpt_path=last: using {newest}")
    return str(newest)


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
    from strategies.launch import slurm_environment

    slurm = slurm_environment(env) if "TORCHELASTIC_RUN_ID" not in env else None
    rank = int((slurm or env).get("RANK", "0"))
    if int((slurm or env).get("WORLD_SIZE", "1")) <= 1:
        return []
    if any(arg.startswith("hydra.run.dir=") for arg in sys.argv[1:]):
        return []
    import time

    if slurm is not None:
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
            store.compare_set(key, "", time.strftime("outputs/%Y-%m-%d/%H-%M-%S"))
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
            built.extend(instantiate(c) for c in node.values() if c is not None)
    switches = (
        ("enable_progress_bar", "callbacks", lambda cb: isinstance(cb, cbs.ProgressBar)),
        ("enable_checkpointing", "callbacks", lambda cb: isinstance(cb, cbs.ModelCheckpoint)),
        ("logger", "logger", lambda cb: getattr(cb, "is_logger", False)),
    )
    for flag, group, matches in switches:
        if not trainer_kwargs.get(flag, True):
            built = [cb for cb in built if not matches(cb)]
        if group in cfg:
            trainer_kwargs[flag] = False
    return built


def main() -> None:
    """Entry point of ``geartrain`` and ``python -m trainer``."""
    freeze_startup_objects()
    import hydra

    # The user's own code (``model._target_=my_project.Net``) is importable from where they run.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    sys.argv.extend(shared_run_dir_overrides())
    # config_dir() also registers the schemas: once, as each registration builds six structured configs.
    app = hydra.main(version_base=None, config_path=str(config_dir()), config_name="config")(run_task)
    app()


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
