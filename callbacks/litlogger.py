"""``LitLogger``: an experiment on Lightning's platform through the ``litlogger`` package (rank 0 only).

Lightning 2.6's ``LitLogger``, talking to ``litlogger``'s public API: ``litlogger.Experiment(...)``
is the run, ``experiment[key].append(value, step=...)`` a metric's series, ``experiment[key] =
str(value)`` a piece of metadata, ``experiment[key] = litlogger.File(path)`` /
``litlogger.Model(obj_or_path, version=...)`` an uploaded file or model. The package is imported
when the logger is built (for its generated name) or first used, never by ``import callbacks``.

Like Lightning's, a run is not resumed: each logger that starts an experiment gets a new version
(its creation time), so a fit resumed from a checkpoint logs to a new experiment.

``NeptuneLogger`` lives here too: Lightning 2.6 retired it in favour of this logger, and building
one raises the ``RuntimeError`` Lightning raises.
"""

from __future__ import annotations

import os
import warnings
from argparse import Namespace
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, NoReturn

import torch
from typing_extensions import override

from callbacks._logger import Logger
from callbacks._tracker import CheckpointFile, RemoteLogger, import_client

__all__ = ["LitLogger", "NeptuneLogger"]


def _litlogger() -> Any:
    return import_client("litlogger", "litlogger>=0.1.0")


