"""Config mistakes the ``geartrain`` command can see before it builds or starts anything.

Each would otherwise surface as a traceback from deep inside a run (a ``DataLoader`` refusing batch
size 0, a corpus file missing when the workers read it, a launcher refusing two machines): here
each is one :class:`~trainer.errors.ConfigError` that names the key and what would be right.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from trainer.errors import ConfigError

__all__ = ["check_before_start", "check_model_arguments", "check_tuner_options"]

#: What each tuner task accepts from ``tuner.<task>.*`` (Tuner.lr_find / Tuner.scale_batch_size).
_TUNER_KEYS = {
    "lr_find": ("min_lr", "max_lr", "num_training", "mode", "early_stop_threshold", "attr_name"),
    "scale_batch_size": ("mode", "steps_per_trial", "init_val", "max_trials", "max_val", "batch_arg_name", "margin"),
}
_MODES = {"lr_find": ("exponential", "linear"), "scale_batch_size": ("power", "binsearch")}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_tuner_options(task: str, options: dict[str, Any]) -> None:
    """Refuse a ``tuner.<task>.*`` value the tuner cannot run with, naming the override to fix."""
    key = f"tuner.{task}"
    for name in options:
        if name not in _TUNER_KEYS[task]:
            raise ConfigError(f"{key}.{name}: no such option of {task}; its options: {', '.join(_TUNER_KEYS[task])}")
    mode = options.get("mode")
    if mode is not None and str(mode).lower() not in _MODES[task]:
        raise ConfigError(f"{key}.mode={mode}: choose {' or '.join(_MODES[task])}")
    if task == "lr_find":
        low, high = options.get("min_lr", 1e-8), options.get("max_lr", 1.0)
        for name, value in (("min_lr", low), ("max_lr", high)):
            if not _number(value) or value <= 0:
                raise ConfigError(f"{key}.{name}={value}: a learning rate is a positive number, e.g. {name}=1e-6")
        if low >= high:
            raise ConfigError(f"{key}.min_lr={low} is not below {key}.max_lr={high}: the sweep goes from min to max")
        steps = options.get("num_training", 100)
        if not _whole(steps) or steps < 2:
            raise ConfigError(f"{key}.num_training={steps}: the sweep needs a whole number of steps from 2, e.g. 100")
        threshold = options.get("early_stop_threshold", 4.0)
        if threshold is not None and (not _number(threshold) or threshold <= 1):
            raise ConfigError(
                f"{key}.early_stop_threshold={threshold}: the sweep stops once the loss exceeds this many times its "
                "best, so it must be above 1 (e.g. 4.0), or null to never stop early"
            )
        return
    for name in ("steps_per_trial", "init_val", "max_trials", "max_val"):
        value = options.get(name, 1)
        if not _whole(value):
            raise ConfigError(f"{key}.{name}={value}: a whole number from 1 is expected")
    if options.get("max_val", 8192) < options.get("init_val", 2):
        raise ConfigError(
            f"{key}.max_val={options.get('max_val')} is below {key}.init_val={options.get('init_val')}: "
            "the search starts at init_val and never goes past max_val"
        )
    margin = options.get("margin", 0.05)
    if not _number(margin) or not 0 <= margin < 1:
        raise ConfigError(f"{key}.margin={margin}: a share in [0, 1) is expected, e.g. 0.05")


def check_before_start(cfg: Any, base: Path) -> None:
    """The checks of ``cfg`` that need no object built: tuner options, data, the launch topology.

    ``base`` is the folder the command was started in (relative data paths are read from there).
    """
    from omegaconf import DictConfig, OmegaConf

    if cfg.task in _TUNER_KEYS:
        node = cfg.get("tuner", {}).get(cfg.task, {}) or {}
        options = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
        assert isinstance(options, dict)
        check_tuner_options(cfg.task, {str(k): v for k, v in options.items()})
    data = cfg.get("data")
    if isinstance(data, DictConfig):
        size = data.get("batch_size")
        if size is not None and not _whole(size):
            raise ConfigError(
                f"data.batch_size={size}: the batch size is a whole number from 1, e.g. data.batch_size=32"
            )
        path = data.get("path")
        if isinstance(path, str) and path:
            where = Path(path) if Path(path).is_absolute() else base / path
            if not where.exists():
                raise ConfigError(
                    f"data.path={path}: no such file or folder ({where}). Give an existing one, or leave data.path "
                    "unset for the data's default"
                )
    trainer = cfg.get("trainer")
    nodes = trainer.get("num_nodes", 1) if isinstance(trainer, DictConfig) else 1
    if isinstance(nodes, int) and nodes > 1 and not _joined(os.environ):
        raise ConfigError(
            f"trainer.num_nodes={nodes}: the command starts processes on this machine only. Start one launcher per "
            f"machine: torchrun --nnodes={nodes} --nproc-per-node=N --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT "
            "-m trainer ..., or srun under Slurm (docs/multi-node.md)"
        )


def _joined(env: Any) -> bool:
    """Whether this process was started by torchrun or srun (the processes exist already)."""
    from strategies.launch import slurm_environment

    return "TORCHELASTIC_RUN_ID" in env or slurm_environment(dict(env)) is not None


def check_model_arguments(cfg: Any, overrides: list[str], choice: str | None) -> None:
    """The model group's keys against the model class's ``__init__``, before it is built.

    Two mistakes would otherwise end in an error from deep inside the user's or torch's code:

    - ``model._target_=my_project.Net`` without ``~model`` keeps the keys of the group's default
      (``hidden``, ``dropout`` of ``model=digits``), which ``Net`` does not take: said naming the keys
      and the form that replaces the group;
    - a value of the wrong type for an argument annotated ``int``, ``float`` or ``bool``
      (``model.lr=abc`` for ``lr: float``, which torch would refuse as ``'<=' not supported``): said
      naming the key and the type.

    A class that cannot be found is left to Hydra's instantiation, which names it.
    """
    import inspect

    from omegaconf import DictConfig, OmegaConf

    model = cfg.get("model")
    if not isinstance(model, DictConfig) or not isinstance(model.get("_target_"), str):
        return
    target = str(model._target_)
    try:
        from hydra.utils import get_object

        cls = get_object(target)
        params = inspect.signature(cls).parameters
    except Exception:
        return
    keys = [str(k) for k in model if not str(k).startswith("_")]
    open_ended = any(p.kind is p.VAR_KEYWORD for p in params.values())
    extra = [k for k in keys if k not in params]
    retargeted = any(o.lstrip("+").startswith("model._target_=") for o in overrides) and "~model" not in overrides
    if extra and not open_ended and retargeted:
        name = getattr(cls, "__name__", target)
        raise ConfigError(
            f"model._target_={target}: the other keys of model={choice or 'its default'} ({', '.join(extra)}) are "
            f"still passed, and {name} takes no {extra[0]!r}. Replace the whole group: "
            f"'~model' +model._target_={target} (and +model.<argument>=... for its own arguments)"
        )
    hints = _init_hints(cls)
    try:
        values = OmegaConf.to_container(model, resolve=True)
    except Exception:  # an interpolation that does not resolve: Hydra's instantiation names it
        return
    assert isinstance(values, dict)
    for key in keys:
        expected = _simple_type(hints.get(key))
        value = values.get(key)
        if expected is None or value is None or _fits(value, expected):
            continue
        name = getattr(cls, "__name__", target)
        raise ConfigError(
            f"model.{key}={value}: {name} takes {key}: {expected.__name__}; give {_WORDS[expected]} "
            f"(e.g. model.{key}={_example(params[key].default, expected)})"
        )


_WORDS = {int: "a whole number", float: "a number", bool: "true or false"}


def _init_hints(cls: Any) -> dict[str, Any]:
    """The resolved annotations of ``cls.__init__`` (or of a function); empty when they cannot be resolved."""
    import typing

    try:
        return typing.get_type_hints(getattr(cls, "__init__") if isinstance(cls, type) else cls)  # noqa: B009
    except Exception:
        return {}


def _simple_type(hint: Any) -> type | None:
    """``int``, ``float`` or ``bool`` for such an annotation (``float | None`` too); None for anything else."""
    import typing

    if hint in _WORDS:
        return typing.cast(type, hint)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(args) == 1 and args[0] in _WORDS and type(None) in typing.get_args(hint):
        return typing.cast(type, args[0])
    return None


def _fits(value: Any, expected: type) -> bool:
    if expected is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (expected is float and isinstance(value, float))


def _example(default: Any, expected: type) -> str:
    if _fits(default, expected):
        return str(default).lower() if expected is bool else str(default)
    return {int: "2", float: "0.01", bool: "true"}[expected]
