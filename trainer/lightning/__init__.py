"""Lightning's module tree over geartrain's objects: ``import lightning.pytorch as pl`` -> ``import trainer.lightning as pl``.

A Lightning program ports by changing its import lines only::

    import trainer.lightning as pl                                  # was: import lightning.pytorch as pl
    from trainer.lightning.callbacks import ModelCheckpoint         # was: from lightning.pytorch.callbacks import ...
    from trainer.lightning.utilities.rank_zero import rank_zero_info

    class Net(pl.LightningModule): ...
    pl.Trainer(max_epochs=3, callbacks=[pl.callbacks.EarlyStopping("val_loss")]).fit(Net())

Every name here is geartrain's own object under Lightning's name and path (``pl.LightningModule is
trainer.TrainModule``): nothing is implemented twice, and what geartrain refuses it refuses under
either name. :data:`TREE` is the whole map, one entry per Lightning module path. Its modules are
made here when ``trainer.lightning`` is first imported (plain module objects, cheap), and each name
is imported from its home on first use, so importing this package does not import the Trainer.

>>> import trainer.lightning as pl
>>> from trainer import TrainModule
>>> pl.LightningModule is TrainModule
True
"""

from __future__ import annotations

import importlib
import importlib.abc
import os
import sys
import types
from collections.abc import Callable
from typing import Any

from trainer.common.errors import disable_possible_user_warnings
from trainer.lightning._plugins import PLUGINS_TREE
from trainer.lightning._refused import REFUSED

#: The Lightning release whose public API this tree follows (programs compare it to pick features).
__version__ = "2.6.6"

# As Lightning's package: POSSIBLE_USER_WARNINGS=0 (or off) silences PossibleUserWarning.
if os.environ.get("POSSIBLE_USER_WARNINGS", "").lower() in ("0", "off"):
    disable_possible_user_warnings()

__all__ = ["REFUSED", "TREE", "Callback", "LightningDataModule", "LightningModule", "Trainer", "seed_everything"]

_CALLBACKS = [
    "BackboneFinetuning",
    "BaseFinetuning",
    "BasePredictionWriter",
    "BatchSizeFinder",
    "Callback",
    "Checkpoint",
    "DeviceStatsMonitor",
    "EMAWeightAveraging",
    "EarlyStopping",
    "GradientAccumulationScheduler",
    "LambdaCallback",
    "LearningRateFinder",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelPruning",
    "ModelSummary",
    "OnExceptionCheckpoint",
    "ProgressBar",
    "RichModelSummary",
    "RichProgressBar",
    "SpikeDetection",
    "StochasticWeightAveraging",
    "TQDMProgressBar",
    "ThroughputMonitor",
    "Timer",
    "WeightAveraging",
]
#: ``callbacks.progress.rich_progress``: the bar, its theme, its rich parts (a subclass or a test replaces them).
_RICH_PROGRESS = ["RichProgressBar", "RichProgressBarTheme", "BatchesProcessedColumn", "CustomBarColumn"]
_RICH_PROGRESS += ["CustomInfiniteTask", "CustomProgress", "CustomTimeColumn", "MetricsTextColumn"]
_RICH_PROGRESS += ["ProcessingSpeedColumn", "Progress", "_RICH_AVAILABLE"]
_LOGGERS = [
    "CSVLogger",
    "CometLogger",
    "LitLogger",
    "Logger",
    "MLFlowLogger",
    "NeptuneLogger",
    "TensorBoardLogger",
    "WandbLogger",
]
_RANK_ZERO = ["rank_zero_debug", "rank_zero_deprecation", "rank_zero_info", "rank_zero_only", "rank_zero_warn"]
_WARNINGS = {n: "trainer.common.errors" for n in ("PossibleUserWarning", "disable_possible_user_warnings")}
_TYPES = [
    "EVAL_DATALOADERS",
    "LRSchedulerConfig",
    "LRSchedulerConfigType",
    "LRSchedulerPLType",
    "LRSchedulerTypeUnion",
    "OptimizerConfig",
    "OptimizerLRScheduler",
    "OptimizerLRSchedulerConfig",
    "STEP_OUTPUT",
    "TRAIN_DATALOADERS",
]
_CORE = {"LightningModule": "trainer.module:TrainModule", "LightningDataModule": "trainer.datamodule:DataModule"}
_STATES = {n: "trainer.state" for n in ("RunningStage", "TrainerFn", "TrainerState", "TrainerStatus")}
_PROFILERS = ["AdvancedProfiler", "PassThroughProfiler", "Profiler", "PyTorchProfiler", "SimpleProfiler", "XLAProfiler"]
_STRATEGIES = dict.fromkeys(["Strategy", "SingleDeviceStrategy", "DDPStrategy", "FSDPStrategy"], "strategies")
_STRATEGIES |= {"ModelParallelStrategy": "strategies", "ParallelStrategy": "strategies.parallel"}
_STRATEGIES["StrategyRegistry"] = "strategies.registry"
_ACC = "strategies.accelerators"
_ACC_FILES = {"accelerator": "Accelerator", "cpu": "CPUAccelerator", "cuda": "CUDAAccelerator", "mps": "MPSAccelerator"}
_ACC_FILES["xla"] = "XLAAccelerator"
_ACCELERATORS = [*_ACC_FILES.values(), "AcceleratorRegistry"]
_SUBPACKAGES = ["accelerators", "callbacks", "core", "demos", "loggers", "profilers", "strategies", "trainer"]
_SUBPACKAGES += ["tuner", "utilities", "plugins"]


