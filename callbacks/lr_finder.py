"""The learning-rate range test (Lightning's ``LearningRateFinder`` and the result ``lr_find`` returns).

A few optimizer steps with the learning rate growing from ``min_lr`` to ``max_lr`` (exponentially or
linearly), recording the smoothed loss at each; the suggestion is the rate where the loss falls
fastest. The steps run through :meth:`Trainer.run_trial`, which restores the weights, optimizers and
counters afterwards. The curve goes to TensorBoard as a figure (matplotlib), else as scalars.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from callbacks._attrs import has_attr, set_attr
from callbacks.base import Callback
from trainer.common.errors import MisconfigurationException
from trainer.common.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

__all__ = ["LRFinderResult", "LearningRateFinder", "log_lr_curve", "lr_attr_name"]

log = logging.getLogger(__name__)

_MODES = ("linear", "exponential")


class _SweepLR(LRScheduler):
    """From each group's base rate to ``end_lr`` in ``num_iter`` steps, exponentially or linearly."""

    def __init__(self, optimizer: torch.optim.Optimizer, end_lr: float, num_iter: int, exponential: bool) -> None:
        self.end_lr, self.num_iter, self.exponential = end_lr, num_iter, exponential
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:  # type: ignore[override]
        r = self.last_epoch / self.num_iter
        if self.exponential:
            return [float(base * (self.end_lr / base) ** r) for base in self.base_lrs]
        return [float(base + r * (self.end_lr - base)) for base in self.base_lrs]


