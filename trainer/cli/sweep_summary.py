"""A study goes on past a failed trial, says how many failed and why, and stops at once on a config mistake.

Hydra's Optuna sweeper records a trial that raised (or returned NaN) as failed, and with
``max_failure_rate: 1.0`` (``conf/hparams_search/digits_optuna.yaml``) the study goes on to its
next trial instead of ending with a chained traceback. This Hydra callback keeps the tally: each
failed trial's number, parameters and reason in one line, printed when the sweep ends.

A config mistake that no sampled value causes (a typo'd ``optimized_metric``, a key that does not
exist) would fail every trial alike, so it ends the study at once with the usual short message and
the tally so far. A mistake is the trial's own failure, and the study goes on, when the trial's
values may cause it: once any trial of the study has trained (the config works; this trial's
values do not, e.g. a metric it never logged), or when the object that could not be built holds a
swept parameter (``model`` when ``model.hidden`` is swept).
"""

from __future__ import annotations

import sys
from typing import Any

from hydra.experimental.callback import Callback

__all__ = ["TrialSummary", "optimising_sweep"]


class TrialSummary(Callback):
    """Counts a sweep's trials and remembers why each failed one failed."""

    def __init__(self) -> None:
        self.trials = 0
        self.completed = 0
        self.failed: list[str] = []

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        """Tally the trial; re-raise a user's mistake so the study ends with it."""
        from hydra.core.utils import JobStatus
        from hydra.types import RunMode

        from trainer.cli.errors import describe, report

        if config.hydra.mode != RunMode.MULTIRUN:
            # A rank that ``strategy=ddp`` started runs the trial as a single job: the study is rank 0's.
            return
        self.trials += 1
        number = getattr(config.hydra.job, "num", self.trials - 1)
        overrides = [str(o) for o in (getattr(job_return, "overrides", None) or [])]
        swept = set((config.hydra.sweeper.get("params") or {}).keys())
        params = " ".join(o for o in overrides if o.partition("=")[0] in swept) or " ".join(overrides)
        if job_return.status == JobStatus.FAILED:
            err = job_return._return_value
            message = _mistake(err, describe)
            if message is not None and not self.completed and not _builds_a_swept_value(err, swept):
                # Hydra's callbacks may not raise (it turns exceptions into warnings): end the study here.
                report(message)
                print(
                    f"study: ended at trial {number} by this config mistake, which every trial would repeat "
                    f"({self.trials} trial(s) ran, {len(self.failed) + 1} failed)",
                    file=sys.stderr,
                )
                raise SystemExit(1)
            reason = _reason(err) if message is None else " ".join(line.strip() for line in message.splitlines())
            self.failed.append(f"trial {number} ({params}): {reason}")
            if self.trials == config.hydra.sweeper.get("n_trials") and len(self.failed) == self.trials:
                # The sweeper would end with "No trials are completed yet" through a chained traceback.
                self.on_multirun_end(config)
                raise SystemExit(1)
        else:
            self.completed += 1

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        """One line for the study, then one per failed trial."""
        if not self.failed:
            return
        if len(self.failed) == self.trials:
            print(f"study: every trial failed ({self.trials}), so it has no best parameters:", file=sys.stderr)
        else:
            print(f"study: {len(self.failed)} of {self.trials} trials failed:", file=sys.stderr)
        for line in self.failed:
            print(f"  {line}", file=sys.stderr)


def _mistake(err: Any, describe: Any) -> str | None:
    """A user's config mistake (which every trial would repeat) as the command reports it, else None."""
    from trainer.common.errors import CheckpointError

    if not isinstance(err, Exception) or isinstance(err, CheckpointError):
        return None
    try:
        message: str | None = describe(err)
    except Exception:
        return None
    return message


def _builds_a_swept_value(err: Any, swept: set[str]) -> bool:
    """Whether ``err`` is Hydra's failure to build an object of the config that holds a swept parameter."""
    from hydra.errors import InstantiationException

    if not isinstance(err, InstantiationException):
        return False
    lines = str(err).splitlines()
    full_key = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("full_key:")), "")
    return not full_key or any(key == full_key or key.startswith(full_key + ".") for key in swept)


def _reason(err: Any) -> str:
    cause = getattr(err, "cause", "")  # another rank's failure (WorkerFailedError): what it raised, in one line
    if isinstance(cause, str) and cause.strip():
        return f"(rank {getattr(err, 'rank', '?')}) {cause.strip().splitlines()[0]}"
    text = str(err).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def optimising_sweep() -> bool:
    """Whether the job runs under a sweeper that optimises its return value (not Hydra's basic one)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    return hc.mode == RunMode.MULTIRUN and "BasicSweeper" not in str(hc.sweeper.get("_target_", ""))
