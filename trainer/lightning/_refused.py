"""The Lightning paths ``trainer.lightning`` refuses, each with the reason and what to use instead.

A key is a module path below ``lightning.pytorch`` (the module and everything below it is refused) or
a module path and a name (``"loggers.csv_logs.ExperimentWriter"``). Importing a refused module, or a refused
name from a mapped one, raises an ``ImportError`` with the text here; docs/lightning.md lists them all
("Lightning's module tree"), and ``tests/test_lightning_module_tree.py`` walks Lightning 2.6.5's public
module tree to check that every path either resolves or is refused here.
"""

from __future__ import annotations

from trainer.lightning._plugins import PLUGINS_REFUSED

__all__ = ["REFUSED"]

_INTERNALS = (
    "Lightning's internals, not a public API: geartrain's loops, connectors and launchers are its own "
    "(trainer/loops, trainer/run.py, strategies/launch.py); change a run through hooks, callbacks and "
    "Trainer arguments"
)
_NOT_OFFERED = (
    "not offered by geartrain (no TPU/XLA, DeepSpeed or model serving): use strategy='ddp', 'fsdp' or 'model_parallel'"
)
_CHECKPOINT_TOOLS = (
    "geartrain reads Lightning 2.x checkpoints as they are (load_from_checkpoint, ckpt_path=); "
    "`python -m trainer.checkpoint.convert` turns a sharded checkpoint directory into one file"
)
_NOT_YET = "not yet in geartrain"

#: Lightning path -> why geartrain refuses it and what to use instead.
REFUSED: dict[str, str] = {
    # ------------------------------------------------------------ whole modules
    "accelerators.cuda.get_nvidia_gpu_stats": _NOT_YET
    + ": CUDAAccelerator().get_device_stats(device) gives torch.cuda.memory_stats",
    "accelerators.mps.get_device_stats": "MPSAccelerator().get_device_stats(device) gives the machine's memory figures",
    "demos.lstm": _NOT_YET + ": demos.boring_classes is mapped; write the model in the program",
    "demos.transformer": _NOT_YET
    + " (its WikiText2 downloads data): demos.boring_classes is mapped; write the model in the program",
    "demos.mnist_datamodule": "Lightning's MNIST data module downloads MNIST at run time: write the data module in the program",
    "demos.LightningLSTM": _NOT_YET + ": demos.boring_classes is mapped; write the model in the program",
    "demos.SequenceSampler": _NOT_YET + ": demos.boring_classes is mapped; write the model in the program",
    "demos.SimpleLSTM": _NOT_YET + ": demos.boring_classes is mapped; write the model in the program",
    "demos.LightningTransformer": _NOT_YET + " (its WikiText2 downloads data): demos.boring_classes is mapped",
    "demos.Transformer": _NOT_YET + " (its WikiText2 downloads data): demos.boring_classes is mapped",
    "demos.WikiText2": _NOT_YET + " (its WikiText2 downloads data): demos.boring_classes is mapped",
    "serve": _NOT_OFFERED,
    "loops": _INTERNALS,
    "overrides": _INTERNALS,
    "trainer.call": _INTERNALS,
    "trainer.configuration_validator": _INTERNALS,
    "trainer.setup": _INTERNALS,
    "trainer.connectors": _INTERNALS,
    "strategies.launchers": _INTERNALS,
    "strategies.deepspeed": _NOT_OFFERED,
    "strategies.xla": _NOT_OFFERED,
    "strategies.single_xla": _NOT_OFFERED,
    "tuner.batch_size_scaling": "the Tuner's internals: use Tuner(trainer).scale_batch_size(...) or the BatchSizeFinder callback",
    "tuner.lr_finder": "the Tuner's internals: use Tuner(trainer).lr_find(...) or the LearningRateFinder callback",
    "loggers.utilities": "private helpers of Lightning's loggers: nothing public to import",
    "utilities.argparse": "Lightning 1.x's argparse helpers are gone in Lightning 2: use trainer.lightning.cli.LightningCLI or argparse",
    "utilities.compile": "use Trainer(compile=True, compile_kwargs=...): geartrain compiles the module itself and checkpoints its plain weights",
    "utilities.consolidate_checkpoint": _CHECKPOINT_TOOLS,
    "utilities.upgrade_checkpoint": _CHECKPOINT_TOOLS,
    "utilities.migration": _CHECKPOINT_TOOLS,
    "utilities.deepspeed": _NOT_OFFERED,
    "utilities.data": "Lightning's internal data helpers: the batch size a step logs with is self.log(..., batch_size=)",
    "utilities.model_registry": "Trainer(model_registry=...) is refused: geartrain has no model registry; load files with ckpt_path=",
    "utilities.signature_utils": _INTERNALS,
    "utilities.testing": "Lightning's helpers for its own test suite",
    "utilities.model_summary.model_summary_deepspeed": _NOT_OFFERED,
    "core.optimizer": (
        "self.optimizers() returns the optimizers ready for manual optimisation (step, zero_grad, toggle_optimizer "
        "is the module's); annotate and test them as torch.optim.Optimizer"
    ),
    # ------------------------------------------------------------ single names of mapped modules
    "loggers.comet.comet_experiment": "a type alias of Lightning's CometLogger: annotate with comet_ml.CometExperiment",
    "loggers.mlflow.LOCAL_FILE_URI_PREFIX": "an internal constant of Lightning's MLFlowLogger: give tracking_uri='file:...'",
    "core.hooks.CheckpointHooks": "the checkpoint hooks are methods of LightningModule, LightningDataModule and Callback (on_save_checkpoint, on_load_checkpoint)",
    "core.saving.CHECKPOINT_PAST_HPARAMS_KEYS": "Lightning 0.x's checkpoint keys: geartrain reads Lightning 2.x checkpoints",
    "core.saving.convert": "an internal helper of Lightning's meta_tags.csv reader (ast.literal_eval of a string)",
    "core.saving.load_hparams_from_tags_csv": "Lightning's legacy meta_tags.csv: use load_hparams_from_yaml",
    "core.saving.save_hparams_to_tags_csv": "Lightning's legacy meta_tags.csv: use save_hparams_to_yaml",
    "core.saving.update_hparams": "update the dict itself (hparams.update(...)); nested updates are yours to write",
    "core.module.MODULE_OPTIMIZERS": "a type alias of Lightning's internals: annotate with torch.optim.Optimizer",
    "callbacks.prediction_writer.WriteInterval": "give BasePredictionWriter(write_interval='batch', 'epoch' or 'batch_and_epoch') as a string",
    "callbacks.timer.Interval": "give Timer(interval='step' or 'epoch') as a string",
    "loggers.logger.merge_dicts": _NOT_YET,
    "profilers.pytorch.RegisterRecordFunction": "an internal helper of Lightning's PyTorchProfiler",
    "profilers.pytorch.ScheduleWrapper": "an internal helper of Lightning's PyTorchProfiler",
    "strategies.DeepSpeedStrategy": _NOT_OFFERED,
    "utilities.is_shared_filesystem": _NOT_YET
    + ": geartrain's checkpoints are written by rank 0 into a directory every rank can read",
    "utilities.exceptions.SIGTERMException": "geartrain handles SIGTERM by finishing the step in flight and writing last.ckpt (docs/checkpoints.md), not by raising",
    "utilities.parsing.get_init_args": "Lightning's internal helper of save_hyperparameters",
    "utilities.parsing.save_hyperparameters": "call self.save_hyperparameters() in the module's or data module's __init__",
    "utilities.model_summary.DeepSpeedSummary": _NOT_OFFERED,
    **PLUGINS_REFUSED,
}