class LRFinderResult:
    """What ``Tuner.lr_find`` returns (Lightning's ``_LRFinder``): the sweep's rates and smoothed losses,
    ``results = {"lr": [...], "loss": [...]}``, one entry per optimizer step of the sweep."""

    def __init__(self, mode: str, lr_min: float, lr_max: float, num_training: int) -> None:
        self.mode, self.lr_min, self.lr_max, self.num_training = mode, lr_min, lr_max, num_training
        self.results: dict[str, list[float]] = {"lr": [], "loss": []}
        self._optimal_idx: int | None = None
        #: Whether the sweep stopped early because the loss diverged (``early_stop_threshold``).
        self.diverged = False

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """One tenth of the rate where the smoothed loss is lowest: a rate a fixed-length run trains well with.

        The sweep raises the rate every step, so the loss is lowest just before training turns
        unstable; a run that keeps one rate for its whole length does best about ten times lower.
        (Lightning takes the point of steepest slope over the rate, which the smoothing's start-up
        and the sweep's tiny early steps can put many decades too low; see docs/tuning.md.)
        ``skip_begin``/``skip_end`` points at either end are left out (the smoothing's start, the
        divergence). None, with an error logged, when fewer than two finite points remain.
        """
        reason = self.no_suggestion_reason(skip_begin, skip_end)
        if reason is not None:
            log.error("%s", reason)
            self._optimal_idx = None
            return None
        end = -skip_end if skip_end else None
        losses = torch.tensor(self.results["loss"][skip_begin:end], dtype=torch.float64)
        finite = torch.isfinite(losses)
        kept = torch.arange(len(self.results["loss"]))[skip_begin:end][finite]
        lowest = int(kept[int(torch.argmin(losses[finite]))])
        target = self.results["lr"][lowest] / 10
        # The swept rate nearest to a tenth of the lowest point's (in log distance), so the suggestion
        # is a point of the curve that plot() can mark.
        distances = [abs(math.log(lr / target)) if lr > 0 else math.inf for lr in self.results["lr"]]
        self._optimal_idx = min(range(len(distances)), key=distances.__getitem__)
        return self.results["lr"][self._optimal_idx]

    def no_suggestion_reason(self, skip_begin: int = 10, skip_end: int = 1, options: str = "") -> str | None:
        """Why :meth:`suggestion` has no rate to suggest, naming what to change, or None when it has one.

        ``options`` is written before the option names (``"tuner.lr_find."`` for the ``geartrain`` command).
        """
        losses = self.results["loss"]
        if not any(math.isfinite(loss) for loss in losses):
            return (
                f"lr_find: the loss was not finite at any step (from lr={self._lr_at(0):g} on), so there is no "
                "learning rate to suggest: the model or the data gives NaN/inf whatever the rate; check them"
            )
        end = -skip_end if skip_end else None
        finite = sum(math.isfinite(loss) for loss in losses[skip_begin:end])
        if finite >= 2:
            return None
        last_finite = max(i for i, loss in enumerate(losses) if math.isfinite(loss))
        went_bad = last_finite + 1 < len(losses)  # not finite from some step on, to the sweep's end
        if self.diverged or went_bad:
            # The loss blew up before the curve had points to read: the rates tried were already too high.
            step = last_finite + 1 if went_bad else len(losses) - 1
            went = "was not finite" if went_bad else "diverged"
            return (
                f"lr_find: the loss {went} from the sweep's step {step} of {self.num_training} on "
                f"(lr={self._lr_at(step):g}), too early to suggest a learning rate: the sweep starts too high; "
                f"pass a lower {options}min_lr (now {self.lr_min:g})"
            )
        return (
            f"lr_find: too few points to suggest a learning rate ({finite} finite after skipping); raise "
            f"{options}num_training or give more training batches"
        )

    def _lr_at(self, index: int) -> float:
        return self.results["lr"][index] if 0 <= index < len(self.results["lr"]) else float("nan")

    def plot(self, suggest: bool = False, show: bool = False, ax: Any = None) -> Any:
        """The loss against the rate as a matplotlib figure (log scale for the exponential sweep).

        ``suggest`` marks the suggested rate; ``show`` calls ``plt.show()``; ``ax`` draws into given axes.
        Raises ImportError naming the fix when matplotlib is not installed.
        """
        try:
            import matplotlib

            matplotlib.use("Agg") if not show else None
            import matplotlib.pyplot as plt
        except ImportError as err:
            raise ImportError("LRFinderResult.plot needs matplotlib: pip install matplotlib") from err
        lrs, losses = self.results["lr"], self.results["loss"]
        fig, ax = plt.subplots(figsize=(8, 5)) if ax is None else (ax.figure, ax)
        ax.plot(lrs, losses)
        if self.mode == "exponential":
            ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("loss (smoothed)")
        ax.set_title("learning-rate range test")
        if suggest:
            lr = self.suggestion()
            if lr is not None and self._optimal_idx is not None:
                ax.plot(lr, losses[self._optimal_idx], markersize=10, marker="o", color="red")
                ax.annotate(
                    f"suggested {lr:.2g}", (lr, losses[self._optimal_idx]), textcoords="offset points", xytext=(8, 8)
                )
        if show:
            plt.show()
        return fig

    def state_dict(self) -> dict[str, Any]:
        """Plain values (they travel from a worker process and into checkpoints)."""
        return {
            "mode": self.mode,
            "lr_min": self.lr_min,
            "lr_max": self.lr_max,
            "num_training": self.num_training,
            "results": self.results,
            "diverged": self.diverged,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> LRFinderResult:
        """The result :meth:`state_dict` describes."""
        result = cls(state["mode"], state["lr_min"], state["lr_max"], state["num_training"])
        result.results = {"lr": list(state["results"]["lr"]), "loss": list(state["results"]["loss"])}
        result.diverged = bool(state.get("diverged", False))
        return result


class _Sweep(Callback):
    """The trial's only callback: swaps in the sweeping schedule, records rate and smoothed loss, stops on divergence."""

    beta = 0.98  # the loss's exponential moving average

    def __init__(self, min_lr: float, max_lr: float, steps: int, exponential: bool, threshold: float | None) -> None:
        self.min_lr, self.max_lr, self.steps, self.exponential, self.threshold = (
            min_lr,
            max_lr,
            steps,
            exponential,
            threshold,
        )
        self.lrs: list[float] = []
        self.losses: list[float] = []
        self.avg_loss, self.best_loss = 0.0, math.inf
        self.scheduler: _SweepLR | None = None
        self.start_step = 0
        self.diverged = False

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self.scheduler is None:
            self.exchange(trainer)

    def exchange(self, trainer: Trainer) -> None:
        """Every group of the first optimizer starts at ``min_lr``; the sweep replaces the run's schedulers."""
        if not trainer.optimizers:
            raise ValueError(
                "lr_find: configure_optimizers returned no optimizer, so there is no learning rate to sweep"
            )
        if len(trainer.optimizers) != 1:  # which one's rate would the suggestion be?
            raise MisconfigurationException(
                f"`model.configure_optimizers()` returned {len(trainer.optimizers)}, but learning rate finder only "
                "works with single optimizer"
            )
        optimizer = trainer.optimizers[0]
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] = self.min_lr
        self.scheduler = _SweepLR(optimizer, self.max_lr, self.steps, self.exponential)
        trainer.lr_scheduler_configs = [_StepSchedule(self.scheduler)]  # type: ignore[list-item]
        self.start_step = trainer.global_step

    def on_train_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches == 0 and self.scheduler is not None:
            self.lrs.append(float(self.scheduler.get_last_lr()[0]))

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches != 0:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is None:
            self.losses.append(math.nan)  # not used by the suggestion
            return
        current = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        # Lightning's bias correction, by the optimizer steps taken including this one (one power more
        # than the values averaged): the first points come out low, and the suggestion, the steepest
        # fall over the rate, depends on it (corrected exactly, the flat noisy start wins instead).
        step = trainer.global_step - self.start_step
        self.avg_loss = self.beta * self.avg_loss + (1 - self.beta) * current
        smoothed = self.avg_loss / (1 - self.beta ** (step + 1))
        diverged = self.threshold is not None and step > 1 and smoothed > self.threshold * self.best_loss
        # Every rank stops at the same step (each sees its own loss).
        if trainer.strategy.broadcast(bool(diverged)):
            trainer.should_stop = self.diverged = True
        if smoothed < self.best_loss or step == 1:
            self.best_loss = smoothed
        self.losses.append(smoothed)