_UTIL = "trainer.lightning._utilities"
_DEMOS = "trainer.lightning._demos"
_TOOLS = "trainer.lightning._tools"
_ENUMS = ["GradClipAlgorithmType", "LightningEnum"]
_TYING = ["find_shared_parameters", "set_shared_parameters"]
_EPSILONS = ["FLOAT16_EPSILON", "FLOAT32_EPSILON", "FLOAT64_EPSILON"]
_MEMORY = [
    "garbage_collection_cuda",
    "is_cuda_out_of_memory",
    "is_cudnn_snafu",
    "is_oom_error",
    "is_out_of_cpu_memory",
    "recursive_detach",
]
_BORING = [
    "BoringDataModule",
    "BoringDataModuleNoLen",
    "BoringModel",
    "DemoModel",
    "IterableBoringDataModule",
    "ManualOptimBoringModel",
    "Net",
    "RandomDataset",
    "RandomDictDataset",
    "RandomIterableDataset",
    "RandomIterableDatasetWithLen",
]
_SUMMARY = {
    "ModelSummary": "callbacks.layer_summary:Summary",
    **dict.fromkeys(["LayerSummary", "parse_batch_shape", "summarize"], "callbacks.layer_summary"),
    **dict.fromkeys(["get_formatted_model_size", "get_human_readable_count"], "callbacks.summary_table"),
}
#: ``utilities.model_summary.model_summary`` also holds the summary table's constants.
_SUMMARY_FILE = {
    **_SUMMARY,
    **dict.fromkeys(["LEFTOVER_PARAMS_NAME", "NOT_APPLICABLE", "UNKNOWN_SIZE"], "callbacks.layer_summary"),
    "PARAMETER_NUM_UNITS": "callbacks.summary_table",
}
_IMPORT_FLAGS = [
    "_OMEGACONF_AVAILABLE",
    "_PYTHON_GREATER_EQUAL_3_11_0",
    "_RICH_AVAILABLE",
    "_TORCHMETRICS_GREATER_EQUAL_0_11",
    "_TORCHMETRICS_GREATER_EQUAL_0_8_0",
    "_TORCHMETRICS_GREATER_EQUAL_0_9_1",
    "_TORCHMETRICS_GREATER_EQUAL_1_0_0",
    "_TORCHVISION_AVAILABLE",
    "_TORCH_EQUAL_2_8",
    "_TORCH_EQUAL_2_9",
    "_TORCH_GREATER_EQUAL_2_6",
    "_TORCH_GREATER_EQUAL_2_8",
]
#: Lightning's file under ``profilers`` / ``strategies`` -> the class it defines.
_PROFILER_FILES = {
    "advanced": "AdvancedProfiler",
    "base": "PassThroughProfiler",
    "profiler": "Profiler",
    "pytorch": "PyTorchProfiler",
    "simple": "SimpleProfiler",
    "xla": "XLAProfiler",
}
_STRATEGY_FILES = {
    "ddp": "DDPStrategy",
    "fsdp": "FSDPStrategy",
    "model_parallel": "ModelParallelStrategy",
    "parallel": "ParallelStrategy",
    "single_device": "SingleDeviceStrategy",
    "strategy": "Strategy",
}