class LitLogger(RemoteLogger):
    """Track a run on lightning.ai: metrics, metadata, files and model checkpoints (Lightning's ``LitLogger``).

    Needs ``pip install litlogger``.

    Args:
        root_dir: folder of the local logs and metadata (default ``./lightning_logs``).
        name: the experiment's name (default: one ``litlogger`` generates).
        teamspace: the teamspace where charts and artifacts appear.
        metadata: extra metadata of the experiment (values become text).
        store_step: kept for Lightning's signature; steps are always stored.
        log_model: upload :class:`~callbacks.ModelCheckpoint`'s checkpoints as models: after every
            save with ``save_top_k=-1``, else when the run is finalized.
        save_logs: capture and upload the terminal output.
        checkpoint_name: the model name checkpoints are uploaded under (default: the experiment's name).
    """

    def __init__(
        self,
        root_dir: str | os.PathLike[str] | None = None,
        name: str | None = None,
        teamspace: str | None = None,
        metadata: dict[str, str] | None = None,
        store_step: bool = True,
        log_model: bool = False,
        save_logs: bool = True,
        checkpoint_name: str | None = None,
    ) -> None:
        _litlogger()
        super().__init__(log_model)
        self._root_dir = os.fspath(root_dir or "./lightning_logs")
        self._name = name or _generated_name()
        self._version: str | None = None
        self._teamspace = teamspace
        self._sub_dir: str | None = None
        #: The step of the last values logged (``-1``: none yet); counts up when no step is given.
        self._step = -1
        self._metadata = dict(metadata or {})
        self._store_step = store_step
        self._save_logs = save_logs
        #: ``log_model=True`` with ``save_top_k != -1``: the callback whose files go up at :meth:`finalize`.
        self._checkpoint_callback: Any = None
        self._checkpoint_name = checkpoint_name

    # ----------------------------------------------------------------- Lightning's properties
    @property
    @override
    def name(self) -> str:
        """The experiment's name."""
        return self._name

    @property
    @override
    def version(self) -> str | None:  # type: ignore[override]
        """The experiment's creation time (``None`` until the experiment starts); no ``:`` in it."""
        return self._version

    @property
    @override
    def root_dir(self) -> str:
        """The folder holding every experiment's local files."""
        return self._root_dir

    @property
    @override
    def log_dir(self) -> str:
        """``<root_dir>/<name>[/<sub_dir>]``, with ``~`` and environment variables expanded."""
        folder = os.path.join(self.root_dir, self.name)
        if isinstance(self._sub_dir, str):
            folder = os.path.join(folder, self._sub_dir)
        return os.path.expanduser(os.path.expandvars(folder))

    @property
    @override
    def save_dir(self) -> str:
        """The same as :attr:`log_dir`."""
        return self.log_dir

    @property
    def sub_dir(self) -> str | None:
        """A folder below ``<root_dir>/<name>`` (``None``: none)."""
        return self._sub_dir

    @property
    def _experiment_name(self) -> str:
        return self.name if self.version is None else f"{self.name}-{self.version}"

    @override
    def _open_run(self) -> Any:
        """Start the ``litlogger.Experiment``, whose version is its creation time."""
        litlogger = _litlogger()
        os.makedirs(self.root_dir, exist_ok=True)
        if self._version is None:
            # RFC 3339 with a Z suffix, ':' replaced: the name is used as a folder and in URLs.
            stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
            self._version = stamp.replace(":", "-").replace("+00:00", "Z")
        experiment = litlogger.Experiment(
            name=self._experiment_name,
            teamspace=self._teamspace,
            metadata={k: str(v) for k, v in self._metadata.items()},
            store_step=True,
            store_created_at=True,
            log_dir=self.log_dir,
            save_logs=self._save_logs,
        )
        experiment.print_url()
        return experiment

    @property
    def url(self) -> str | None:
        """The experiment's page on lightning.ai (``None`` off rank 0)."""
        return self.experiment.url if self._writes else None

    # ----------------------------------------------------------------- Lightning's logger methods
    @override
    def log_metrics(self, metrics: Mapping[str, float | torch.Tensor], step: int | None = None) -> None:
        """Append each value to its series at ``step`` (one more than the last step when ``None``)."""
        if not self._writes:
            return
        experiment = self.experiment
        self._step = self._step + 1 if step is None else step
        for key, value in self._with_prefix(metrics).items():
            experiment[key].append(value.item() if isinstance(value, torch.Tensor) else value, step=self._step)

    @override
    def log_hyperparams(self, params: dict[str, Any] | Namespace, metrics: dict[str, Any] | None = None) -> None:
        """Record each hyperparameter as the experiment's metadata (as text)."""
        self.log_metadata(params)

    def log_metadata(self, params: dict[str, Any] | Namespace) -> None:
        """Record ``params`` as the experiment's metadata, each value as text (rank 0 only)."""
        tree = vars(params) if isinstance(params, Namespace) else params
        self.hparams.update(tree)
        if not self._writes:
            return
        experiment = self.experiment
        for key, value in tree.items():
            experiment[key] = str(value)

    @override
    def log_graph(self, model: torch.nn.Module, input_array: torch.Tensor | None = None) -> None:
        """Not supported by the platform: warns, as Lightning's does."""
        if self._writes:
            warnings.warn("LitLogger does not support `log_graph`", UserWarning, stacklevel=2)

    @override
    def finalize(self, status: str | None = None) -> None:
        """Upload the checkpoints due, then finalize the experiment (only if one was started)."""
        if not self._writes or self._experiment is None:
            return
        if self._checkpoint_callback is not None:
            self._upload_new(self._checkpoint_callback)
        self._experiment.finalize(status)

    def log_model(
        self,
        model: Any,
        staging_dir: str | None = None,
        verbose: bool = False,
        version: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Upload a model object (saved by ``litlogger``) under the experiment's name; ``version``
        defaults to the last step logged."""
        if self._writes:
            model_ = _litlogger().Model(
                model, version=self._model_version(version, self._step), metadata=metadata, staging_dir=staging_dir
            )
            self.experiment[self._experiment_name] = model_

    def log_model_artifact(self, path: str, verbose: bool = False, version: str | None = None) -> None:
        """Upload a model file or folder under the experiment's name; ``version`` defaults to the last step."""
        if self._writes:
            self.experiment[self._experiment_name] = _litlogger().Model(
                path, version=self._model_version(version, self._step)
            )

    def log_file(self, path: str) -> None:
        """Upload a file to the experiment's folder of the teamspace drive."""
        if self._writes:
            self.experiment[_artifact_key(path)] = _litlogger().File(path)

    def get_file(self, path: str, verbose: bool = True) -> str | None:
        """Download the experiment's file ``path`` to ``path``; return where it was saved (``None`` off rank 0)."""
        if not self._writes:
            return None
        saved: str = self.experiment[_artifact_key(path)].save(path)
        return saved

    @override
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """``log_model=True``: upload now (``save_top_k=-1``), or remember the callback for :meth:`finalize`."""
        if self._log_model is False:
            return
        if getattr(checkpoint_callback, "save_top_k", None) == -1:
            self._upload_new(checkpoint_callback)
        else:
            self._checkpoint_callback = checkpoint_callback

    # ----------------------------------------------------------------- helpers
    @staticmethod
    def _model_version(version: str | None, step: int | None) -> str | None:
        if version is not None:
            return version
        return str(step) if step is not None and step >= 0 else None

    @override
    def _upload_checkpoint(self, checkpoint: CheckpointFile, checkpoint_callback: Any) -> None:
        experiment = self.experiment
        step = getattr(checkpoint_callback, "_last_global_step_saved", None)
        model = _litlogger().Model(checkpoint.path, version=self._model_version(None, step))
        experiment[self._checkpoint_name or experiment.name] = model

    @override
    def __getstate__(self) -> dict[str, Any]:
        """Also without the checkpoint callback it would upload for."""
        state = super().__getstate__()
        state["_checkpoint_callback"] = None
        return state


def _generated_name() -> str:
    from importlib import import_module

    name: str = import_module("litlogger.generator")._create_name()
    return name


def _artifact_key(path: str) -> str:
    """A file's name on the platform: its path from the working folder, or its base name when outside it."""
    try:
        relative: str | None = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        relative = None
    key = relative if relative is not None and not relative.startswith("..") else os.path.basename(path)
    return key.replace("\\", "/")


class NeptuneLogger(Logger):
    """Lightning 2.6 retired ``NeptuneLogger`` (Neptune was shut down); building one raises, naming :class:`LitLogger`."""

    def __init__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError(
            "NeptuneLogger is no longer supported. Neptune has been sunset.\n\n"
            "Please migrate to LitLogger (callbacks.LitLogger), the logger Lightning recommends instead, "
            "or use callbacks.MLFlowLogger, callbacks.WandbLogger, callbacks.TensorBoardLogger or callbacks.CSVLogger."
        )
