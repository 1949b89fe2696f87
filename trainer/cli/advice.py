"""What the ``geartrain`` command checks and says about the choices a user made, before it builds anything.

Three kinds of choices are read against what the user typed on the command line:

- the ``optim`` group reaches only a model whose config hands it on (``optimizer: ${optim.optimizer}``,
  as the digits model's does). For a model that builds its own optimizer in ``configure_optimizers``
  an ``optim`` override would do nothing: it is refused, naming what to set instead, and the group
  is left out of the config the run records (TensorBoard's HPARAMS, the checkpoint), so no run
  claims an optimizer it did not use;
- a ``monitor`` the user set on a callback is held to: a name that is never logged ends the run
  naming the logged keys (the packaged defaults stay lenient: they monitor the digits job's names,
  which an own project may not log);
- what the run uses (strategy, processes, device, precision, a trial's parameters) is said in one
  line as it starts; a strategy of several processes left at ``devices=auto`` on a machine without
  GPUs runs one process: said in that line, with the override that starts more;
- ``ckpt_path=last`` that continues training an earlier run continues it in that run's directory;
- ``hydra/launcher=local`` runs each job in a process of its own whose output goes to a file: said
  in one line as the sweep starts (:class:`LauncherNote`), as the console stays quiet until it ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from trainer.errors import ConfigError

__all__ = [
    "LauncherNote",
    "explicit_keys",
    "hold_explicit_monitors",
    "one_process_note",
    "optim_is_used",
    "record_precision",
    "recorded_config",
    "refuse_unused_optim",
    "resume_dir_overrides",
    "run_line",
    "trial_params",
]


def explicit_keys(overrides: Sequence[str]) -> dict[str, str]:
    """``{key: value}`` of the command line's overrides (``+``/``++``/``~`` prefixes dropped)."""
    keys: dict[str, str] = {}
    for item in overrides:
        key, _, value = item.lstrip("+~").partition("=")
        keys[key] = value
    return keys


def command_line_keys() -> dict[str, str]:
    """:func:`explicit_keys` of this Hydra job's overrides; empty outside a Hydra job."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    return explicit_keys(list(HydraConfig.get().overrides.task))


def optim_is_used(cfg: Any) -> bool:
    """Whether the model's config hands the ``optim`` group on (an ``${optim...}`` interpolation in it)."""
    from omegaconf import OmegaConf

    model = cfg.get("model")
    if model is None or cfg.get("optim") is None:
        return False
    raw = OmegaConf.to_container(model, resolve=False)
    return "${optim" in repr(raw)


def refuse_unused_optim(cfg: Any, explicit: dict[str, str]) -> None:
    """Refuse an ``optim`` override that the model would ignore (it builds its own optimizer)."""
    if optim_is_used(cfg):
        return
    given = sorted(k for k in explicit if k == "optim" or k.startswith("optim."))
    if not given:
        return
    target = cfg.model.get("_target_", "the model") if cfg.get("model") is not None else "the model"
    shown = " ".join(f"{k}={explicit[k]}" for k in given)
    raise ConfigError(
        f"{shown}: does nothing here: {target} builds its own optimizer (configure_optimizers) and its config "
        "takes nothing from the optim group.\n"
        "Set the value on your model instead (e.g. model.lr=0.01 for an __init__ argument lr), or give its "
        "__init__ `optimizer`/`scheduler` arguments and its config `optimizer: ${optim.optimizer}` "
        "(docs/configuration.md#the-optim-group)"
    )


def recorded_config(cfg: Any) -> Any:
    """The config the run records: without the ``optim`` group when the model does not use it."""
    if optim_is_used(cfg) or cfg.get("optim") is None:
        return cfg
    from omegaconf import DictConfig, OmegaConf, open_dict

    copy = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    assert isinstance(copy, DictConfig)
    with open_dict(copy):
        copy.pop("optim")
    return copy


def hold_explicit_monitors(node: Any, group: str, explicit: dict[str, str]) -> None:
    """Make each callback whose ``monitor`` the user set raise when that metric is never logged.

    ``ModelCheckpoint`` gets ``missing_monitor="raise"``, ``EarlyStopping`` ``strict=True``, as in
    Python (and in Lightning); unless the user set those too.
    """
    from omegaconf import DictConfig, open_dict

    for name, entry in node.items():
        if not isinstance(entry, DictConfig) or f"{group}.{name}.monitor" not in explicit:
            continue
        with open_dict(entry):
            if "missing_monitor" in entry and f"{group}.{name}.missing_monitor" not in explicit:
                entry.missing_monitor = "raise"
            if "strict" in entry and f"{group}.{name}.strict" not in explicit:
                entry.strict = True


def run_line(cfg: Any, trainer: Any, name: str) -> str:
    """What the run uses, said once as it starts (rank 0): strategy, processes, device, precision.

    ``strategy=amp: 1 process on cpu, precision bf16-mixed``. The one-process note
    (:func:`one_process_note`) follows it on the same line, and a trial of a sweep adds its parameters
    (:func:`trial_params`), so every job's output says which values it trained with.
    """
    count = int(trainer.world_size)
    line = f"strategy={name}: {count} process{'es' if count != 1 else ''} on {trainer.strategy.root_device.type}"
    line += f", precision {trainer.precision}"
    note = one_process_note(cfg, count, name)
    if note is not None:
        line += f"; {note}"
    trial = trial_params(cfg)
    if trial:
        line += "; " + trial
    return line