def _from(module: str, names: list[str] | tuple[str, ...]) -> dict[str, str]:
    return dict.fromkeys(names, module)


#: Lightning module path (below ``lightning.pytorch``) -> {name: where geartrain keeps it}. A home is
#: ``"module"`` (same name there) or ``"module:name"``; a home ending in ``"/"`` is a submodule of ours.
TREE: dict[str, dict[str, str]] = {
    "": {
        **_CORE,
        "Trainer": "trainer.trainer",
        "Callback": "callbacks.base",
        "seed_everything": "trainer.utils",
        "LIGHTNING_LOGO": _UTIL,
        "cli_lightning_logo": _UTIL,
        **dict.fromkeys(_SUBPACKAGES, "/"),
        "cli": "/",  # a file of its own (trainer/lightning/cli.py): it needs jsonargparse, the extra `cli`
    },
    # ----------------------------------------------------------------- lightning.pytorch.demos
    "demos": {**_from(_DEMOS, ["BoringDataModule", "BoringModel", "DemoModel"]), "boring_classes": "/"},
    "demos.boring_classes": _from(_DEMOS, _BORING),
    # ----------------------------------------------------------------- lightning.pytorch.core
    "core": {**_CORE, "module": "/", "datamodule": "/", "hooks": "/", "mixins": "/", "saving": "/"},
    "core.saving": _from("trainer.hparams_yaml", ["load_hparams_from_yaml", "save_hparams_to_yaml"]),
    "core.module": {"LightningModule": _CORE["LightningModule"]},
    # DataLoader: what from_datasets builds, patchable here as in Lightning's module
    "core.datamodule": {"LightningDataModule": _CORE["LightningDataModule"], "DataLoader": "trainer.datamodule"},
    "core.hooks": _from("trainer.module_hooks", ["DataHooks", "ModelHooks"]),
    "core.mixins": {"HyperparametersMixin": "trainer.hparams", "hparams_mixin": "/"},
    "core.mixins.hparams_mixin": _from("trainer.hparams", ["AttributeDict", "HyperparametersMixin"]),
    # ----------------------------------------------------------------- lightning.pytorch.trainer
    "trainer": {"Trainer": "trainer.trainer", "seed_everything": "trainer.utils", "trainer": "/", "states": "/"},
    "trainer.trainer": {"Trainer": "trainer.trainer"},
    "trainer.states": _STATES,
    # ----------------------------------------------------------------- lightning.pytorch.callbacks
    "callbacks": {
        **_from("callbacks", _CALLBACKS),
        **{
            sub: "/"
            for sub in [
                "callback",
                "early_stopping",
                "model_checkpoint",
                "lr_monitor",
                "progress",
                "model_summary",
                "finetuning",
                "prediction_writer",
                "timer",
                "stochastic_weight_avg",
                "lambda_function",
                "throughput_monitor",
                "device_stats_monitor",
                "gradient_accumulation_scheduler",
                "weight_averaging",
                "on_exception_checkpoint",
                "lr_finder",
                "batch_size_finder",
                "checkpoint",
                "pruning",
                "rich_model_summary",
                "spike",
            ]
        },
    },
    "callbacks.checkpoint": {"Checkpoint": "callbacks.base"},
    "callbacks.pruning": {"ModelPruning": "callbacks"},
    "callbacks.rich_model_summary": _from("callbacks.model_summary", ["RichModelSummary", "_RICH_AVAILABLE"]),
    "callbacks.spike": {"SpikeDetection": "callbacks"},
    "callbacks.callback": {"Callback": "callbacks.base"},
    "callbacks.early_stopping": _from("callbacks.early_stopping", ["EarlyStopping", "EarlyStoppingReason"]),
    "callbacks.model_checkpoint": {"ModelCheckpoint": "callbacks.checkpoint"},
    "callbacks.lr_monitor": {"LearningRateMonitor": "callbacks.lr_monitor"},
    "callbacks.progress": {
        "ProgressBar": "callbacks.progress",
        "RichProgressBar": "callbacks.rich_progress",
        "TQDMProgressBar": "callbacks.tqdm_progress",
        **{sub: "/" for sub in ("progress_bar", "rich_progress", "tqdm_progress")},
    },
    "callbacks.progress.progress_bar": _from("callbacks.progress", ["ProgressBar", "get_standard_metrics"]),
    "callbacks.progress.rich_progress": _from("callbacks.rich_progress", _RICH_PROGRESS),
    "callbacks.progress.tqdm_progress": _from("callbacks.tqdm_progress", ["TQDMProgressBar", "Tqdm", "convert_inf"]),
    "callbacks.model_summary": _from("callbacks.model_summary", ["ModelSummary"]),
    "callbacks.finetuning": _from("callbacks.finetuning", ["BackboneFinetuning", "BaseFinetuning", "multiplicative"]),
    "callbacks.prediction_writer": {"BasePredictionWriter": "callbacks.prediction_writer"},
    # `time`: the module the Timer reads the clock from, which programs and tests patch as in Lightning.
    "callbacks.timer": {"Timer": "callbacks.timer", "time": "callbacks.timer"},
    "callbacks.stochastic_weight_avg": {"StochasticWeightAveraging": "callbacks.stochastic_weight_avg"},
    "callbacks.lambda_function": {"LambdaCallback": "callbacks.lambda_callback"},
    "callbacks.throughput_monitor": _from(
        "callbacks.throughput", ["Throughput", "ThroughputMonitor", "get_available_flops"]
    ),
    # ``_PSUTIL_AVAILABLE``: read at set-up from its home, so a test's patch of it here reaches the monitor
    "callbacks.device_stats_monitor": {
        "DeviceStatsMonitor": "callbacks.device_stats",
        "_PSUTIL_AVAILABLE": "callbacks.device_stats",
    },
    "callbacks.gradient_accumulation_scheduler": {
        "GradientAccumulationScheduler": "callbacks.gradient_accumulation_scheduler"
    },
    "callbacks.weight_averaging": _from("callbacks.weight_averaging", ["EMAWeightAveraging", "WeightAveraging"]),
    "callbacks.on_exception_checkpoint": {"OnExceptionCheckpoint": "callbacks.on_exception_checkpoint"},
    "callbacks.lr_finder": {"LearningRateFinder": "callbacks.lr_finder"},
    "callbacks.batch_size_finder": {"BatchSizeFinder": "callbacks.batch_size_finder"},
    # ----------------------------------------------------------------- lightning.pytorch.loggers
    "loggers": {
        **_from("callbacks", _LOGGERS),
        **{
            sub: "/"
            for sub in ("logger", "tensorboard", "csv_logs", "comet", "litlogger", "mlflow", "neptune", "wandb")
        },
    },
    "loggers.logger": {
        "Logger": "callbacks",
        **_from("callbacks._logger", ["DummyExperiment", "DummyLogger"]),
        "rank_zero_experiment": _UTIL,
    },
    "loggers.comet": {"CometLogger": "callbacks", "FRAMEWORK_NAME": "callbacks.comet_logger"},
    "loggers.litlogger": {"LitLogger": "callbacks"},
    "loggers.mlflow": {"MLFlowLogger": "callbacks"},
    "loggers.neptune": {"NeptuneLogger": "callbacks"},
    "loggers.wandb": {"WandbLogger": "callbacks"},
    "loggers.tensorboard": {"TensorBoardLogger": "callbacks"},
    "loggers.csv_logs": {"CSVLogger": "callbacks", "ExperimentWriter": "callbacks.csv_logger:CSVWriter"},
    # ----------------------------------------------------------------- profilers, tuner, strategies
    "profilers": {**_from("trainer.profilers", _PROFILERS), **dict.fromkeys(_PROFILER_FILES, "/")},
    **{f"profilers.{file}": {name: "trainer.profilers"} for file, name in _PROFILER_FILES.items()},
    # Lightning's simple.py imports ``math`` (its totals are ``math.fsum``), so ``simple.math`` is public: ours too.
    "profilers.simple": {"SimpleProfiler": "trainer.profilers", "math": "trainer.profilers.simple:math"},
    "tuner": {"Tuner": "trainer.tuner", "tuning": "/"},
    "tuner.tuning": {"Tuner": "trainer.tuner"},
    "accelerators": {**_from(_ACC, [*_ACCELERATORS, "find_usable_cuda_devices"]), **dict.fromkeys(_ACC_FILES, "/")},
    **{f"accelerators.{file}": {name: _ACC} for file, name in _ACC_FILES.items()},
    "accelerators.cpu": {
        **_from(_ACC, ["CPUAccelerator", "get_cpu_stats"]),
        **_from("trainer.common.cpu_stats", ["_CPU_PERCENT", "_CPU_SWAP_PERCENT", "_CPU_VM_PERCENT"]),
    },
    "accelerators.cuda": _from(_ACC, ["CUDAAccelerator", "find_usable_cuda_devices"]),
    "strategies": {**_STRATEGIES, **dict.fromkeys(_STRATEGY_FILES, "/")},
    **{f"strategies.{file}": {name: _STRATEGIES[name]} for file, name in _STRATEGY_FILES.items()},
    # ----------------------------------------------------------------- lightning.pytorch.utilities
    "utilities": {
        **_from("trainer.common.rank_zero", _RANK_ZERO),
        **_WARNINGS,
        "AttributeDict": "trainer.hparams",
        "CombinedLoader": "trainer.data.loaders",
        "MisconfigurationException": "trainer.common.errors",
        "grad_norm": "trainer.common.grad_norm",
        "is_overridden": "trainer.hooks",
        "isolate_rng": "trainer.common.rng",
        "move_data_to_device": "trainer.common.tree:move_to_device",
        **_from(_TOOLS, [*_ENUMS, *_TYING, *_EPSILONS, "is_picklable", "measure_flops", "suggested_max_num_workers"]),
        **{
            sub: "/"
            for sub in [
                "rank_zero",
                "types",
                "model_summary",
                "combined_loader",
                "exceptions",
                "warnings",
                "seed",
                "grads",
                "model_helpers",
                "parsing",
                "imports",
                "enums",
                "memory",
                "parameter_tying",
            ]
        },
    },
    "utilities.enums": _from(_TOOLS, _ENUMS),
    "utilities.memory": _from(_TOOLS, _MEMORY),
    "utilities.parameter_tying": _from(_TOOLS, _TYING),
    "utilities.rank_zero": {
        **_from("trainer.common.rank_zero", _RANK_ZERO),
        **_from("lightning_utilities.core.rank_zero", ["WarningCache", "rank_prefixed_message"]),
        "rank_zero_module": "lightning_utilities.core:rank_zero",
        "LightningDeprecationWarning": "trainer.common.errors",
    },
    "utilities.types": {
        **_from("trainer.types", _TYPES),
        **_from(_UTIL, ["LRSchedulerType", "LRSchedulerTypeTuple"]),
        "DistributedDataParallel": "torch.nn.parallel",
    },
    "utilities.model_summary": {**_SUMMARY, "model_summary": "/"},
    "utilities.model_summary.model_summary": _SUMMARY_FILE,
    "utilities.imports": {
        **_from("lightning_utilities.core.imports", ["RequirementCache", "compare_version", "package_available"]),
        **_from(_UTIL, _IMPORT_FLAGS),
    },
    "utilities.combined_loader": {"CombinedLoader": "trainer.data.loaders"},
    "utilities.exceptions": {"MisconfigurationException": "trainer.common.errors"},
    "utilities.warnings": _WARNINGS,
    "utilities.seed": {"isolate_rng": "trainer.common.rng", "seed_everything": "trainer.utils"},
    "utilities.grads": {"grad_norm": "trainer.common.grad_norm"},
    "utilities.model_helpers": {"is_overridden": "trainer.hooks", "get_torchvision_model": _UTIL},
    "utilities.parsing": {
        **_from("trainer.hparams", ["AttributeDict", "clean_namespace", "is_picklable"]),
        "collect_init_args": "trainer.init_args",
        **_from(_TOOLS, ["lightning_getattr", "lightning_hasattr", "lightning_setattr", "parse_class_init_keys"]),
    },
    **PLUGINS_TREE,  # lightning.pytorch.plugins
}


