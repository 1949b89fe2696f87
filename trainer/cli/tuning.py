"""The ``geartrain`` command's tuning side: ``task=lr_find``, ``task=scale_batch_size``, the optimised metric.

``run_tuner_task`` runs :class:`~trainer.Tuner` on the job the config builds and prints the result
with the override that uses it. ``optimized_value`` is what the Hydra task returns, so a sweeper
(Optuna) can optimise ``optimized_metric``; ``log_trial_hparams`` records the run's swept
hyperparameters with that value in TensorBoard's HPARAMS view.
"""

from __future__ import annotations

import math
from typing import Any

from trainer.errors import ConfigError

__all__ = ["TUNER_TASKS", "log_trial_hparams", "optimized_value", "run_tuner_task"]

TUNER_TASKS = ("lr_find", "scale_batch_size")


def run_tuner_task(cfg: Any, trainer: Any, module: Any, datamodule: Any) -> dict[str, float]:
    """Run the tuner ``cfg.task`` names with the options under ``cfg.tuner``; print what to run next."""
    from omegaconf import OmegaConf

    from trainer import Tuner

    options = OmegaConf.to_container(cfg.get("tuner", {}).get(cfg.task, {}) or {}, resolve=True)
    assert isinstance(options, dict)
    kwargs = {str(k): v for k, v in options.items()}
    tuner = Tuner(trainer)
    try:
        if cfg.task == "lr_find":
            result = tuner.lr_find(module, datamodule=datamodule, update_attr=False, **kwargs)
            losses = result.results["loss"] if result is not None else []
            if losses and not any(math.isfinite(loss) for loss in losses):
                first = result.results["lr"][0] if result is not None else kwargs.get("min_lr")
                raise ConfigError(
                    f"lr_find: the loss was not finite at any step, from the first (lr={first:g}) on, so there is "
                    "no learning rate to suggest: the model or the data gives NaN/inf whatever the rate. Check them "
                    "(task=fit with trainer.on_nonfinite=raise names the first such step)"
                )
            reason = result.no_suggestion_reason(options="tuner.lr_find.") if result is not None else None
            if reason is not None:  # a task that suggests nothing failed: said once, and the exit code says it
                raise ConfigError(reason)
            lr = result.suggestion() if result is not None else None
            if trainer.is_global_zero:
                if lr is None:
                    print("lr_find: no suggestion: the sweep recorded no steps; raise tuner.lr_find.num_training")
                else:
                    where = (
                        f"; the curve is in TensorBoard: tensorboard --logdir {trainer.logger.log_dir}"
                        if trainer.logger is not None and hasattr(trainer.logger, "log_dir")
                        else ""
                    )
                    print(f"lr_find: suggested lr {lr:.3g}{where}")
                    print(f"  use it: geartrain optim.lr={lr:.3g}")
            return {"lr_find/suggestion": lr} if lr is not None else {}
        size = tuner.scale_batch_size(module, datamodule=datamodule, **kwargs)
    except TypeError as err:
        raise ConfigError(f"tuner.{cfg.task}: {err}") from err
    held = _training_set_size(trainer)
    if size is not None and held is not None and size >= held:
        # Like Lightning, the search stops at the first size that holds the whole training set (2048
        # for 1,078 samples) and returns it; a larger batch trains as that one does, so the
        # suggestion is the training set's size.
        size = held
        if trainer.is_global_zero:
            print(f"scale_batch_size: every size fits, up to the whole training set in one batch ({held} samples)")
            print(f"  use it: geartrain data.batch_size={size}")
    elif trainer.is_global_zero:
        print(f"scale_batch_size: the largest batch size that fits is {size}")
        print(f"  use it: geartrain data.batch_size={size}")
    return {"scale_batch_size/batch_size": float(size)} if size is not None else {}


def _training_set_size(trainer: Any) -> int | None:
    """The number of samples the training loader holds; None where its dataset has no length."""
    try:
        return len(trainer.train_dataloader.dataset)
    except (AttributeError, TypeError):
        return None


def optimized_value(cfg: Any, metrics: dict[str, float]) -> float | None:
    """The value of ``cfg.optimized_metric`` in the run's final metrics (None when it is null).

    A name the run did not log is refused, listing those it did, so a sweep never optimises nothing.
    """
    name = cfg.get("optimized_metric")
    if name is None:
        return None
    if name not in metrics:
        logged = ", ".join(sorted(metrics)) or "nothing"
        raise ConfigError(
            f"optimized_metric={name}: the run did not log it (final metrics: {logged}); name one of those"
        )
    value = float(metrics[name])
    return value if math.isfinite(value) else float("nan")


def log_trial_hparams(cfg: Any, trainer: Any, name: str, value: float) -> None:
    """Give every logger with ``log_hyperparams`` the run's overridden values and ``hparams/<name>``.

    The hyperparameters are the command-line overrides of this run (under a sweep, the trial's
    parameters), read back from the composed config so their types are right.
    """
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return
    params: dict[str, Any] = {}
    for override in HydraConfig.get().overrides.task:
        key, _, raw = override.lstrip("+~").partition("=")
        if key.startswith("hydra.") or key in ("hparams_search", "optimized_metric"):
            continue
        found = OmegaConf.select(cfg, key, default=None)
        params[key] = found if isinstance(found, (int, float, str, bool)) else raw
    if not params:
        return
    module = trainer.lightning_module
    for logger in trainer.loggers:
        if hasattr(logger, "log_hyperparams"):
            # After a run in processes the strategy started, this process's logger was never set up
            # (its folder, save_dir=None, is the run directory): set it up as the workers' was.
            logger.setup(trainer, module, "fit")
            logger.log_hyperparams(params, {f"hparams/{name}": value})
