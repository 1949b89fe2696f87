"""Lightning's ``LightningCLI`` (``lightning.pytorch.cli``) over geartrain: a Lightning CLI program runs unchanged.

A program that ends in ``LightningCLI(MyModel, MyData)`` gets Lightning's command line::

    python main.py fit --config config.yaml --trainer.max_epochs 3 --model.lr 0.01
    python main.py fit --print_config > config.yaml
    python main.py test --ckpt_path best --data.batch_size 64

with ``fit``, ``validate``, ``test`` and ``predict`` (each takes its ``Trainer`` method's arguments),
``--config`` files, ``--print_config``, class paths for models, data modules, callbacks, optimizers and
schedulers, ``--seed_everything`` and ``PL_...`` environment variables (``parser_kwargs={"default_env":
True}``), on jsonargparse as in Lightning: an optional extra, ``pip install 'geartrain[cli]'``. The
classes keep Lightning's names, arguments and overridable methods, so a subclass written for Lightning
works too. geartrain's own command line is the Hydra ``geartrain`` command (:mod:`trainer.cli`); where
this one differs from Lightning's: docs/lightning.md ("LightningCLI").
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from functools import partial, update_wrapper
from pathlib import Path
from types import MethodType
from typing import Any, Union

from lightning_utilities.core.imports import RequirementCache
from torch.optim import Optimizer

from callbacks.base import Callback
from trainer.common.errors import MisconfigurationException
from trainer.common.rank_zero import rank_zero_warn
from trainer.datamodule import DataModule
from trainer.hooks import is_overridden
from trainer.lightning import __version__ as lightning_version
from trainer.lightning._cli_hparams import SavesConfig, checkpoint_model_config
from trainer.lightning._cli_parser import (
    AUTOMATIC,
    ActionConfigFile,
    ArgsType,
    LightningArgumentParser,
    LRSchedulerCallable,
    LRSchedulerType,
    LRSchedulerTypeTuple,
    LRSchedulerTypeUnion,
    ModuleType,
    Namespace,
    OptimizerCallable,
    ReduceLROnPlateau,
    SaveConfigCallback,
    automatic_keys,
    built_type,
    chosen_seed,
    first_line,
    function_class,
    instantiate_class,
    instantiate_module,
    version,
    with_class_path,
)
from trainer.module import TrainModule
from trainer.trainer import Trainer
from trainer.utils import seed_everything

__all__ = [
    "ArgsType",
    "LRSchedulerCallable",
    "LRSchedulerType",
    "LRSchedulerTypeTuple",
    "LRSchedulerTypeUnion",
    "LightningArgumentParser",
    "LightningCLI",
    "ModuleType",
    "OptimizerCallable",
    "ReduceLROnPlateau",
    "SaveConfigCallback",
    "instantiate_class",
    "instantiate_module",
]


#: Lightning's flag, for programs and tests that read it: jsonargparse with its ``signatures`` extra is here.
_JSONARGPARSE_SIGNATURES_AVAILABLE = RequirementCache("jsonargparse[signatures]>=4.39")


class LightningCLI:
    """Parse the command line and config files, build model, data module and ``Trainer``, run a subcommand.

    Lightning's arguments and defaults; see the module's docstring for the command line it makes.
    """

    def __init__(
        self,
        model_class: type[TrainModule] | Callable[..., TrainModule] | None = None,
        datamodule_class: type[DataModule] | Callable[..., DataModule] | None = None,
        save_config_callback: type[SaveConfigCallback] | None = SaveConfigCallback,
        save_config_kwargs: dict[str, Any] | None = None,
        trainer_class: type[Trainer] | Callable[..., Trainer] = Trainer,
        trainer_defaults: dict[str, Any] | None = None,
        seed_everything_default: bool | int = True,
        parser_kwargs: dict[str, Any] | dict[str, dict[str, Any]] | None = None,
        parser_class: type[LightningArgumentParser] = LightningArgumentParser,
        subclass_mode_model: bool = False,
        subclass_mode_data: bool = False,
        args: ArgsType = None,
        run: bool = True,
        auto_configure_optimizers: bool = True,
        load_from_checkpoint_support: bool = True,
    ) -> None:
        self.save_config_callback = save_config_callback
        self.save_config_kwargs = save_config_kwargs or {}
        self.trainer_class = trainer_class
        self.trainer_defaults = trainer_defaults or {}
        self.seed_everything_default = seed_everything_default
        self.parser_kwargs = parser_kwargs or {}
        self.parser_class = parser_class
        self.auto_configure_optimizers = auto_configure_optimizers
        self.model_class = model_class
        self._model_class: Any = model_class or TrainModule
        self.subclass_mode_model = model_class is None or subclass_mode_model
        self.datamodule_class = datamodule_class
        self._datamodule_class: Any = datamodule_class or DataModule
        self.subclass_mode_data = datamodule_class is None or subclass_mode_data

        names = self.subcommands()
        main_kwargs = {k: v for k, v in self.parser_kwargs.items() if k not in names}
        sub_kwargs = {k: v for k, v in self.parser_kwargs.items() if k in names}
        self.setup_parser(run, main_kwargs, sub_kwargs)
        self.parse_arguments(self.parser, args)
        self._parse_ckpt_path()
        self.subcommand: str | None = self.config["subcommand"] if run else None
        self._set_seed()
        if load_from_checkpoint_support:
            self._add_instantiators()
        self.before_instantiate_classes()
        self.instantiate_classes()
        self.after_instantiate_classes()
        if self.subcommand is not None:
            self._run_subcommand(self.subcommand)

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """Make one parser, with ``-c/--config``."""
        # Lightning's first line (the API the config is written for), then what ran it.
        kwargs.setdefault("dump_header", [f"lightning.pytorch=={lightning_version}", f"geartrain=={version()}"])
        parser = self.parser_class(**kwargs)
        parser.add_argument(
            "-c", "--config", action=ActionConfigFile, help="Path to a configuration file in json or yaml format."
        )
        return parser

    def setup_parser(
        self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]
    ) -> None:
        """Make ``self.parser``: one sub-parser per subcommand, or (``run=False``) the arguments directly."""
        self.parser = self.init_parser(**main_kwargs)
        if not add_subcommands:
            self._add_arguments(self.parser)
            return
        self._subcommand_method_arguments: dict[str, list[str]] = {}
        self._subcommand_parsers: dict[str, LightningArgumentParser] = {}
        subcommands = self.parser.add_subcommands()
        klass = function_class(self.trainer_class)
        for name, skip in self.subcommands().items():
            method = getattr(klass, name)
            description = first_line(method)
            kwargs = dict(subparser_kwargs.get(name, {}))
            kwargs.setdefault("description", description)
            parser = self.init_parser(**kwargs)
            self._add_arguments(parser)
            self._subcommand_method_arguments[name] = parser.add_method_arguments(klass, name, skip=set(skip))
            self._subcommand_parsers[name] = parser
            subcommands.add_subcommand(name, parser, help=description)

    def add_default_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """``--seed_everything``: an int seeds with it, ``true`` with a random seed, ``false`` not at all."""
        parser.add_argument(
            "--seed_everything",
            type=Union[bool, int],  # noqa: UP007 - jsonargparse reads it at run time
            default=self.seed_everything_default,
            help="Set to an int to run seed_everything with this value before classes instantiation. "
            "Set to True to use a random seed.",
        )

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """``trainer``, ``model`` and ``data`` argument groups."""
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        parser.set_defaults({f"trainer.{k}": v for k, v in self.trainer_defaults.items() if k != "callbacks"})
        parser.add_lightning_class_args(self._model_class, "model", subclass_mode=self.subclass_mode_model)
        parser.add_lightning_class_args(
            self._datamodule_class,
            "data",
            subclass_mode=self.subclass_mode_data,
            required=self.datamodule_class is not None,  # a module may bring its own loaders
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Override to add arguments or links (``parser.link_arguments``)."""

    def _add_arguments(self, parser: LightningArgumentParser) -> None:
        self.add_default_arguments_to_parser(parser)
        self.add_core_arguments_to_parser(parser)
        self.add_arguments_to_parser(parser)
        if self.auto_configure_optimizers:
            if not parser._optimizers:
                parser.add_optimizer_args((Optimizer,))
            if not parser._lr_schedulers:
                parser.add_lr_scheduler_args(LRSchedulerTypeTuple)
        self.link_optimizers_and_lr_schedulers(parser)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """The subcommands, each with the ``Trainer`` method arguments the CLI fills itself."""
        return {
            "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
            "validate": {"model", "dataloaders", "datamodule"},
            "test": {"model", "dataloaders", "datamodule"},
            "predict": {"model", "dataloaders", "datamodule"},
        }

    @staticmethod
    def link_optimizers_and_lr_schedulers(parser: LightningArgumentParser) -> None:
        """Hand each optimizer or scheduler group whose ``link_to`` is a key to that key."""
        for key, (classes, link_to) in {**parser._optimizers, **parser._lr_schedulers}.items():
            if link_to == AUTOMATIC:
                continue
            if isinstance(classes, tuple):
                parser.link_arguments(key, link_to)
            else:
                parser.link_arguments(key, link_to, compute_fn=partial(with_class_path, classes))

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Parse ``args`` (``sys.argv`` when ``None``; a dict or ``Namespace`` as a config) into ``self.config``."""
        if args is not None and len(sys.argv) > 1:
            rank_zero_warn(
                "LightningCLI's args parameter is intended to run from within Python like if it were from the command "
                "line. To prevent mistakes it is not recommended to provide both args and command line arguments, "
                f"got: sys.argv[1:]={sys.argv[1:]}, args={args}."
            )
        if isinstance(args, (dict, Namespace)):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)

    def _parse_ckpt_path(self) -> None:
        """With ``--ckpt_path FILE``, the model's arguments default to the hyperparameters saved in the file."""
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        ckpt_path = self.config[subcommand].get("ckpt_path")
        if not ckpt_path or not Path(ckpt_path).is_file():
            return  # "best", "last", a sharded directory: nothing to read before the trainer resolves it
        hparams = checkpoint_model_config(ckpt_path)
        if not hparams:
            return
        try:
            self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write(
                f"Parsing of ckpt_path hyperparameters failed! (the hyperparameters saved in {ckpt_path})\n"
            )
            raise

    def _add_instantiators(self) -> None:
        """Build model and data module so that their saved hyperparameters are the parsed config (see below)."""
        for key, cls, subclasses in (
            ("model", self._model_class, self.subclass_mode_model),
            ("data", self._datamodule_class, self.subclass_mode_data),
        ):
            self.parser.add_instantiator(SavesConfig(self, key), built_type(cls), subclasses=subclasses)

    def before_instantiate_classes(self) -> None:
        """Override to act on ``self.config`` before anything is built."""

    def instantiate_classes(self) -> None:
        """Build ``self.datamodule``, ``self.model`` (with its optimizers) and ``self.trainer``."""
        self.config_init = self.parser.instantiate_classes(self.config)
        self.datamodule = self._get(self.config_init, "data")
        self.model = self._get(self.config_init, "model")
        self._add_configure_optimizers_method_to_model(self.subcommand)
        self.trainer = self.instantiate_trainer()

    def after_instantiate_classes(self) -> None:
        """Override to act once everything is built, before the subcommand runs."""

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """Build the trainer from its config group, ``kwargs`` and the callbacks of callback groups."""
        extra = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        return self._instantiate_trainer(config, extra)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        if "callbacks" not in config:
            rank_zero_warn(
                f"The `{getattr(self.trainer_class, '__qualname__', self.trainer_class)}` class does not expose the "
                "`callbacks` argument so they will not be included."
            )
            return self.trainer_class(**config)
        given = config["callbacks"]
        config["callbacks"] = [] if given is None else list(given) if isinstance(given, list) else [given]
        config["callbacks"].extend(callbacks)
        defaults = self.trainer_defaults.get("callbacks")
        if defaults is not None:
            config["callbacks"].extend(defaults if isinstance(defaults, list) else [defaults])
        if self.save_config_callback and not config.get("fast_dev_run", False):
            config["callbacks"].append(
                self.save_config_callback(
                    self._parser(self.subcommand),
                    self.config.get(str(self.subcommand), self.config),
                    **self.save_config_kwargs,
                )
            )
        return self.trainer_class(**config)

    @staticmethod
    def configure_optimizers(lightning_module: TrainModule, optimizer: Optimizer, lr_scheduler: Any = None) -> Any:
        """What the model's ``configure_optimizers`` returns when the CLI builds its optimizer (override to change)."""
        if lr_scheduler is None:
            return optimizer
        if isinstance(lr_scheduler, ReduceLROnPlateau):
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": lr_scheduler, "monitor": lr_scheduler.monitor},
            }
        return [optimizer], [lr_scheduler]

    def _add_configure_optimizers_method_to_model(self, subcommand: str | None) -> None:
        """Give the model a ``configure_optimizers`` from the ``AUTOMATIC`` optimizer (and scheduler) groups."""
        if not self.auto_configure_optimizers:
            return
        parser = self._parser(subcommand)
        optimizers = automatic_keys(parser._optimizers, Optimizer)
        schedulers = automatic_keys(parser._lr_schedulers, LRSchedulerTypeTuple)
        if not optimizers:
            return
        if len(optimizers) > 1 or len(schedulers) > 1:
            raise MisconfigurationException(
                f"`{type(self).__name__}.add_configure_optimizers_method_to_model` expects at most one optimizer and "
                f"one lr_scheduler to be 'AUTOMATIC', but found {optimizers + schedulers}. In this case the user is "
                "expected to link the argument groups and implement `configure_optimizers`."
            )
        optimizer_init = self._class_init(parser._optimizers, optimizers[0])
        if not optimizer_init:
            return  # the group exists but the command line and config gave no optimizer
        scheduler_init = self._class_init(parser._lr_schedulers, schedulers[0]) if schedulers else None
        if is_overridden("configure_optimizers", self.model):
            warnings.warn(
                f"`{type(self.model).__name__}.configure_optimizers` will be overridden by "
                f"`{type(self).__name__}.configure_optimizers`.",
                UserWarning,
                stacklevel=2,
            )
        optimizer = instantiate_class(self.model.parameters(), optimizer_init)
        scheduler = instantiate_class(optimizer, scheduler_init) if scheduler_init else None
        fn = partial(self.configure_optimizers, optimizer=optimizer, lr_scheduler=scheduler)
        update_wrapper(fn, self.configure_optimizers)
        self.model.configure_optimizers = MethodType(fn, self.model)

    def _class_init(self, register: dict[str, tuple[Any, str]], key: str) -> Any:
        classes = register[key][0]
        init = self._get(self.config_init, key)
        return init if isinstance(classes, tuple) else with_class_path(classes, init)

    def _parser(self, subcommand: str | None) -> LightningArgumentParser:
        return self.parser if subcommand is None else self._subcommand_parsers[subcommand]

    def _get(self, config: Namespace, key: str, default: Any = None) -> Any:
        """A config value, from inside the subcommand's group when there is one."""
        return config.get(str(self.subcommand), config).get(key, default)

    def _run_subcommand(self, subcommand: str) -> None:
        """``before_<subcommand>``, the subcommand (the CLI's method of that name, else the trainer's), ``after_...``."""
        before = getattr(self, f"before_{subcommand}", None)
        if callable(before):
            before()
        run = getattr(self, subcommand, getattr(self.trainer, subcommand))
        run(**self._prepare_subcommand_kwargs(subcommand))
        after = getattr(self, f"after_{subcommand}", None)
        if callable(after):
            after()

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        """The subcommand's own arguments from the config, with the model and data module built here."""
        allowed = self._subcommand_method_arguments[subcommand]
        kwargs = {k: v for k, v in self.config_init[subcommand].items() if k in allowed}
        kwargs["model"] = self.model
        if self.datamodule is not None:
            kwargs["datamodule"] = self.datamodule
        return kwargs

    def _set_seed(self) -> None:
        """Seed as ``seed_everything`` says and write the seed used back into the config (so it is saved)."""
        seed = chosen_seed(self._get(self.config, "seed_everything"))
        if seed is None:
            return
        seed = seed_everything(seed, workers=True)
        (self.config[self.subcommand] if self.subcommand else self.config)["seed_everything"] = seed