@dataclass
class _StepSchedule:
    """The fields the loop reads of a scheduler config (``trainer.optim.SchedulerConfig``): step every step."""

    scheduler: LRScheduler
    interval: str = "step"
    frequency: int = 1
    monitor: str | None = None
    strict: bool = True
    name: str | None = None


class LearningRateFinder(Callback):
    """Lightning's ``LearningRateFinder``: run the learning-rate range test when ``fit`` starts.

    With ``update_attr=True`` the suggestion is written to ``attr_name`` (or ``lr`` /
    ``learning_rate``, on the module, its ``hparams`` or the datamodule) and to the running
    optimizer's groups, so the fit trains with it. ``optimal_lr`` holds the :class:`LRFinderResult`.

    Args:
        min_lr: the sweep's first rate.
        max_lr: its last rate.
        num_training_steps: optimizer steps of the sweep.
        mode: ``"exponential"`` or ``"linear"`` growth.
        early_stop_threshold: stop once the smoothed loss exceeds this multiple of the best (None: never).
        update_attr: set the suggestion on the module (and the running optimizer).
        attr_name: the attribute to set; ``""`` looks for ``lr``, then ``learning_rate``.
    """

    SUPPORTED_MODES = _MODES

    def __init__(
        self,
        min_lr: float = 1e-8,
        max_lr: float = 1,
        num_training_steps: int = 100,
        mode: str = "exponential",
        early_stop_threshold: float | None = 4.0,
        update_attr: bool = True,
        attr_name: str = "",
    ) -> None:
        mode = mode.lower()
        if mode not in _MODES:
            raise ValueError(f"`mode` should be either of {tuple(_MODES)}: LearningRateFinder(mode={mode!r})")
        if not (min_lr > 0 and max_lr > 0):  # min_lr above max_lr sweeps downwards, as in Lightning
            raise ValueError(f"LearningRateFinder(min_lr={min_lr}, max_lr={max_lr}): need positive learning rates")
        if not isinstance(num_training_steps, int) or num_training_steps < 1:
            raise ValueError(f"LearningRateFinder(num_training_steps={num_training_steps!r}): need a positive int")
        self._min_lr, self._max_lr, self._num_training_steps = min_lr, max_lr, num_training_steps
        self._mode, self._early_stop_threshold = mode, early_stop_threshold
        self._update_attr, self._attr_name = update_attr, attr_name
        self._early_exit = False  # Tuner.lr_find: the fit only hosts the sweep (its loggers get the curve)
        self.optimal_lr: LRFinderResult | None = None

    def lr_find(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Run the sweep now (inside ``fit``), keep the result in ``optimal_lr``, apply the suggestion."""
        if trainer.fast_dev_run:  # as Lightning: a warning, no sweep, no result
            rank_zero_warn("Skipping learning rate finder since `fast_dev_run` is enabled.")
            self.optimal_lr = None
            return
        attr = lr_attr_name(pl_module, self._attr_name) if self._update_attr else ""
        sweep = _Sweep(
            self._min_lr,
            self._max_lr,
            self._num_training_steps,
            self._mode == "exponential",
            self._early_stop_threshold,
        )
        trainer.run_trial(sweep, self._num_training_steps)
        if len(sweep.lrs) > len(sweep.losses):  # stopped between a batch's start and end
            del sweep.lrs[len(sweep.losses) :]
        result = LRFinderResult(self._mode, self._min_lr, self._max_lr, self._num_training_steps)
        result.results = trainer.strategy.broadcast({"lr": sweep.lrs, "loss": sweep.losses})
        result.diverged = sweep.diverged
        if sweep.diverged:
            log.info(
                "lr_find stopped after %d of %d steps: the loss diverged",
                len(result.results["lr"]),
                self._num_training_steps,
            )
        self.optimal_lr = result
        if self._update_attr:
            lr = result.suggestion()
            if lr is not None:
                set_attr(pl_module, attr, lr)
                for optimizer in trainer.optimizers:
                    for group in optimizer.param_groups:
                        group["lr"] = lr
        if not self._early_exit:
            log_lr_curve(trainer.loggers, result, trainer.global_step)

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Lightning's moment for the sweep: set up, before the first training step."""
        self.lr_find(trainer, pl_module)

    def state_dict(self) -> dict[str, Any]:
        """The result (it is handed back from the processes a strategy started)."""
        return {"optimal_lr": None if self.optimal_lr is None else self.optimal_lr.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take back what :meth:`state_dict` gave."""
        found = state_dict.get("optimal_lr")
        self.optimal_lr = None if found is None else LRFinderResult.from_state_dict(found)


def lr_attr_name(module: Any, attr_name: str, datamodule: Any = None) -> str:
    """The attribute ``update_attr`` sets: ``attr_name`` if given, else ``lr`` or ``learning_rate``; refused if none exists."""
    if attr_name:
        if not has_attr(module, attr_name, datamodule):
            raise AttributeError(
                f"lr_find(attr_name={attr_name!r}): {type(module).__name__} has no such attribute, "
                "hparams key or datamodule attribute; add it, or pass update_attr=False"
            )
        return attr_name
    for name in ("lr", "learning_rate"):
        if has_attr(module, name, datamodule):
            return name
    raise AttributeError(
        "When using the learning rate finder, either `model` or `model.hparams` should have one of these fields: "
        f"('lr', 'learning_rate'). lr_find(update_attr=True) sets the learning rate on the module, but "
        f"{type(module).__name__} has no "
        "`lr` or `learning_rate` (attribute or hparams key): add one and read it in configure_optimizers, "
        "name yours with attr_name=..., or pass update_attr=False and use the suggestion yourself"
    )


def log_lr_curve(loggers: list[Any], result: LRFinderResult, step: int = 0) -> bool:
    """Write the curve to every TensorBoard logger: a figure (matplotlib), else ``lr_find/loss`` and ``lr_find/lr`` scalars.

    Returns True when something was written. Only rank 0's loggers write (the others do nothing).
    """
    writers = [lg.experiment for lg in loggers if hasattr(getattr(lg, "experiment", None), "add_scalar")]
    if not writers or not any(math.isfinite(loss) for loss in result.results["loss"]):
        return False  # nothing to draw (no finite loss at all): whoever asks for a suggestion is told why
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        figure = None
    else:
        figure = result.plot(suggest=result.no_suggestion_reason() is None)  # the reason is told once, elsewhere
        # TensorBoard shows images about 350 pixels wide: drawn near that size, the labels stay legible.
        figure.set_size_inches(5.2, 3.5)
        figure.set_dpi(72)
        figure.tight_layout()
    for writer in writers:
        if figure is not None:
            writer.add_figure("lr_find", figure, global_step=step, close=False)
        else:
            for i, (lr, loss) in enumerate(zip(result.results["lr"], result.results["loss"])):
                if math.isfinite(loss):
                    writer.add_scalar("lr_find/loss", loss, i)
                writer.add_scalar("lr_find/lr", lr, i)
        writer.flush()
    if figure is not None:
        import matplotlib.pyplot as plt

        plt.close(figure)
    return True