def _resolver(path: str) -> Callable[[str], Any]:
    """The module-level ``__getattr__`` of ``trainer.lightning[.path]``: imports a name from its home."""
    table = TREE[path]
    full = f"{__name__}.{path}" if path else __name__

    def __getattr__(name: str) -> Any:
        home = table.get(name)
        if home is None:
            refusal = _refusal(f"{path}.{name}" if path else name)
            if refusal is not None:
                raise refusal
            raise AttributeError(f"module {full!r} has no attribute {name!r} (geartrain maps Lightning's names only)")
        if home == "/":
            value: Any = importlib.import_module(f"{full}.{name}")
        else:
            module, _, attr = home.partition(":")
            value = getattr(importlib.import_module(module), attr or name)
        sys.modules[full].__dict__[name] = value  # later look-ups find it without calling this again
        return value

    return __getattr__


def _refusal(path: str) -> ImportError | None:
    """The error for a Lightning path geartrain refuses (it, or a module above it, is in :data:`REFUSED`)."""
    parts = path.split(".")
    for end in range(1, len(parts) + 1):
        key = ".".join(parts[:end])
        if key in REFUSED:
            under = "" if key == path else f" (geartrain refuses all of lightning.pytorch.{key})"
            return ImportError(
                f"lightning.pytorch.{path} is not in trainer.lightning{under}: {REFUSED[key]}; see docs/lightning.md",
                name=f"{__name__}.{path}",
            )
    return None


