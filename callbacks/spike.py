"""``SpikeDetection``: stop training at a loss spike and record the batches to skip (Lightning 2.6's callback).

After each training batch the loss is compared with the running mean of the last ``window`` losses that
were not spikes. A loss is a spike when it is not an improvement on the previous one (``mode``) and lies
further than ``atol`` and ``rtol * mean`` from the mean (a tolerance of ``None`` always holds), or when
it is NaN/inf and ``finite_only`` is set. Under several processes every rank decides for itself and
any rank's spike stops them all (one collective per batch). The batch and the one before it are
appended to a JSON list at ``exclude_batches_path`` (rank 0 writes it), then
:class:`TrainingSpikeException` is raised.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import torch
from typing_extensions import override

from callbacks.base import Callback

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["SpikeDetection", "TrainingSpikeException"]


def _exception_base() -> type[RuntimeError]:
    """Fabric's ``TrainingSpikeException`` when that package is installed, else ``RuntimeError``.

    A Lightning program ported by its ``lightning.pytorch`` imports still names the exception by its
    only Lightning path, ``lightning.fabric.utilities.spike``; deriving from it keeps its ``except``
    clauses catching ours.
    """
    try:
        from lightning_fabric.utilities.spike import TrainingSpikeException as FabricSpike
    except ImportError:  # no Fabric (or one without it): ours stands alone
        return RuntimeError
    return FabricSpike


class TrainingSpikeException(_exception_base()):  # type: ignore[misc]
    """A loss spike stopped training; ``batch_idx`` is the batch it happened at."""

    def __init__(self, batch_idx: int, *args: Any, **kwargs: Any) -> None:
        RuntimeError.__init__(self, f"Training spike detected in batch {batch_idx}", *args, **kwargs)
        self.batch_idx = batch_idx


class SpikeDetection(Callback):
    """Raise :class:`TrainingSpikeException` when the training loss spikes, as Lightning's ``SpikeDetection``.

    Args:
        mode: ``"min"`` (a lower loss is an improvement) or ``"max"``.
        window: how many of the latest losses the running mean is over.
        warmup: batches (of each epoch, by index) before spikes are looked for.
        atol: a loss must differ from the mean by at least this much to be a spike; ``None``: any.
        rtol: ... and by at least ``rtol * mean``; ``None``: any.
        exclude_batches_path: the JSON file (or a folder for ``skip_batches.json``) listing the batches
            to skip when resuming; default ``<default_root_dir>/skip_batches.json``.
        finite_only: a NaN or infinite loss is a spike; ``False``: not a spike, and it (or any rank's
            non-finite loss) is left out of the running mean.
    """

    def __init__(
        self,
        mode: Literal["min", "max"] = "min",
        window: int = 10,
        warmup: int = 1,
        atol: float | None = None,
        rtol: float | None = 2.0,
        exclude_batches_path: str | os.PathLike[str] | None = None,
        finite_only: bool = True,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"Invalid mode. Has to be min or max, found {mode}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"SpikeDetection(window={window!r}): give the number of losses to average, an int >= 1")
        self.mode = mode
        self.window = window
        self.warmup = warmup
        self.atol = atol
        self.rtol = rtol
        self.exclude_batches_path: str | None = (
            None if exclude_batches_path is None else os.fspath(exclude_batches_path)
        )
        self.finite_only = finite_only
        self.last_val: float = 0.0
        self.bad_batches: list[int] = []
        self._recent: deque[float] = deque(maxlen=window)

    @property
    def running_mean(self) -> float:
        """The mean of the latest ``window`` losses kept; NaN before the first."""
        return sum(self._recent) / len(self._recent) if self._recent else math.nan

    @override
    @torch.no_grad()
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if isinstance(outputs, torch.Tensor):
            loss = outputs.detach()
        elif isinstance(outputs, Mapping) and isinstance(outputs.get("loss"), torch.Tensor):
            loss = outputs["loss"].detach()
        else:
            raise TypeError(f"outputs have to be of type torch.Tensor or Mapping, got {type(outputs).__qualname__}")
        value = float(loss.float().mean())
        if self.exclude_batches_path is None:
            self.exclude_batches_path = str(trainer.default_root_dir)
        if not self.exclude_batches_path.endswith(".json"):
            self.exclude_batches_path = os.path.join(self.exclude_batches_path, "skip_batches.json")

        is_spike = batch_idx >= self.warmup and self._is_spike(value)
        if self._any_rank(trainer, is_spike):
            self._handle_spike(trainer, batch_idx)
        elif self.finite_only or not self._any_rank(trainer, not math.isfinite(value)):
            self._recent.append(value)
            self.last_val = value

    @staticmethod
    def _any_rank(trainer: Trainer, flag: bool) -> bool:
        """Whether ``flag`` holds on at least one process (every process calls this at the same batch)."""
        strategy = trainer.strategy
        if strategy.world_size == 1:
            return flag
        decision = torch.tensor(int(flag), device=strategy.root_device)
        return bool(strategy.reduce(decision, op="max").item() > 0)

    def _is_spike(self, value: float) -> bool:
        if self.finite_only and not math.isfinite(value):
            return True
        diff = value - self.last_val
        if (diff <= 0.0) if self.mode == "min" else (diff >= 0.0):
            return False  # an improvement on the last loss is never a spike
        mean = self.running_mean
        atol_ok = self.atol is None or abs(value - mean) >= abs(self.atol)
        rtol_ok = self.rtol is None or abs(value - mean) >= abs(self.rtol * mean)
        return atol_ok and rtol_ok

    def _handle_spike(self, trainer: Trainer, batch_idx: int) -> None:
        # The batch before may have moved the weights towards the spike: both are skipped on resume.
        self.bad_batches.extend([batch_idx - 1, batch_idx])
        if trainer.global_rank == 0:
            assert self.exclude_batches_path is not None
            os.makedirs(os.path.dirname(self.exclude_batches_path) or ".", exist_ok=True)
            with open(self.exclude_batches_path, "w", encoding="utf-8") as f:
                json.dump(self.bad_batches, f, indent=4)
        raise TrainingSpikeException(batch_idx=batch_idx)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "last_val": self.last_val,
            "mode": self.mode,
            "warmup": self.warmup,
            "atol": self.atol,
            "rtol": self.rtol,
            "bad_batches": list(self.bad_batches),
            "bad_batches_path": self.exclude_batches_path,
            "window": self.window,
            "recent": list(self._recent),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_val = float(state_dict["last_val"])
        self.mode = state_dict["mode"]
        self.warmup = state_dict["warmup"]
        self.atol = state_dict["atol"]
        self.rtol = state_dict["rtol"]
        self.bad_batches = list(state_dict["bad_batches"])
        self.exclude_batches_path = state_dict["bad_batches_path"]
        self.window = int(state_dict.get("window", self.window))
        self._recent = deque(state_dict.get("recent", ()), maxlen=self.window)
