"""``ThroughputMonitor``: Lightning's throughput of training and evaluation (windowed rates), sent to the loggers."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from callbacks._throughput import Throughput, compute_dtype, get_available_flops
from callbacks.base import Callback, logs_at
from trainer.common.tree import batch_size_of

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["Throughput", "ThroughputMonitor", "get_available_flops"]

_THROUGHPUT_OPTIONS = ("window_size", "separator")


class ThroughputMonitor(Callback):
    """Log the throughput of every loop as Lightning's ``ThroughputMonitor`` does (rank 0 only).

    Each batch of training, validation (not the sanity check), test and predict updates a
    :class:`~callbacks._throughput.Throughput` of its stage with the running totals (seconds since the
    loop started, batches, samples from ``batch_size_fn``, items from ``length_fn``, the module's
    ``flops_per_batch`` if it has one); where Lightning logs (training: after an optimizer step, every
    ``log_every_n_steps`` steps; evaluation: every ``log_every_n_steps`` batches of a run) the stage's
    :meth:`~callbacks._throughput.Throughput.compute` goes to the loggers with the stage in front:
    ``train/time``, ``train/samples``, ``train/device/samples_per_sec`` (once ``window_size`` batches
    were seen), ``validate/device/mfu``... A validation inside ``fit`` does not count as training time.
    On CUDA each measured batch synchronises the device first, so its queued work is counted.

    Args:
        batch_size_fn: samples in a batch (Lightning requires it; default here: the length of the
            batch's first tensor).
        length_fn: items (tokens, say) in a batch: adds ``lengths`` and ``device/items_per_sec``.
        **kwargs: Lightning's ``Throughput`` options: ``window_size`` (batches the rates are measured
            over, default 100) and ``separator`` (between a key's parts, default ``"/"``).
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int] | None = None,
        length_fn: Callable[[Any], int] | None = None,
        **kwargs: Any,
    ) -> None:
        unknown = sorted(set(kwargs) - set(_THROUGHPUT_OPTIONS))
        if unknown:
            raise TypeError(
                f"ThroughputMonitor got {', '.join(unknown)}: its options are those of Throughput, "
                f"{', '.join(_THROUGHPUT_OPTIONS)} (available_flops and world_size come from the trainer's device)"
            )
        Throughput(**kwargs)  # a bad window_size is refused now, not at the first fit
        self.kwargs = kwargs
        self.batch_size_fn = batch_size_fn if batch_size_fn is not None else batch_size_of
        self.length_fn = length_fn
        self.available_flops: int | None = None
        self._throughputs: dict[str, Throughput] = {}
        self._t0s: dict[str, float] = {}
        self._lengths: dict[str, int] = {}
        self._samples: dict[str, int] = {}
        self._batches: dict[str, int] = {}
        self._module_has_flops: bool | None = None
        self._run_batches: dict[str, int] = {}  # evaluation batches of the current run, per stage
        self._eval_batches: dict[tuple[Any, str], int] = {}  # ... of every run (Lightning's x-axis for them)
        self._stepped = 0  # training batches that ended an accumulation window (Lightning's x-axis)

    @override
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if not trainer.is_global_zero:
            return
        self.available_flops = get_available_flops(trainer.strategy.root_device, compute_dtype(str(trainer.precision)))
        stages = {"fit": "train", "validate": "validate", "test": "test", "predict": "predict"}
        if stage == "fit" and trainer.enable_validation:  # fit's validation has a throughput of its own
            self._throughputs["validate"] = self._new(trainer)
        self._throughputs[stages[stage]] = self._new(trainer)

    def _new(self, trainer: Trainer) -> Throughput:
        return Throughput(available_flops=self.available_flops, world_size=trainer.world_size, **self.kwargs)

    def _start(self, trainer: Trainer, stage: str) -> None:
        if stage not in self._throughputs:  # a loop setup did not foresee (validation data given later)
            self._throughputs[stage] = self._new(trainer)
        if trainer.state.fn == "fit" or stage not in self._samples:  # evaluation runs add up across calls
            self._throughputs[stage].reset()
            self._lengths[stage] = self._samples[stage] = self._batches[stage] = 0
        self._t0s[stage] = time.perf_counter()

    @torch.inference_mode()  # batch_size_fn / length_fn may compute on tensors: no autograd record
    def _update(self, trainer: Trainer, pl_module: TrainModule, stage: str, batch: Any) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()  # else the clock would stop before the batch's kernels ran
        elapsed = time.perf_counter() - self._t0s[stage]
        if self.length_fn is not None:
            self._lengths[stage] += self.length_fn(batch)
        if self._module_has_flops is None:
            self._module_has_flops = hasattr(pl_module, "flops_per_batch")
            if not self._module_has_flops:
                warnings.warn(
                    "When using the `ThroughputMonitor`, you need to define a `flops_per_batch` attribute or property"
                    f" in {type(pl_module).__name__} to compute the FLOPs.",
                    UserWarning,
                    stacklevel=2,
                )
        self._samples[stage] += self.batch_size_fn(batch)
        self._batches[stage] += 1
        self._throughputs[stage].update(
            time=elapsed,
            batches=self._batches[stage],
            samples=self._samples[stage],
            lengths=None if self.length_fn is None else self._lengths[stage],
            flops=getattr(pl_module, "flops_per_batch", None) if self._module_has_flops else None,
        )

    def _log(self, trainer: Trainer, stage: str, step: int, epoch: bool) -> None:
        if not trainer.loggers:
            return
        throughput = self._throughputs[stage]
        metrics: dict[str, Any] = {f"{stage}{throughput.separator}{k}": v for k, v in throughput.compute().items()}
        if epoch:
            metrics["epoch"] = trainer.current_epoch  # as on Lightning's rows logged at a training step
        # float64: the loggers get the very numbers computed (a float32 tensor would round them)
        trainer.log_metrics(
            {k: torch.tensor(v, dtype=torch.float64 if isinstance(v, float) else None) for k, v in metrics.items()},
            step=step,
        )

    # ----------------------------------------------------------------- training
    @override
    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if trainer.is_global_zero:
            self._start(trainer, "train")
            self._stepped = trainer.global_step

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero:
            return
        self._update(trainer, pl_module, "train", batch)
        k = trainer.accumulate_grad_batches if pl_module.automatic_optimization else 1
        if (batch_idx + 1) % k and batch_idx + 1 != trainer.num_training_batches:
            return  # within an accumulation window: measured when the optimizer step is included
        if logs_at(trainer, self._stepped + 1):
            self._log(trainer, "train", self._stepped, epoch=True)
        self._stepped += 1

    # ----------------------------------------------------------------- evaluation
    def _eval_start(self, trainer: Trainer, stage: str) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            self._start(trainer, stage)
            self._run_batches[stage] = 0

    def _eval_batch_end(self, trainer: Trainer, pl_module: TrainModule, stage: str, batch: Any) -> None:
        if not trainer.is_global_zero or trainer.sanity_checking:
            return
        self._update(trainer, pl_module, stage, batch)
        self._run_batches[stage] += 1
        key = (trainer.state.fn, stage)
        self._eval_batches[key] = total = self._eval_batches.get(key, 0) + 1
        if logs_at(trainer, self._run_batches[stage]):
            self._log(trainer, stage, total, epoch=False)

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_start(trainer, "validate")

    @override
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_end(trainer, pl_module, "validate", batch)

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if (
            not trainer.is_global_zero
            or trainer.sanity_checking
            or trainer.state.fn != "fit"
            or "train" not in self._t0s
        ):
            return
        # The training clock skips the validation: from where training's last batch ended to where validation's did.
        train_times, val_times = self._throughputs["train"]._time, self._throughputs["validate"]._time
        train_end = self._t0s["train"] + (train_times[-1] if train_times else 0.0)
        self._t0s["train"] += self._t0s["validate"] - train_end + (val_times[-1] if val_times else 0.0)

    @override
    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_start(trainer, "test")

    @override
    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_end(trainer, pl_module, "test", batch)

    @override
    def on_predict_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_start(trainer, "predict")

    @override
    def on_predict_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_end(trainer, pl_module, "predict", batch)