class _Module(types.ModuleType):
    """A module of the tree whose names, when assigned, are assigned at their homes too.

    ``mock.patch("lightning.pytorch.callbacks.progress.tqdm_progress.Tqdm", Fake)`` then reaches the
    code that uses ``Tqdm`` (``callbacks/tqdm_progress.py``), as it reaches Lightning's; deleting the
    name (the patch's end) puts the home's own object back.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        home = _home_of(self, name)
        if home is not None:
            module, attr = home
            homes = self.__dict__.setdefault("_gt_originals", {})
            homes.setdefault(name, getattr(module, attr))
            setattr(module, attr, value)
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        home = _home_of(self, name)
        originals = self.__dict__.get("_gt_originals", {})
        if home is not None and name in originals:
            setattr(home[0], home[1], originals.pop(name))
        super().__delattr__(name)


def _home_of(module: types.ModuleType, name: str) -> tuple[types.ModuleType, str] | None:
    """The (module, attribute) a name of a tree module comes from; None for a submodule or another name."""
    table = TREE.get(module.__name__[len(__name__) + 1 :])
    home = table.get(name) if table is not None else None
    if home is None or home == "/":
        return None
    source, _, attr = home.partition(":")
    return importlib.import_module(source), attr or name


class _RefusedFinder(importlib.abc.MetaPathFinder):
    """Makes ``import trainer.lightning.<refused path>`` raise the refusal instead of "No module named"."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname.startswith(f"{__name__}."):
            refusal = _refusal(fullname[len(__name__) + 1 :])
            if refusal is not None:
                raise refusal
        return None


def _install() -> None:
    """Make every module of :data:`TREE` below this package (each name still resolved on first use)."""
    for path, table in TREE.items():
        if not path:
            continue
        full = f"{__name__}.{path}"
        module = _Module(full, f"Lightning's ``lightning.pytorch.{path}``, mapped onto geartrain's objects.")
        module.__getattr__ = _resolver(path)  # type: ignore[method-assign]
        module.__all__ = [name for name, home in table.items() if home != "/"]
        if any(home == "/" for home in table.values()):
            module.__path__ = []  # a package: its submodules are the entries of TREE below it
        sys.modules[full] = module
    if not any(isinstance(finder, _RefusedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RefusedFinder())


_install()
__getattr__ = _resolver("")


def __dir__() -> list[str]:
    return sorted({*globals(), *TREE[""]})
