"""``PyTorchProfiler``: ``torch.profiler`` over a stage, with a ``record_function`` range per action.

The torch profiler starts when the stage is set up (in every process) and follows a schedule counted
in batches (``wait`` batches ignored, ``warmup`` batches profiled and thrown away, ``active`` batches
recorded). Each action (``training_step``, ``backward``, a callback's hook) is a ``record_function``
range, and with ``record_module_names`` so is each module's forward. The recorded window is written as
``<dirpath>/<stage>-rank<R>.<id>.pt.trace.json``, one file per rank: TensorBoard's profiler plugin
(``torch-tb-profiler``) and Perfetto / ``chrome://tracing`` open it.
"""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, record_function, tensorboard_trace_handler

from trainer.profilers.base import Profiler

__all__ = ["PyTorchProfiler"]


class PyTorchProfiler(Profiler):
    """``torch.profiler.profile`` over the run; traces for TensorBoard and Perfetto.

    Args:
        dirpath: where traces and the report go; ``None``: the trainer's ``log_dir``.
        filename: the report's file name without ``.txt``.
        group_by_input_shapes: the report's rows split by input shapes (only with ``record_shapes=True``,
            as Lightning's: otherwise False).
        emit_nvtx: refused (run under ``nsys`` with ``torch.autograd.profiler.emit_nvtx()`` yourself).
        export_to_chrome: write the ``*.pt.trace.json`` traces (``False``: only the report).
        row_limit: rows of the report (``-1``: all).
        sort_by_key: the report's sort column (default ``cpu_time_total``, or ``cuda_time_total`` on GPU).
        record_module_names: a ``record_function`` range around every module's forward, named by class.
        table_kwargs: more keyword arguments for ``key_averages().table``.
        **profiler_kwargs: passed to ``torch.profiler.profile`` (``activities``, ``schedule``,
            ``record_shapes``, ``profile_memory``, ``with_stack``, ``on_trace_ready``, ...). The default
            schedule is ``torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1)``: one trace of three
            batches per stage and rank.
    """

    #: Actions whose end is one step of the profiler's schedule: one training batch, one evaluation batch
    #: (``[Strategy]<class>.validation_step``...: matched by their ending), each kind counted apart.
    STEP_ACTIONS = {
        "run_training_batch": "train",
        "validation_step": "val",
        "test_step": "test",
        "predict_step": "predict",
    }
    #: The prefix of every action's ``record_function`` range in the trace (Lightning's).
    RECORD_PREFIX = "[pl][profile]"

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        group_by_input_shapes: bool = False,
        emit_nvtx: bool = False,
        export_to_chrome: bool = True,
        row_limit: int = 20,
        sort_by_key: str | None = None,
        record_module_names: bool = True,
        table_kwargs: dict[str, Any] | None = None,
        **profiler_kwargs: Any,
    ) -> None:
        if emit_nvtx:
            raise ValueError(
                "PyTorchProfiler(emit_nvtx=True) is not supported: run the script under nsys with "
                "torch.autograd.profiler.emit_nvtx() around trainer.fit yourself"
            )
        super().__init__(dirpath, filename)
        # As Lightning's: grouping needs the shapes recorded. Read by name from ``profiler_kwargs``, so
        # LightningCLI (jsonargparse) resolves ``record_shapes`` as an argument of this class, as Lightning's.
        self.group_by_input_shapes: bool = group_by_input_shapes and profiler_kwargs.get("record_shapes", False)
        self.export_to_chrome = export_to_chrome
        self.row_limit = row_limit
        self.sort_by_key = sort_by_key
        self.record_module_names = record_module_names
        self.table_kwargs = dict(table_kwargs or {})
        _check_table_kwargs(self.table_kwargs)
        self.profiler_kwargs = profiler_kwargs
        #: The trace files written in this process, in order.
        self.trace_files: list[Path] = []
        self._profiler: torch.profiler.profile | None = None
        self._ranges: dict[str, Any] = {}
        self._module_ranges: list[Any] = []
        self._hooks: list[Any] = []
        self._table = ""
        #: torch's events of the last recorded window (``profile.events()``), kept when the profiler stops
        #: (after :meth:`summary`, :meth:`describe` or the stage's end); ``None`` before.
        self.function_events: Any = None
        self._used_alone = False  # started by an action outside a trainer (once)
        self._schedule: _PerKindSchedule | None = None  # the default schedule's counts (None: the user's schedule)

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (the trainer travels to the processes it starts) before :meth:`setup` starts torch's profiler."""
        state = self.__dict__.copy()
        state.update(_profiler=None, _ranges={}, _module_ranges=[], _hooks=[], _schedule=None)
        return state

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | Path | None = None) -> None:
        """Start torch's profiler for ``stage`` in this process."""
        super().setup(stage, local_rank, log_dir)
        self._finish()
        self._start_torch(steps=True)

    def _start_torch(self, steps: bool) -> None:
        """Start torch's profiler; ``steps``: a trainer's stage, whose batches advance the default schedule."""
        self._table = ""
        kwargs = dict(self.profiler_kwargs)
        kwargs.setdefault("activities", _default_activities())
        self._schedule = None
        if steps and "schedule" not in kwargs:
            self._schedule = kwargs["schedule"] = _PerKindSchedule(torch.profiler.schedule(wait=1, warmup=1, active=3))
        if self.export_to_chrome and "on_trace_ready" not in kwargs:
            kwargs["on_trace_ready"] = self._write_trace
        self._profiler = torch.profiler.profile(**kwargs)
        self._profiler.start()
        if self.record_module_names:
            self._hooks = [
                torch.nn.modules.module.register_module_forward_pre_hook(self._enter_module),
                torch.nn.modules.module.register_module_forward_hook(self._exit_module),
            ]

    def start(self, action_name: str) -> None:
        """Open a ``record_function`` range named ``action_name``.

        Used outside a trainer, the first action starts torch's profiler, recording
        everything until :meth:`summary` or :meth:`describe` (Lightning's profilers work without a trainer).
        """
        if self._profiler is None:
            if self.in_trainer or self._used_alone:
                return
            self._used_alone = True
            self._start_torch(steps=False)
        rf = record_function(self.RECORD_PREFIX + action_name)
        rf.__enter__()
        self._ranges[action_name] = rf

    def stop(self, action_name: str) -> None:
        """Close ``action_name``'s range; after a batch, advance the schedule."""
        rf = self._ranges.pop(action_name, None)
        if rf is not None:
            rf.__exit__(None, None, None)
        kind = self.STEP_ACTIONS.get(action_name.rpartition(".")[2])
        if self._profiler is not None and kind is not None:
            schedule = self._schedule
            if schedule is not None:
                schedule.kind = kind
                schedule.sanity_checking = bool(getattr(self._trainer(), "sanity_checking", False))
                if self._stage_batches(kind) < 5:  # the default window needs 5 batches of the kind: record all
                    warnings.warn(
                        "The PyTorch Profiler default schedule will be overridden as there is not enough "
                        "steps to properly record traces.",
                        UserWarning,
                        stacklevel=2,
                    )
                    self._schedule = None
                    self._profiler.schedule = _record_always
            self._profiler.step()

    def _trainer(self) -> Any:
        return getattr(self._lightning_module, "_trainer", None)

    def _stage_batches(self, kind: str) -> float:
        """Batches of ``kind`` this stage runs (a validation's include the sanity check's; inf: unknown)."""
        trainer = self._trainer()
        if trainer is None:
            return float("inf")
        counts = {
            "train": [trainer.num_training_batches],
            "val": [trainer.num_val_batches, trainer.num_sanity_val_batches],
            "test": [trainer.num_test_batches],
            "predict": [trainer.num_predict_batches],
        }[kind]
        return sum(sum(n) if isinstance(n, list) else n for n in counts)

    def summary(self) -> str:
        """Torch's table of the recorded window (``key_averages``); stops the profiler first."""
        self._finish()
        return self._table

    def teardown(self, stage: str | None) -> None:
        """Stop torch's profiler (writing the trace of a window still recording)."""
        self._finish()
        super().teardown(stage)

    def _finish(self) -> None:
        """Stop torch's profiler once: close open ranges, remove module hooks, keep the report."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        for rf in reversed([*self._ranges.values(), *self._module_ranges]):
            rf.__exit__(None, None, None)
        self._ranges, self._module_ranges = {}, []
        prof, self._profiler = self._profiler, None
        if prof is None:
            return
        prof.stop()
        try:
            self.function_events = prof.events()
        except (AssertionError, RuntimeError):  # nothing was recorded
            self.function_events = None
        try:
            averages = prof.key_averages(group_by_input_shape=self.group_by_input_shapes)
        except (AssertionError, RuntimeError):  # nothing was recorded (the stage ended before the window)
            return
        sort_by = self.sort_by_key or ("cuda_time_total" if torch.cuda.is_available() else "cpu_time_total")
        self._table = averages.table(sort_by=sort_by, row_limit=self.row_limit, **self.table_kwargs)

    def _write_trace(self, prof: torch.profiler.profile) -> None:
        """``on_trace_ready``: this rank's trace file, where TensorBoard's profiler plugin looks for it."""
        if self.dirpath is None:
            return
        directory = Path(self.dirpath)
        worker = "-".join(
            [self._stage or "run", *([self.filename] if self.filename else []), f"rank{self.global_rank}"]
        )
        before = set(directory.glob(f"{worker}.*.pt.trace.json")) if directory.exists() else set()
        tensorboard_trace_handler(str(directory), worker_name=worker)(prof)
        self.trace_files.extend(sorted(set(directory.glob(f"{worker}.*.pt.trace.json")) - before))

    def _enter_module(self, module: torch.nn.Module, args: Any) -> None:
        rf = record_function(f"[module]{type(module).__name__}")
        rf.__enter__()
        self._module_ranges.append(rf)

    def _exit_module(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._module_ranges:
            self._module_ranges.pop().__exit__(None, None, None)


class _PerKindSchedule:
    """torch's schedule counted per kind of batch (training, validation, test, predict), as Lightning's.

    Each kind runs through the window on its own batches and records it once; a ``fit``'s sanity check
    counts no validation batch (nothing was trained yet).
    """

    def __init__(self, schedule: Any) -> None:
        self.schedule = schedule
        self.kind: str | None = None  # the kind of the batch that just ended (set before each step)
        self.sanity_checking = False  # ... and whether it was the sanity check's
        self.counts: dict[str, int] = {}
        self.finished: set[str] = set()
        self.previous = ProfilerAction.NONE

    def __call__(self, step: int) -> ProfilerAction:
        kind = self.kind
        if kind is None or kind in self.finished:
            return ProfilerAction.NONE
        if not self.sanity_checking:
            self.counts[kind] = self.counts.get(kind, 0) + 1
        action = self.schedule(self.counts.get(kind, 0))
        if self.previous == ProfilerAction.RECORD and action == ProfilerAction.WARMUP:
            action = ProfilerAction.RECORD  # a validation recording, then training still warming up: keep recording
        if action == ProfilerAction.RECORD_AND_SAVE:
            self.finished.add(kind)
        self.previous = action
        return action


def _record_always(step: int) -> ProfilerAction:
    return ProfilerAction.RECORD


def _check_table_kwargs(table_kwargs: dict[str, Any]) -> None:
    """Refuse a ``table_kwargs`` key that is an argument of the profiler or unknown to torch's ``EventList.table``."""
    from torch.autograd.profiler_util import EventList

    valid = set(inspect.signature(EventList.table).parameters) - {"self", "sort_by", "row_limit"}
    for key in table_kwargs:
        if key in {"sort_by", "row_limit"}:
            raise KeyError(
                f"Found invalid table_kwargs key: {key}. This is already a positional argument of the Profiler."
                f" Pass PyTorchProfiler({'sort_by_key' if key == 'sort_by' else key}=...) instead."
            )
        if key not in valid:
            raise KeyError(f"Found invalid table_kwargs key: {key}. Should be within {sorted(valid)}.")


def _default_activities() -> list[ProfilerActivity]:
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return activities
