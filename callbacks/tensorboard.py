"""``TensorBoardLogger``: a callback that writes a run's scalars, hyperparameters and config."""

from __future__ import annotations

import os
import warnings
import weakref
from argparse import Namespace
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from callbacks._logger import Logger, NoOpExperiment, flat_params, run_hparams
from callbacks._logger_calls import yaml_params
from trainer.common.state_dict import to_plain

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["TensorBoardLogger"]

#: ``SummaryWriter``'s options other than ``log_dir`` (which the logger sets), checked when the logger
#: is built rather than at its first write.
_WRITER_OPTIONS = frozenset({"comment", "purge_step", "max_queue", "flush_secs", "filename_suffix"})


class TensorBoardLogger(Logger):
    """Write everything logged to one TensorBoard event file per run (rank 0 only).

    Lightning's ``TensorBoardLogger``, with its folders (``<save_dir>/<name>/version_<N>[/<sub_dir>]``)
    and methods, plus what geartrain adds:

    * Every value the trainer hands to loggers becomes a scalar at x = global step (the index of the
      optimizer step, from 0); epoch-level values sit at the step where their epoch ended. An
      ``epoch`` scalar is written at each of those steps, so the x-axis reads either way.
    * At fit start the resolved config goes in as text (tag ``config``) and the hyperparameters
      (the flattened config, ``model/hidden``; without a config the module's ``hparams``) as a
      session of the HPARAMS tab; at fit end the session is closed, linked to the final validation
      metrics (their scalar tags, so the HPARAMS table shows their last values). Lightning links
      its session to a placeholder ``hp_metric`` instead; that is written when you call
      :meth:`log_hyperparams` yourself (``default_hp_metric=True``).
    * One writer serves fit, validate and test of the run: a run is one event file.

    Args:
        save_dir: root folder (default: the trainer's ``default_root_dir``). The ``geartrain``
            command's config passes its Hydra run directory with ``name: tensorboard`` and
            ``version: ""``, so its files are in ``<run dir>/tensorboard`` and
            ``tensorboard --logdir outputs`` shows every run side by side.
        name: experiment folder under ``save_dir`` (``""`` or ``None``: none).
        version: ``None`` for the next free ``version_N``; an int or a folder name (``""``: none).
        log_graph: add the module's graph at fit start (needs ``example_input_array``).
        default_hp_metric: :meth:`log_hyperparams` without metrics writes ``hp_metric = -1``.
        prefix: written before every metric key as ``<prefix>-<key>``.
        sub_dir: a further folder inside the version folder.
        **kwargs: passed to ``SummaryWriter`` (``flush_secs`` defaults to 10 here).
    """

    #: The hyperparameters file :meth:`save` writes into ``log_dir``.
    NAME_HPARAMS_FILE = "hparams.yaml"
    #: True while the trainer hands over the run's hyperparameters at fit start (see :meth:`log_hyperparams`).
    _opening_session = False

    def __init__(
        self,
        save_dir: str | os.PathLike[str] | None = None,
        name: str | None = "lightning_logs",
        version: int | str | None = None,
        log_graph: bool = False,
        default_hp_metric: bool = True,
        prefix: str = "",
        sub_dir: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(save_dir, name, version, prefix)
        self._log_graph = log_graph
        self._default_hp_metric = default_hp_metric
        self._sub_dir = None if sub_dir is None else os.fspath(sub_dir)
        unknown = sorted(set(kwargs) - _WRITER_OPTIONS)
        if unknown:
            raise TypeError(
                f"TensorBoardLogger: {', '.join(unknown)} is not an option of TensorBoardLogger or of "
                f"SummaryWriter (its **kwargs): use {', '.join(sorted(_WRITER_OPTIONS))}"
            )
        kwargs.setdefault("flush_secs", 10)
        self._kwargs = kwargs
        self._writer: SummaryWriter | None = None
        self._session: dict[str, Any] = {}
        self._in_validation = False
        self._val_metrics: dict[str, float] = {}
        self._epoch_written_at = -1

    @property
    def sub_dir(self) -> str | None:
        """The folder inside the version folder, if any."""
        return self._sub_dir

    @property
    @override
    def log_dir(self) -> str:
        """The folder holding this run's event file (``~`` and environment variables in ``sub_dir`` expanded)."""
        base = super().log_dir
        assert base is not None  # save_dir is always a folder here (the trainer's default_root_dir until given)
        if not self._sub_dir:
            return base
        return os.path.expanduser(os.path.expandvars(os.path.join(base, self._sub_dir)))

    @property
    def experiment(self) -> Any:
        """The ``SummaryWriter`` (opened on first use; a do-nothing stand-in on ranks other than 0)."""
        if not self._writes:
            return NoOpExperiment()
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.log_dir), **self._kwargs)
            # Closed when this logger goes away or the interpreter exits, not per stage: one file per run.
            weakref.finalize(self, self._writer.close)
        return self._writer

    @property
    def writer(self) -> SummaryWriter | None:
        """The underlying ``SummaryWriter`` (``None`` before the first write and on ranks other than 0)."""
        return self._writer

    @override
    def __getstate__(self) -> dict[str, Any]:
        # The writer holds threads and locks; a copy sent to a worker (ddp_spawn) opens its own event
        # file in the same folder, which TensorBoard reads as one run.
        if self._writer is not None:
            self._writer.flush()
        state = super().__getstate__()
        state["_writer"] = None
        return state

    def close(self) -> None:
        """Flush and close the event file (a later write opens a new one)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # ----------------------------------------------------------------- Lightning's logger methods
    @override
    def log_metrics(self, metrics: Mapping[str, float | torch.Tensor], step: int | None = None) -> None:
        if not self._writes:
            return
        writer = self.experiment
        for key, value in self._with_prefix(metrics).items():
            if isinstance(value, torch.Tensor):
                value = value.item()  # the device sync happens here, at the logging interval only
            if isinstance(value, dict):
                writer.add_scalars(key, value, global_step=step)
            else:
                writer.add_scalar(key, value, global_step=step)

    @override
    def log_hyperparams(self, params: dict[str, Any] | Namespace, metrics: dict[str, Any] | None = None) -> None:
        """Record ``params`` in TensorBoard's hparams view with ``metrics`` (default ``hp_metric=-1``).

        When fitting starts the trainer's call opens the run's session instead: its metrics are the
        last validation values, written when fitting ends.
        """
        flat = flat_params(params)  # TensorBoard's hparams view takes flat values; hparams.yaml is nested
        self.hparams.update(yaml_params(params))
        if not self._writes:
            return
        if self._opening_session and metrics is None:
            from torch.utils.tensorboard.summary import hparams as summaries

            self._session = flat
            _, start, _ = summaries(flat, {})
            self.experiment._get_file_writer().add_summary(start)
            return
        if metrics is None and self._default_hp_metric:
            metrics = {"hp_metric": -1}
        if metrics:
            self.log_metrics(metrics, 0)
        from torch.utils.tensorboard.summary import hparams

        experiment, start, end = hparams(flat, dict(metrics or {}))
        file_writer = self.experiment._get_file_writer()
        for summary in (experiment, start, end):
            file_writer.add_summary(summary)

    @override
    def log_graph(self, model: torch.nn.Module, input_array: torch.Tensor | None = None) -> None:
        if not (self._log_graph and self._writes):
            return
        """Trace ``model`` on ``input_array`` (default: its ``example_input_array``) into TensorBoard's graph.

        As Lightning's: without an input, or with one that is neither a tensor nor a tuple of
        positional arguments, it warns and records no graph.
        """
        if input_array is None:
            input_array = getattr(model, "example_input_array", None)
        if input_array is None:
            warnings.warn(
                "Could not log computational graph to TensorBoard: The `model.example_input_array` attribute is "
                "not set or `input_array` was not given.",
                UserWarning,
                stacklevel=2,
            )
            return
        if not isinstance(input_array, (torch.Tensor, tuple)):
            warnings.warn(
                "Could not log computational graph to TensorBoard: The `input_array` or `model.example_input_array` "
                f"has type {type(input_array)} which can't be traced by TensorBoard. Make the input array a tuple "
                "representing the positional arguments to the model's `forward()` implementation.",
                UserWarning,
                stacklevel=2,
            )
            return
        # torch.jit reads every attribute of the module; a module not attached to a trainer answers None there.
        model.__dict__["_jit_is_scripting"] = True
        try:
            self.experiment.add_graph(model, input_array)
        finally:
            model.__dict__.pop("_jit_is_scripting", None)

    @override
    def save(self) -> None:
        if self._writer is not None:
            self._writer.flush()
        if self._writes and os.path.isdir(self.log_dir):  # as Lightning's: `{}` without hyperparameters
            path = os.path.join(self.log_dir, self.NAME_HPARAMS_FILE)
            if not os.path.exists(path):
                import yaml

                with open(path, "w") as f:
                    yaml.safe_dump(self.hparams, f, sort_keys=False)

    @override
    def finalize(self, status: str) -> None:
        self.save()
        self.close()

    # ----------------------------------------------------------------- as a callback
    @override
    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not self._writes:
            return
        writer = self.experiment
        config = _config_dict(trainer.config)
        if config:
            import yaml

            text = yaml.safe_dump(config, sort_keys=False)
            # Indented by four spaces: TensorBoard's markdown shows it as a code block, layout intact.
            writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), global_step=0)
        # The resolved config already holds the module's arguments; without one, the module's hparams
        # (with the data module's, as Lightning's trainer merges them). save_hyperparameters(logger=False)
        # keeps a side's hyperparameters out of the loggers.
        params = config or _config_dict(run_hparams(pl_module, trainer))
        if params:
            # Through log_hyperparams, as Lightning's trainer calls it: a subclass overriding it sees them.
            self._opening_session = True
            try:
                self.log_hyperparams(params)
            finally:
                self._opening_session = False
        if self._log_graph:
            self.log_graph(pl_module)

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._in_validation = not trainer.sanity_checking

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._in_validation = False

    @override
    def on_log_metrics(
        self, trainer: Trainer, pl_module: TrainModule, metrics: dict[str, torch.Tensor], step: int
    ) -> None:
        if not self._writes:
            return
        numbers = {key: float(value) for key, value in metrics.items()}  # one device sync per value, here only
        if self._in_validation:
            self._val_metrics.update(self._with_prefix({k: v for k, v in numbers.items() if k != "epoch"}))
        # The trainer's rows carry ``epoch`` (an evaluation step's do not, as Lightning's): one epoch
        # point per step, the first one written.
        if "epoch" in numbers:
            if step == self._epoch_written_at:
                numbers.pop("epoch")
            else:
                self._epoch_written_at = step
        self.log_metrics(metrics=numbers, step=step)

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not self._writes or not self._session:
            return
        from torch.utils.tensorboard.summary import hparams

        # The experiment names the metric tags; TensorBoard shows each one's last value in the run.
        experiment, _, end = hparams(self._session, dict(self._val_metrics))
        file_writer = self.experiment._get_file_writer()
        file_writer.add_summary(experiment)
        file_writer.add_summary(end)
        self.experiment.flush()

    @override
    def teardown(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if self._writes:
            self.save()


def _config_dict(config: Any) -> dict[str, Any]:
    plain = to_plain(config)
    return plain if isinstance(plain, dict) else {}