def trial_params(cfg: Any) -> str:
    """``trial 3: optim.lr=0.0017 model.hidden=32`` in a sweep whose sweeper lists its ``params``; else ``""``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return ""
    hydra = HydraConfig.get()
    swept = hydra.sweeper.get("params") or {}
    shown = []
    for key in swept:
        value = OmegaConf.select(cfg, str(key), default=None)
        shown.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return f"trial {hydra.job.num}: {' '.join(shown)}" if shown else ""


def one_process_note(cfg: Any, world_size: int, name: str) -> str | None:
    """What to add when a strategy of several processes finds no GPU at ``devices=auto`` and runs one.

    Only a strategy that says what starts more of its processes (:attr:`Strategy.more_processes`:
    ``ddp`` and its aliases, ``fsdp``) gets the note, and the note names that override, which the tests
    run (``tests/test_cli_newcomer.py``). A one-process strategy (``single``, ``amp``, ``dp``) gets
    none: ``trainer.devices=2`` is refused there.
    """
    strategy = cfg.get("strategy")
    if strategy is None or world_size > 1:
        return None
    from strategies.registry import find_strategy

    found = find_strategy(str(strategy.get("name", name)))
    more = found[0].more_processes if found is not None else None
    if more is None:
        return None
    devices = [cfg.get("trainer", {}).get("devices", "auto"), strategy.get("devices", "auto")]
    if any(d not in ("auto", None) for d in devices):
        return None
    import torch

    if torch.cuda.is_available():
        return None
    return f"no GPU here, so devices=auto is one process: add {more} for two processes on this CPU"


def record_precision(config: Any, precision: str) -> Any:
    """The recorded config with the precision the run uses, where the config left it to the strategy.

    ``trainer.precision: null`` (and ``strategy.precision: null``) mean "the strategy's" (``amp``:
    bf16-mixed on a CPU): ``precision`` is then the built strategy's, and TensorBoard's HPARAMS and
    the checkpoint show it rather than ``None``. A ``trainer.precision`` the config sets is in force
    as written: the config is returned as it is.
    """
    if config is None or not _left_to_strategy(config.get("trainer")):
        return config
    nodes = [name for name in ("trainer", "strategy") if _left_to_strategy(config.get(name))]
    from omegaconf import DictConfig, OmegaConf, open_dict

    copy = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    assert isinstance(copy, DictConfig)
    with open_dict(copy):
        for name in nodes:
            copy[name].precision = precision
    return copy


def _left_to_strategy(node: Any) -> bool:
    return node is not None and "precision" in node and node.get("precision") is None


def resume_dir_overrides(args: Sequence[str], base: Path) -> list[str]:
    """``hydra.run.dir=<the run resumed>`` when ``ckpt_path=last`` continues training an earlier run.

    A resumed fit continues the run in its own directory: the checkpoints next to the earlier ones,
    and TensorBoard's curves in the same ``tensorboard/`` folder, so the run shows as one curve from
    step 0 to its end rather than as two runs. The run is the one ``ckpt_path=last`` would resume
    (:func:`trainer.checkpoint.resolve.resolve_last_checkpoint`: the newest ``last.ckpt`` of a run with the same
    experiment, model and data). Returns ``[]`` (a fresh folder, as usual) for a sweep, a task that
    does not train, a folder the user chose, or when there is nothing to resume.
    """
    keys = explicit_keys([a for a in args if not a.startswith("-")])
    if keys.get("ckpt_path") != "last" or keys.get("task", "fit_test") not in ("fit", "fit_test"):
        return []
    if any(a in ("-m", "--multirun") for a in args) or "hydra.run.dir" in keys:
        return []
    if any(a.startswith(("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "--shell-completion")) for a in args):
        return []
    import contextlib
    import io

    from trainer.checkpoint.resolve import resolve_last_checkpoint

    overrides = [a for a in args if not a.startswith("-")]
    nowhere = base / "outputs" / ".geartrain-no-run"  # has no last.ckpt of its own
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its "using ..." line: said below, once
            found = Path(resolve_last_checkpoint(base, nowhere, overrides))
    except ConfigError:
        return []  # nothing to resume: the run itself says so
    run_dir = found.parent.parent
    shown = run_dir.relative_to(base) if run_dir.is_relative_to(base) else run_dir
    print(f"ckpt_path=last: resuming {found}; the run continues in {shown} (its checkpoints and TensorBoard curves)")
    return [f"hydra.run.dir={run_dir.as_posix()}"]


class LauncherNote(Callback):
    """A Hydra callback (``hydra.callbacks`` in ``conf/config.yaml``): where a local submitit sweep's output goes."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        """Say once, before the jobs start, that their output is in files under the sweep folder."""
        launcher = str(config.hydra.launcher.get("_target_", ""))
        if launcher.endswith("submitit_launcher.LocalLauncher"):
            folder = config.hydra.launcher.get("submitit_folder", "<sweep dir>/.submitit/%j")
            print(
                f"hydra/launcher=local: each job runs in a process of its own; its output (progress, final "
                f"metrics, errors) goes to {str(folder).replace('%j', '<job id>')}/<job id>_0_log.out and "
                "_log.err, not to this console",
                flush=True,
            )
