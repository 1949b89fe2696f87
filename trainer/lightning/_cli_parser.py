"""The parts of :mod:`trainer.lightning.cli` a Lightning CLI program may name: parser, config saver, type aliases.

Lightning's ``LightningArgumentParser``, ``SaveConfigCallback``, ``ReduceLROnPlateau`` (with ``monitor``),
the optimizer and scheduler aliases, ``instantiate_class`` and ``instantiate_module``, under Lightning's
names and arguments; :mod:`trainer.lightning.cli` re-exports them beside ``LightningCLI``.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar, Union

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

try:
    from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, class_from_function
except ModuleNotFoundError as err:  # pragma: no cover - the dev extra installs it
    raise ModuleNotFoundError(
        f"trainer.lightning.cli (Lightning's LightningCLI) needs jsonargparse ({err}): "
        "pip install 'geartrain[cli]'; geartrain's own command line, `geartrain`, does not"
    ) from err

from callbacks.base import Callback
from trainer.common.env import SEED
from trainer.common.errors import MisconfigurationException
from trainer.common.rank_zero import rank_zero_warn
from trainer.datamodule import DataModule
from trainer.hooks import is_overridden
from trainer.module import TrainModule
from trainer.trainer import Trainer

__all__ = [
    "AUTOMATIC",
    "ActionConfigFile",
    "ArgsType",
    "ArgumentParser",
    "LRSchedulerCallable",
    "LRSchedulerType",
    "LRSchedulerTypeTuple",
    "LRSchedulerTypeUnion",
    "LightningArgumentParser",
    "ModuleType",
    "Namespace",
    "OptimizerCallable",
    "ReduceLROnPlateau",
    "SaveConfigCallback",
    "automatic_keys",
    "built_type",
    "chosen_seed",
    "class_from_function",
    "first_line",
    "function_class",
    "instantiate_class",
    "instantiate_module",
    "version",
    "with_class_path",
]

ModuleType = TypeVar("ModuleType")


class ReduceLROnPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """``ReduceLROnPlateau`` that knows the metric it watches, so a config file can name it (``monitor``)."""

    def __init__(self, optimizer: Optimizer, monitor: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(optimizer, *args, **kwargs)
        self.monitor = monitor


# Its public home (Lightning's ``cli.ReduceLROnPlateau``): jsonargparse finds a class by its short name
# (``--lr_scheduler=ReduceLROnPlateau``) only outside private modules such as this one.
ReduceLROnPlateau.__module__ = "trainer.lightning.cli"


# Lightning's aliases, under its names (they annotate a model's ``optimizer``/``scheduler`` arguments).
LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)
LRSchedulerTypeUnion = Union[LRScheduler, ReduceLROnPlateau]  # noqa: UP007 - a runtime value, not an annotation
LRSchedulerType = Union[type[LRScheduler], type[ReduceLROnPlateau]]  # noqa: UP007
ArgsType = Union[list[str], dict[str, Any], Namespace, None]  # noqa: UP007
OptimizerCallable = Callable[[Iterable], Optimizer]
LRSchedulerCallable = Callable[[Optimizer], Union[LRScheduler, ReduceLROnPlateau]]  # noqa: UP007

AUTOMATIC = "AUTOMATIC"


def _import_named_classes() -> None:
    """Import every callback, logger, profiler and strategy class Lightning names.

    jsonargparse finds a class given by its short name (``class_path: EarlyStopping``) among the
    imported subclasses of the type it expects; geartrain imports its callbacks on first use, so they
    are imported here, as importing Lightning does. None of them imports a tracker's package.
    """
    import trainer.lightning as pl

    for path in ("callbacks", "loggers", "profilers", "strategies"):
        module = sys.modules[f"{pl.__name__}.{path}"]
        for name in module.__all__:
            getattr(module, name)


_import_named_classes()

#: Lightning's package names, in a config file's class paths, and where geartrain has those classes.
_LIGHTNING_PACKAGES = ("lightning.pytorch.", "pytorch_lightning.")


def _read_lightning_class_paths() -> None:
    """Let a config file written for Lightning name classes as Lightning does (``lightning.pytorch.X``).

    jsonargparse resolves every ``class_path`` through one function; wrapped here, a path under
    ``lightning.pytorch`` or ``pytorch_lightning`` is read under ``trainer.lightning`` (Lightning's tree
    over geartrain's classes), as the program's import lines were. Other paths are left as they are.
    """
    from jsonargparse import _typehints

    resolve = _typehints.resolve_class_path_by_name
    if getattr(resolve, "_reads_lightning_paths", False):
        return

    def resolve_class_path_by_name(cls: Any, name: str) -> str:
        for package in _LIGHTNING_PACKAGES:
            if name.startswith(package):
                name = "trainer.lightning." + name[len(package) :]
                break
        return resolve(cls, name)

    resolve_class_path_by_name._reads_lightning_paths = True  # type: ignore[attr-defined]
    _typehints.resolve_class_path_by_name = resolve_class_path_by_name


_read_lightning_class_paths()
_LIGHTNING_KINDS = (Trainer, TrainModule, DataModule, Callback)


class LightningArgumentParser(ArgumentParser):
    """jsonargparse's ``ArgumentParser`` that knows Lightning's classes, optimizers and schedulers."""

    def __init__(
        self,
        *args: Any,
        description: str = "Lightning Trainer command line tool",
        env_prefix: str = "PL",
        default_env: bool = False,
        **kwargs: Any,
    ) -> None:
        """Lightning's defaults: environment variables ``PL_...`` read only with ``default_env=True``."""
        super().__init__(*args, description=description, env_prefix=env_prefix, default_env=default_env, **kwargs)
        self.callback_keys: list[str] = []
        self._optimizers: dict[str, tuple[type | tuple[type, ...], str]] = {}
        self._lr_schedulers: dict[str, tuple[type | tuple[type, ...], str]] = {}

    def add_lightning_class_args(
        self,
        lightning_class: type | Callable[..., Any],
        nested_key: str,
        subclass_mode: bool = False,
        required: bool = True,
    ) -> list[str]:
        """Add the ``__init__`` arguments of a Trainer, module, data module or callback class under ``nested_key``.

        ``subclass_mode`` takes any subclass by ``class_path``; a function that returns one of these
        classes is read as that class. Returns the names of the arguments added.
        """
        lightning_class = function_class(lightning_class)
        if not (isinstance(lightning_class, type) and issubclass(lightning_class, _LIGHTNING_KINDS)):
            raise MisconfigurationException(
                f"Cannot add arguments from: {lightning_class}. You should provide either a callable or a subclass "
                "of: Trainer, LightningModule, LightningDataModule, or Callback."
            )
        if issubclass(lightning_class, Callback):
            self.callback_keys.append(nested_key)
        if subclass_mode:
            return self.add_subclass_arguments(lightning_class, nested_key, fail_untyped=False, required=required)
        return self.add_class_arguments(
            lightning_class,
            nested_key,
            fail_untyped=False,
            instantiate=not issubclass(lightning_class, Trainer),
            sub_configs=True,
        )

    def add_optimizer_args(
        self,
        optimizer_class: type[Optimizer] | tuple[type[Optimizer], ...] = (Optimizer,),
        nested_key: str = "optimizer",
        link_to: str = AUTOMATIC,
    ) -> None:
        """Add an optimizer's arguments under ``nested_key`` (a tuple of classes: any subclass, by class path).

        ``link_to="AUTOMATIC"`` makes the CLI build it and give the model a ``configure_optimizers``;
        a key (``"model.optimizer"``) hands it to that argument instead.
        """
        self._add_optim_args(optimizer_class, Optimizer, nested_key, link_to, "params", self._optimizers)

    def add_lr_scheduler_args(
        self,
        lr_scheduler_class: LRSchedulerType | tuple[LRSchedulerType, ...] = LRSchedulerTypeTuple,
        nested_key: str = "lr_scheduler",
        link_to: str = AUTOMATIC,
    ) -> None:
        """Add a learning-rate scheduler's arguments under ``nested_key``, as :meth:`add_optimizer_args`."""
        self._add_optim_args(
            lr_scheduler_class, LRSchedulerTypeTuple, nested_key, link_to, "optimizer", self._lr_schedulers
        )

    def _add_optim_args(
        self,
        classes: Any,
        base: type | tuple[type, ...],
        nested_key: str,
        link_to: str,
        skip: str,
        register: dict[str, tuple[type | tuple[type, ...], str]],
    ) -> None:
        for cls in classes if isinstance(classes, tuple) else (classes,):
            if not (isinstance(cls, type) and issubclass(cls, base)):
                raise TypeError(f"{nested_key}: {cls!r} is not a subclass of {base}")
        kwargs: dict[str, Any] = {"instantiate": False, "fail_untyped": False, "skip": {skip}}
        if isinstance(classes, tuple):
            self.add_subclass_arguments(classes, nested_key, **kwargs)
        else:
            self.add_class_arguments(classes, nested_key, sub_configs=True, **kwargs)
        register[nested_key] = (classes, link_to)


class SaveConfigCallback(Callback):
    """Writes the parsed configuration to ``trainer.log_dir/config.yaml`` when the run is set up (rank 0).

    It refuses to overwrite a config file already there (``overwrite=True`` allows it) so a second run in
    the same directory does not hide the first one's settings. Subclass and implement :meth:`save_config`
    to store it somewhere else too (``save_to_log_dir=False`` to store it only there).
    """

    def __init__(
        self,
        parser: LightningArgumentParser,
        config: Namespace,
        config_filename: str = "config.yaml",
        overwrite: bool = False,
        multifile: bool = False,
        save_to_log_dir: bool = True,
    ) -> None:
        self.parser = parser
        self.config = config
        self.config_filename = config_filename
        self.overwrite = overwrite
        self.multifile = multifile
        self.save_to_log_dir = save_to_log_dir
        self.already_saved = False
        if not save_to_log_dir and not is_overridden("save_config", self, SaveConfigCallback):
            raise ValueError(
                "`save_to_log_dir=False` only makes sense when subclassing SaveConfigCallback to implement "
                "`save_config` and it is desired to disable the standard behavior of saving to log_dir."
            )

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        """Write the file once per run, on rank 0; every rank raises if it is already there."""
        if self.already_saved:
            return
        if self.save_to_log_dir:
            path = Path(trainer.log_dir) / self.config_filename
            exists = trainer.strategy.broadcast(path.is_file() if trainer.is_global_zero else False)
            if exists and not self.overwrite:
                raise RuntimeError(
                    f"{type(self).__name__} expected {path} to NOT exist. Aborting to avoid overwriting the results "
                    "of a previous run. Delete that config file, set `LightningCLI(save_config_callback=None)` to "
                    'save no config, or `LightningCLI(save_config_kwargs={"overwrite": True})` to overwrite it.'
                )
            if trainer.is_global_zero:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.parser.save(
                    self.config, str(path), skip_none=False, overwrite=self.overwrite, multifile=self.multifile
                )
        if trainer.is_global_zero:
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)

    def save_config(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        """Override to store the config elsewhere as well (a logger's hyperparameters); runs on rank 0 only."""


def version() -> str:
    """geartrain's installed version, for the header of a dumped config (Lightning writes its own there)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("geartrain")
    except PackageNotFoundError:
        return "unknown"


def with_class_path(class_type: type, init_args: Namespace | dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"class_path": ..., "init_args": ...}`` for a group declared with one class (no class path in its config)."""
    if isinstance(init_args, Namespace):
        init_args = init_args.as_dict()
    return {"class_path": f"{class_type.__module__}.{class_type.__name__}", "init_args": init_args or {}}


def instantiate_class(args: Any | tuple[Any, ...], init: dict[str, Any]) -> Any:
    """Build ``init["class_path"](*args, **init["init_args"])`` (``args``: one value or a tuple)."""
    module_name, _, class_name = init["class_path"].rpartition(".")
    cls = getattr(__import__(module_name, fromlist=[class_name]), class_name)
    return cls(*(args if isinstance(args, tuple) else (args,)), **init.get("init_args", {}))


def instantiate_module(class_type: type[ModuleType], config: dict[str, Any]) -> ModuleType:
    """Build ``class_type`` (or the subclass named by ``config["_class_path"]``) from a config dict."""
    parser = ArgumentParser(exit_on_error=False)
    if "_class_path" in config:
        parser.add_subclass_arguments(class_type, "module", fail_untyped=False)
        rest = {k: v for k, v in config.items() if k != "_class_path"}
        config = {"class_path": config["_class_path"], "dict_kwargs": rest}
    else:
        parser.add_class_arguments(class_type, "module", fail_untyped=False)
    return parser.instantiate_classes(parser.parse_object({"module": config})).module


def function_class(value: Any) -> Any:
    """A class as it is; a function that builds one as jsonargparse's class of it (one per function).

    jsonargparse keeps that class as an attribute of the module that asked for it; asking from this
    one module for both the subcommands and the argument groups gives one class per function.
    """
    if callable(value) and not isinstance(value, type):
        return class_from_function(value)
    return value


def first_line(component: object) -> str | None:
    """The first line of a docstring: a subcommand's help."""
    doc = inspect.getdoc(component)
    return doc.strip().splitlines()[0] if doc else None


def automatic_keys(register: dict[str, tuple[Any, str]], base: type | tuple[type, ...]) -> list[str]:
    """The keys of ``register`` built by the CLI itself (``link_to="AUTOMATIC"``) whose classes are ``base``."""
    keys = []
    for key, (classes, link_to) in register.items():
        if link_to == AUTOMATIC and any(
            issubclass(c, base) for c in (classes if isinstance(classes, tuple) else (classes,))
        ):
            keys.append(key)
    return keys


def built_type(value: Any) -> type:
    """A class, or the class a function that builds one says it returns."""
    if callable(value) and not isinstance(value, type):
        return inspect.signature(value).return_annotation
    return value


def chosen_seed(seed: bool | int) -> int | None:
    """The seed ``--seed_everything`` asks for: an int as it is, ``false`` none, ``true`` the job's seed.

    ``true`` is Lightning's ``seed_everything(None)``: the seed in the environment (a process the
    launcher started inherits rank 0's), else 0 with Lightning's warning.
    """
    if seed is False:
        return None
    if seed is not True:
        return int(seed)
    inherited = os.environ.get(SEED) or os.environ.get("PL_GLOBAL_SEED")
    if inherited is None:
        rank_zero_warn("No seed found, seed set to 0")
        return 0
    return int(inherited)
