"""The ``geartrain`` command: a Hydra app that builds everything from ``conf/`` and runs a task."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["build_callbacks", "main", "run_task"]

TASKS = ("fit", "validate", "test", "predict", "fit_test")


def config_dir() -> Path:
    """The packaged configs: ``trainer/conf`` in a wheel, ``<repo>/conf`` in a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"geartrain's conf/ folder was not found next to {here}")


def run_task(cfg: Any) -> dict[str, float]:
    """Build module, data, strategy, callbacks and trainer from ``cfg``; run ``cfg.task``.

    Returns the final metrics (those of the evaluation when the task has one).
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
    ckpt = cfg.get("ckpt_path")
    metrics: dict[str, float] = {}
    if cfg.task in ("fit", "fit_test"):
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    if cfg.task in ("validate", "test", "fit_test"):
        stage = "validate" if cfg.task == "validate" else "test"
        eval_ckpt = ckpt if cfg.task != "fit_test" else None
        metrics = getattr(trainer, stage)(module, datamodule=datamodule, ckpt_path=eval_ckpt)
    if cfg.task == "predict":
        outputs = trainer.predict(module, datamodule=datamodule, ckpt_path=ckpt)
        print(f"predict: {len(outputs)} batches of outputs")
    if trainer.is_global_zero and metrics:
        width = max(len(k) for k in metrics)
        print(f"final metrics ({cfg.task}, run directory {run_dir}):")
        for key in sorted(metrics):
            print(f"  {key:<{width}}  {metrics[key]:.4f}")
    return metrics


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
    import hydra

    # The user's own code (``model._target_=my_project.Net``) is importable from where they run.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    app = hydra.main(version_base=None, config_path=str(config_dir()), config_name="config")(run_task)
    app()
