"""Lightning's ``Trainer(...)`` arguments: what each one means here, or why it is refused.

:mod:`trainer.options` checks the loop arguments and adds the default callbacks; this room turns Lightning's
other spellings into ours (``devices="0,1"``, ``logger=[...]``, ``None`` meaning "the default", ``barebones``),
refuses what geartrain does not have (``model_registry``) with a message naming the alternative, and holds
the few run-time pieces these arguments need (``overfit_batches``'s unshuffled loader, ``sync_batchnorm``'s
conversion, the torch flags of ``deterministic``/``benchmark``/``detect_anomaly``).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from trainer.common.errors import UserError
from trainer.common.rank_zero import rank_zero_info

if TYPE_CHECKING:
    from collections.abc import Callable

    from callbacks.base import Callback
    from strategies.base import Strategy

_Init = TypeVar("_Init", bound="Callable[..., None]")

__all__ = [
    "TRAINER_ARGS",
    "Switches",
    "anomaly_context",
    "batch_limit",
    "check_non_negative_int",
    "check_sync_batchnorm",
    "check_unsupported",
    "convert_sync_batchnorm",
    "defaults_from_env",
    "overfit_loader",
    "resolve_devices",
    "resolve_logger",
    "resolve_switches",
    "set_torch_flags",
]


#: The ``Args`` section of :class:`~trainer.Trainer`'s docstring (kept here so trainer.py stays short).
TRAINER_ARGS = """
    Args:
        accelerator: ``"auto"``, ``"cpu"``, ``"gpu"``/``"cuda"``, ``"mps"``: the kind of device, or Lightning's
            accelerator object for one (``CPUAccelerator()``, from ``strategies.accelerators``).
        strategy: ``"auto"``, ``"single"``, ``"dp"``, ``"ddp"``, ``"amp"``, ``"fsdp"``, ``"model_parallel"``,
            Lightning's ``"ddp_spawn"``, ``"ddp_fork"``, ``"ddp_notebook"``,
            ``"ddp_find_unused_parameters_true"``, ``"single_device"``, or an instance.
        devices: processes per node: an int, ``-1`` (every GPU), ``"auto"``, ``"2"``, or indices
            ``[0, 1]``/``"0,1"`` (the first n devices).
        num_nodes: machines taking part.
        precision: ``"32-true"``, ``"16-mixed"``, ``"bf16-mixed"``, ``"bf16-true"``, ``"16-true"``,
            ``"64-true"`` or Lightning's short spellings (``32``, ``16``, ``"bf16"``, ``64``); ``None``
            keeps the strategy's default.
        logger: ``True``/``None`` (a TensorBoardLogger unless one is given), ``False``, a logger or a list.
        callbacks: extra callbacks, run in the order given after the defaults.
        fast_dev_run: ``True`` (1) or n: n batches of each stage, without loggers and checkpoints.
        max_epochs: stop after this many epochs; ``-1`` for no limit (``None`` with ``max_steps=-1`` and
            no ``max_time``: 1000, Lightning's rule).
        min_epochs: ``should_stop`` (early stopping, ``max_time``) waits until this many epochs ran.
        max_steps: stop after this many optimizer steps; ``-1`` for no limit.
        min_steps: ``should_stop`` waits until this many optimizer steps were taken.
        max_time: stop after this much training time: ``"DD:HH:MM:SS"``, a dict or a ``timedelta``.
        limit_train_batches: only this many (int) or this fraction (float) of the training batches.
        limit_val_batches: likewise, of each validation loader's batches.
        limit_test_batches: likewise, of each test loader's batches.
        limit_predict_batches: likewise, of each predict loader's batches.
        overfit_batches: train and validate on only the first batches (int or fraction), unshuffled.
        val_check_interval: validate every this many training batches (int) or fraction of an epoch.
        check_val_every_n_epoch: validate in every n-th epoch; ``None`` with an int
            ``val_check_interval``: every that many batches counted across epochs.
        num_sanity_val_steps: validation batches run before training (``None``: 2).
        log_every_n_steps: how often step values go to the loggers (``None``: 50; 0: never, as Lightning).
        enable_checkpointing: add a ModelCheckpoint (last) unless one is given (``None``: True).
        enable_progress_bar: add a ProgressBar unless one is given (``None``: True).
        enable_model_summary: add a ModelSummary unless one is given (``None``: True).
        accumulate_grad_batches: micro-batches per optimizer step; the loss is divided by it.
        gradient_clip_val: clip gradients to this total norm (or value); ``None`` or ``0`` disables (as in Lightning).
        gradient_clip_algorithm: ``"norm"`` (also for ``None``) or ``"value"``.
        deterministic: ``True``: torch's deterministic algorithms; ``"warn"``: warn where none exists.
        benchmark: set ``torch.backends.cudnn.benchmark`` (``None`` leaves it).
        inference_mode: evaluate under ``torch.inference_mode()`` (else ``torch.no_grad()``).
        use_distributed_sampler: ``False`` leaves dataloaders as given under multi-process strategies.
        profiler: ``None``, ``"simple"``, ``"advanced"``, ``"pytorch"`` or a ``trainer.profilers.Profiler``:
            time per action (data fetch, step, backward, optimizer step, each hook); ``docs/profiling.md``.
        detect_anomaly: run fit under ``torch.autograd.set_detect_anomaly(True)``.
        barebones: no logger, checkpointing, progress bar, model summary or sanity check (refused if asked).
        plugins: Lightning's plugin objects (a precision plugin, a checkpoint IO, a cluster environment,
            ``TorchSyncBatchNorm``), one of each kind at most (:mod:`trainer.plugins`).
        sync_batchnorm: BatchNorm layers become SyncBatchNorm when several processes train (CUDA only).
        reload_dataloaders_every_n_epochs: ask the module/datamodule for new loaders every n epochs.
        default_root_dir: where default loggers and checkpoints write (``None``: the working directory).
        enable_autolog_hparams: ``False`` is refused (loggers record hyperparameters at fit start).
        model_registry: refused (save with ``save_checkpoint``).
        on_nonfinite: NaN/inf loss policy: ``"raise"``, ``"skip"`` (drop that step, counted in
            ``train/nonfinite_skipped``), ``"warn"`` or ``None`` (no check: it syncs with the device).
        max_nonfinite_in_a_row: with ``"skip"``, raise after this many skipped steps in a row.
        preemption_exit_code: on SIGTERM/SIGUSR1, finish the step, save ``last.ckpt`` and exit with this
            code; ``None`` returns from ``fit`` (``trainer.preempted`` tells).
        slurm_requeue: on SIGUSR1 under Slurm, ``scontrol requeue`` the job after saving.
        config: the resolved run configuration (Hydra's), saved in checkpoints and as hparams.
        micro_batch_size: split training batches into pieces of this many samples and accumulate (the
            step equals the whole batch's); ``"auto"`` halves it on out-of-memory (:mod:`trainer.data.microbatch`).
        activation_checkpointing: module classes (or dotted paths) whose activations are recomputed.
        compile: ``torch.compile`` the module's ``__call__`` in place (state_dict keys unchanged).
        compile_kwargs: keyword arguments for ``torch.compile``.
"""


def check_devices_given(devices: Any, accelerator: Any) -> None:
    """Refuse ``devices=0``, ``"0"`` or ``[]`` (no device at all) in Lightning's words, before the accelerator is checked."""
    if isinstance(devices, (int, str, list)) and not isinstance(devices, bool) and devices in ([], 0, "0"):
        name = type(accelerator).__qualname__ if not isinstance(accelerator, str) else accelerator
        raise UserError(
            f"`Trainer(devices={devices!r})` value is not a valid input using {name} accelerator: give a count >= 1, "
            "-1 (all) or 'auto'"
        )


def check_unsupported(model_registry: Any, enable_autolog_hparams: bool, barebones: bool) -> None:
    """Refuse the Lightning arguments geartrain does not implement yet, naming what to use instead."""
    if model_registry is not None:
        raise ValueError(
            f"Trainer(model_registry={model_registry!r}) is not supported: geartrain does not upload models; "
            "save them with trainer.save_checkpoint(path) or ModelCheckpoint"
        )
    if not enable_autolog_hparams:
        raise ValueError(
            "Trainer(enable_autolog_hparams=False) is not supported yet: loggers record the hyperparameters at "
            "fit start. Pass logger=False, or a logger you configure yourself"
        )
    if barebones and not isinstance(barebones, bool):
        raise TypeError(f"barebones must be a bool, got {barebones!r}")


@dataclass
class Switches:
    """The on/off arguments whose Lightning default is ``None`` ("the default"), resolved."""

    logger: Any
    enable_checkpointing: bool
    enable_progress_bar: bool
    enable_model_summary: bool
    num_sanity_val_steps: int
    log_every_n_steps: int


def resolve_switches(
    *,
    barebones: bool,
    logger: Any,
    enable_checkpointing: bool | None,
    enable_progress_bar: bool | None,
    enable_model_summary: bool | None,
    num_sanity_val_steps: int | None,
    log_every_n_steps: int | None,
    fast_dev_run: bool | int,
    detect_anomaly: bool,
    profiler: Any = None,
) -> Switches:
    """Resolve ``None`` to the default, as Lightning does; ``barebones=True`` turns everything off.

    Under ``barebones`` asking for checkpointing, a logger, the progress bar, the model summary,
    step logging, sanity checks, ``fast_dev_run``, ``detect_anomaly`` or a profiler is refused, as in Lightning.
    """
    if not barebones:
        return Switches(
            logger=True if logger is None else logger,
            enable_checkpointing=True if enable_checkpointing is None else bool(enable_checkpointing),
            enable_progress_bar=True if enable_progress_bar is None else bool(enable_progress_bar),
            enable_model_summary=True if enable_model_summary is None else bool(enable_model_summary),
            num_sanity_val_steps=2 if num_sanity_val_steps is None else num_sanity_val_steps,
            log_every_n_steps=50 if log_every_n_steps is None else log_every_n_steps,
        )
    asked = {
        "enable_checkpointing": (bool(enable_checkpointing), enable_checkpointing),
        "logger": (logger is not None and logger is not False, logger),
        "enable_progress_bar": (bool(enable_progress_bar), enable_progress_bar),
        "enable_model_summary": (bool(enable_model_summary), enable_model_summary),
        "log_every_n_steps": (log_every_n_steps not in (None, 0), log_every_n_steps),
        "num_sanity_val_steps": (num_sanity_val_steps not in (None, 0), num_sanity_val_steps),
        "fast_dev_run": (bool(fast_dev_run), fast_dev_run),
        "detect_anomaly": (bool(detect_anomaly), detect_anomaly),
        "profiler": (profiler is not None, profiler),
    }
    for name, (on, value) in asked.items():
        if on:  # Lightning's words first
            raise ValueError(
                f"`Trainer(barebones=True, {name}={value!r})` was passed. Trainer(barebones=True) turns {name} off "
                f"(it costs speed); remove {name} or barebones=True"
            )
    rank_zero_info(  # Lightning's words, with the arguments it turns off
        "You are running in `Trainer(barebones=True)` mode. All features that may impact raw speed have been"
        " disabled to facilitate analyzing the Trainer overhead. Specifically, the following features are"
        f" deactivated: {', '.join(asked)}"
    )
    return Switches(False, False, False, False, 0, 0)  # log_every_n_steps=0: never, as Lightning


def resolve_devices(devices: Any) -> int | str:
    """Lightning's ``devices`` forms to a process count per node, or ``"auto"``.

    An int, ``-1`` (every GPU; one process on the CPU), ``"auto"``, a count as text (``"2"``), or
    device indices (``[0, 1]``, ``"0,1"``). Indices must be the first n (``0 .. n-1``): they mean n
    processes on devices ``0 .. n-1``; other indices are refused with the ``CUDA_VISIBLE_DEVICES``
    alternative.

    >>> resolve_devices("0,1"), resolve_devices([0]), resolve_devices("3"), resolve_devices("auto")
    (2, 1, 3, 'auto')
    """
    given = devices
    if isinstance(devices, str):
        text = devices.strip()
        if text == "auto":
            return "auto"
        if "," in text:
            try:
                devices = [int(part) for part in text.split(",") if part.strip()]
            except ValueError:
                raise ValueError(f"devices={given!r}: expected a count, 'auto', -1 or indices like '0,1'") from None
        else:
            try:
                devices = int(text)
            except ValueError:
                raise ValueError(f"devices={given!r}: expected a count, 'auto', -1 or indices like '0,1'") from None
    if isinstance(devices, (list, tuple)):
        indices = [int(i) for i in devices]
        if not indices or indices != list(range(len(indices))):
            raise ValueError(
                f"devices={given!r}: geartrain places process i on device i, so indices must be 0..n-1; "
                f"to use other devices set CUDA_VISIBLE_DEVICES={','.join(map(str, indices))} and "
                f"devices={len(indices)}"
            )
        return len(indices)
    if isinstance(devices, bool) or not isinstance(devices, int):
        raise TypeError(f"devices must be an int, 'auto', -1, or indices like [0, 1] / '0,1'; got {given!r}")
    if devices == -1:
        return torch.cuda.device_count() if torch.cuda.is_available() else 1
    if devices < 1:
        raise ValueError(f"devices={given!r}: expected a count >= 1, -1 (all) or 'auto'")
    return devices


def resolve_logger(logger: Any) -> tuple[bool, list[Callback]]:
    """``logger=`` as Lightning takes it: a bool, ``None``, a logger, or a list of loggers.

    Returns (add the default TensorBoard logger?, logger instances that join the callbacks).
    geartrain's loggers are callbacks with ``is_logger = True``.
    """
    if logger is None or isinstance(logger, bool):
        return logger is not False, []
    from callbacks._logger_calls import give_lightnings_calls

    given = list(logger) if isinstance(logger, (list, tuple)) else [logger]
    for item in given:
        if not getattr(item, "is_logger", False):
            raise TypeError(
                f"logger= takes True/False or geartrain loggers (callbacks.TensorBoardLogger, callbacks.CSVLogger); "
                f"got {type(item).__name__}"
            )
        give_lightnings_calls(item)  # a stand-in (a Mock) gets log_metrics(metrics=, step=) as from Lightning
    return False, given


def set_torch_flags(deterministic: bool | str | None, benchmark: bool | None) -> None:
    """``deterministic`` (True, ``"warn"``: warn instead of failing) and ``benchmark`` (cuDNN autotuning).

    ``benchmark=None`` leaves ``torch.backends.cudnn.benchmark`` as it is, except that
    ``deterministic=True`` turns it off (Lightning's rule).
    """
    if deterministic not in (None, True, False, "warn"):
        raise ValueError(f"deterministic must be True, False, 'warn' or None, got {deterministic!r}")
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=deterministic == "warn")
    if benchmark is not None:
        if deterministic and benchmark:
            warnings.warn(
                "benchmark=True makes cuDNN pick kernels by timing; results may not be deterministic", stacklevel=3
            )
        torch.backends.cudnn.benchmark = bool(benchmark)
    elif deterministic:
        torch.backends.cudnn.benchmark = False


def anomaly_context(detect_anomaly: bool) -> contextlib.AbstractContextManager[Any]:
    """``detect_anomaly=True``: autograd's anomaly detection around fit (slow; finds the op making NaN)."""
    return torch.autograd.set_detect_anomaly(True) if detect_anomaly else contextlib.nullcontext()


def check_sync_batchnorm(sync_batchnorm: bool, strategy: Strategy) -> None:
    """``sync_batchnorm=True`` needs CUDA when there are several processes (torch syncs only there).

    With one process there is nothing to sync and the module is left as it is.
    """
    if sync_batchnorm and strategy.world_size > 1 and strategy.root_device.type != "cuda":
        raise ValueError(
            f"sync_batchnorm=True: torch's SyncBatchNorm synchronises only on CUDA, and this run has "
            f"{strategy.world_size} processes on {strategy.root_device.type!r}. Use GPUs, or sync_batchnorm=False "
            "(each process then normalises with its own batch statistics)"
        )


def convert_sync_batchnorm(module: nn.Module, sync_batchnorm: bool, world_size: int) -> None:
    """Replace the module's BatchNorm layers by ``SyncBatchNorm`` (in place) when several processes train.

    Layers that are ``SyncBatchNorm`` already are kept (``fit`` then ``test`` converts once).
    """
    if not sync_batchnorm or world_size <= 1:
        return
    for name, child in module.named_children():
        if isinstance(child, nn.modules.batchnorm._BatchNorm) and not isinstance(child, nn.SyncBatchNorm):
            setattr(module, name, nn.SyncBatchNorm.convert_sync_batchnorm(child))
        else:
            convert_sync_batchnorm(child, sync_batchnorm, world_size)


def overfit_loader(loader: Iterable[Any], prefix: str = "train") -> Iterable[Any]:
    """``overfit_batches``: the same first batches every epoch, so the loader's sampler is made sequential.

    ``prefix``: ``"train"`` or ``"val"``, the loader's stage in the warning (Lightning's words).
    """
    from torch.utils.data import DataLoader, SequentialSampler

    from trainer.common.loaders import rebuild_dataloader

    if not isinstance(loader, DataLoader) or isinstance(loader.sampler, SequentialSampler):
        return loader
    if loader.batch_size is None:
        return loader  # a custom batch sampler decides its own order
    warnings.warn(
        f"You requested to overfit but enabled {prefix} dataloader shuffling. We are turning off the {prefix} "
        "dataloader shuffling for you (overfit_batches: its sampler is replaced by a SequentialSampler, so every "
        "epoch sees the same first batches).",
        stacklevel=3,
    )
    return rebuild_dataloader(loader, sampler=SequentialSampler(loader.dataset))  # type: ignore[arg-type]


def defaults_from_env(init: _Init) -> _Init:
    """Lightning's ``PL_TRAINER_<NAME>`` environment variables as defaults of ``Trainer(...)``.

    An argument not given takes the variable's value when it is set and not empty, read as a Python
    literal where it is one (``PL_TRAINER_MAX_STEPS=7`` is ``7``, ``PL_TRAINER_LOGGER=False`` is
    ``False``) and as the string otherwise (``PL_TRAINER_STRATEGY=ddp``). An argument given in the
    code wins over the variable, as in Lightning.
    """
    names = list(inspect.signature(init).parameters)[1:]

    @functools.wraps(init)
    def with_env(self: Any, *args: Any, **kwargs: Any) -> None:
        given = set(names[: len(args)]) | set(kwargs)
        for name in names:
            raw = os.environ.get(f"PL_TRAINER_{name.upper()}", "")
            if raw and name not in given:
                try:
                    kwargs[name] = ast.literal_eval(raw)
                except (ValueError, SyntaxError):
                    kwargs[name] = raw
        init(self, *args, **kwargs)

    return with_env  # type: ignore[return-value]


def check_non_negative_int(name: str, value: Any) -> None:
    """``value`` must be an int >= 0 (bools refused); Lightning's words and exception type."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise UserError(f"`{name}` should be an int >= 0, got {value!r}.")


def batch_limit(name: str, value: Any) -> Any:
    """A ``limit_*_batches``-like value as Lightning reads it: None, an int >= 0 (batches) or a float in [0, 1].

    A float above 1 with no fractional part is that many batches (``1e50`` is an int), as in Lightning.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be an int (batches), a float in [0, 1] (fraction) or None, got {value!r}")
    if isinstance(value, float) and value > 1 and value % 1.0 == 0 and value != float("inf"):
        return int(value)
    if value < 0 or (isinstance(value, float) and value > 1):
        raise UserError(
            f"You have passed invalid value {value} for {name}, it has to be in [0.0, 1.0] (a fraction of the "
            "batches) or an int (a number of batches)."
        )
    return value
