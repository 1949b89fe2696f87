"""``MLFlowLogger``: a run in an MLflow tracking server or a local MLflow store (rank 0 only)."""

from __future__ import annotations

import importlib.metadata
import os
import posixpath
import re
import tempfile
import time
import warnings
from argparse import Namespace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from typing_extensions import override

from callbacks._logger import NoOpExperiment, flat_params
from callbacks._tracker import CheckpointFile, TrackerLogger, import_tracker

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

__all__ = ["MLFlowLogger"]

_LOCAL = "file:"
#: MLflow takes at most this many params (and metrics) in one ``log_batch`` call.
_BATCH = 100
#: Characters MLflow keeps of a param value (older servers: 500; values are cut, as Lightning cuts them).
_PARAM_CHARS = 500
#: The metric names MLflow accepts (``mlflow.utils.validation``): word characters of any script (``Δ``),
#: ``/ . - :`` and spaces, and a path that normalises to itself (no ``a//b``, ``./a``, ``/a``, ``..``).
_ACCEPTED = re.compile(r"[/\w.\- :]*")
_REFUSED = re.compile(r"[^/\w.\- :]+")


def _mlflow_version() -> str | None:
    """The installed MLflow client's version (``mlflow`` or ``mlflow-skinny``); None where neither says."""
    for distribution in ("mlflow", "mlflow-skinny"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _synchronous_supported(version: str | None) -> bool:
    """Whether ``log_batch(synchronous=...)`` exists: MLflow 2.8 and later (an unknown version is given the benefit)."""
    if version is None:
        return True
    numbers = [int(part) for part in re.findall(r"\d+", version)[:2]]
    return tuple(numbers) >= (2, 8)


class MLFlowLogger(TrackerLogger):
    """Log to `MLflow <https://mlflow.org>`_: Lightning's ``MLFlowLogger``, as a callback.

    Needs ``pip install 'geartrain[mlflow]'`` (the ``mlflow-skinny`` client; a server needs ``mlflow``).

    Args:
        experiment_name: the MLflow experiment (created if missing).
        run_name: the run's name (its ``mlflow.runName`` tag). ``None``: MLflow picks one; under the
            ``geartrain`` command the run directory's name.
        tracking_uri: the server (``http://127.0.0.1:5000``) or store URI; ``None``: the
            ``MLFLOW_TRACKING_URI`` environment variable, else ``file:<save_dir>``.
        tags: tags set on the new run.
        save_dir: the local store used when no tracking URI is given (made absolute when built).
        log_model: upload checkpoints of :class:`~callbacks.ModelCheckpoint` as artifacts under
            ``<file stem>/``: ``"all"`` after every save, ``True`` when fitting ends, ``False`` never.
        prefix: written before every metric key as ``<prefix>-<key>``.
        artifact_location: where a newly created experiment keeps its artifacts.
        run_id: an existing run to write to (resumed). Without it a checkpoint's run is resumed.
        synchronous: ``False`` lets MLflow log in the background (``None``: MLflow's default).

    Under the ``geartrain`` command (``logger=mlflow``) the run gets tags ``geartrain.run_dir`` and
    ``geartrain.checkpoint_dir``, the resolved config as params (``model/hidden``) and as the
    artifact ``config.yaml``.
    """

    def __init__(
        self,
        experiment_name: str = "lightning_logs",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: dict[str, Any] | None = None,
        save_dir: str | None = "./mlruns",
        log_model: Literal[True, False, "all"] = False,
        prefix: str = "",
        artifact_location: str | None = None,
        run_id: str | None = None,
        synchronous: bool | None = None,
    ) -> None:
        import_tracker("mlflow", "mlflow", "MLFlowLogger")
        if synchronous is not None and not _synchronous_supported(version := _mlflow_version()):
            raise ModuleNotFoundError(
                f"`synchronous` requires mlflow>=2.8.0 (installed: {version}): upgrade mlflow, or leave synchronous=None"
            )
        super().__init__(log_model, prefix)
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not tracking_uri:
            tracking_uri = _LOCAL + os.path.abspath(save_dir or "./mlruns")
        self._experiment_name = experiment_name
        self._experiment_id: str | None = None
        self._tracking_uri = tracking_uri
        self._run_name = run_name
        self.tags = dict(tags) if tags else None
        self._artifact_location = artifact_location
        self._run_id = run_id
        self._given_run_id = run_id
        self._batch_kwargs = {} if synchronous is None else {"synchronous": synchronous}
        #: Built here, so that a tracking URI MLflow refuses fails when the logger is built.
        self._client: MlflowClient | None = _client(tracking_uri)
        self._opened = False
        #: Metric key -> the name it is written under (itself, unless MLflow refuses it), and back.
        self._written_as: dict[str, str] = {}
        self._written_for: dict[str, str] = {}

    # ----------------------------------------------------------------- Lightning's properties
    @property
    def experiment(self) -> Any:
        """The ``mlflow.tracking.MlflowClient`` (the run opened first); a do-nothing stand-in off rank 0."""
        if not self._writes:
            return NoOpExperiment()
        if self._client is None:  # a copy sent to another process builds its own
            self._client = _client(self._tracking_uri)
        if not self._opened:
            self._open_run()
            self._opened = True
        return self._client

    @property
    def run_id(self) -> str | None:
        """The run's id (opens the run on rank 0)."""
        _ = self.experiment
        return self._run_id

    @property
    def experiment_id(self) -> str | None:
        """The experiment's id (opens the run on rank 0)."""
        _ = self.experiment
        return self._experiment_id

    @property
    @override
    def save_dir(self) -> str | None:  # type: ignore[override]
        """The local store's folder when the tracking URI is ``file:``, else ``None`` (Lightning's)."""
        if self._tracking_uri.startswith(_LOCAL):
            return self._tracking_uri[len(_LOCAL) :]
        return None

    @property
    @override
    def name(self) -> str | None:  # type: ignore[override]
        """The experiment's id (Lightning's meaning of ``name`` for MLflow)."""
        return self.experiment_id

    @property
    @override
    def version(self) -> str | None:  # type: ignore[override]
        """The run's id."""
        return self.run_id

    @override
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_client"] = None  # holds a session and locks; the copy builds its own on first use
        state["_opened"] = self._opened and self._run_id is not None
        return state

    # ----------------------------------------------------------------- the run
    @override
    def _is_open(self) -> bool:
        return self._opened

    @override
    def _open_run(self) -> Any:
        client = self._client
        assert client is not None
        if self._run_id is not None:
            run = client.get_run(self._run_id)
            self._experiment_id = run.info.experiment_id
            if run.info.status != "RUNNING":
                client.update_run(self._run_id, status="RUNNING")
            return client
        found = client.get_experiment_by_name(self._experiment_name)
        if found is not None and found.lifecycle_stage != "deleted":
            self._experiment_id = found.experiment_id
        else:
            self._experiment_id = client.create_experiment(self._experiment_name, self._artifact_location)
        tags = {str(k): str(v) for k, v in (self.tags or {}).items()}
        run_name = self._run_name if self._run_name is not None else self._default_run_name()
        if run_name is not None:
            tags["mlflow.runName"] = run_name
        from mlflow.tracking.context.registry import resolve_tags

        run = client.create_run(self._experiment_id, tags=resolve_tags(tags))
        self._run_id = run.info.run_id
        return client

    @override
    def _write_metrics(self, metrics: dict[str, float], step: int | None) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        entries = [Metric(self._tracker_key(k), v, stamp, step or 0) for k, v in metrics.items()]
        for start in range(0, len(entries), _BATCH):
            self.experiment.log_batch(self._run_id, metrics=entries[start : start + _BATCH], **self._batch_kwargs)

    @override
    def _tracker_key(self, key: str) -> str:
        """The name ``key`` is written under: itself when MLflow accepts it and no other metric holds it.

        A name MLflow refuses loses the characters it refuses (``acc@5`` -> ``acc5``, as Lightning
        writes it); a name another metric holds already gets ``-2`` (``-3``, ...), so two metrics
        never share one series. Either is said once, in a warning naming both names.
        """
        name = self._written_as.get(key)
        if name is not None:
            return name
        name = key if _accepted(key) else _cleaned(key)
        base, count = name, 1
        while self._written_for.get(name, key) != key:
            count += 1
            name = f"{base}-{count}"
        if name != key:
            why = "MLflow does not accept it" if base != key else ""
            if count > 1:
                held = f"{base!r} is the name of the metric {self._written_for[base]!r}"
                why = f"{why}, and {held}" if why else held
            warnings.warn(
                f"MLFlowLogger: the metric {key!r} is written as {name!r}: {why}", RuntimeWarning, stacklevel=2
            )
        self._written_as[key] = name
        self._written_for[name] = key
        return name

    @override
    def _last_steps(self) -> dict[str, int]:
        client, run_id = self.experiment, self._run_id
        keys = client.get_run(run_id).data.metrics
        return {key: max(m.step for m in client.get_metric_history(run_id, key)) for key in keys}

    @override
    def _upload_checkpoint(self, checkpoint: CheckpointFile, checkpoint_callback: Any) -> None:
        import yaml

        folder = Path(checkpoint.path).stem
        self.experiment.log_artifact(self._run_id, checkpoint.path, folder)
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "metadata.yaml"), "w") as f:
                yaml.safe_dump(checkpoint.metadata(checkpoint_callback), f, sort_keys=False)
            with open(os.path.join(tmp, "aliases.txt"), "w") as f:
                f.write(str(checkpoint.aliases))
            self.experiment.log_artifacts(self._run_id, tmp, folder)

    @override
    def _record_run_context(self, context: dict[str, str], config: dict[str, Any] | None) -> None:
        client = self.experiment
        if context:
            from mlflow.entities import RunTag

            tags = [RunTag(k, v) for k, v in context.items()]
            client.log_batch(self._run_id, tags=tags, **self._batch_kwargs)
        if config is not None:
            self.log_hyperparams(config)
            import yaml

            client.log_text(self._run_id, yaml.safe_dump(config, sort_keys=False), "config.yaml")

    # ----------------------------------------------------------------- Lightning's methods
    @override
    def log_hyperparams(self, params: dict[str, Any] | Namespace, metrics: dict[str, Any] | None = None) -> None:
        """Record ``params`` as the run's params (flattened ``a/b``, values cut to MLflow's length).

        MLflow keeps a param's first value: on a resumed run a param already there with another value
        (say ``trainer/max_epochs`` raised to train longer) is set as a tag of the same name instead.
        """
        flat = {k: str(v)[:_PARAM_CHARS] for k, v in flat_params(params).items()}
        self.hparams.update(flat)
        if not self._writes:
            return
        from mlflow.entities import Param, RunTag

        client = self.experiment
        held = client.get_run(self._run_id).data.params if self._resumed or self._given_run_id else {}
        new = [Param(k, v) for k, v in flat.items() if k not in held]
        changed = [RunTag(k, v) for k, v in flat.items() if k in held and held[k] != v]
        for start in range(0, len(new), _BATCH):
            client.log_batch(self._run_id, params=new[start : start + _BATCH], **self._batch_kwargs)
        if changed:
            client.log_batch(self._run_id, tags=changed, **self._batch_kwargs)
        if metrics:
            self.log_metrics(metrics, 0)

    @override
    def finalize(self, status: str = "success") -> None:
        """Upload the checkpoints due (``log_model=True``) and mark the run FINISHED or FAILED."""
        if not self._writes or not self._opened:
            return
        self._upload_pending()
        state = {"success": "FINISHED", "finished": "FINISHED", "failed": "FAILED"}.get(status, status.upper())
        self.experiment.set_terminated(self._run_id, state)


def _accepted(name: str) -> bool:
    """Whether MLflow accepts ``name`` as a metric's name."""
    if not _ACCEPTED.fullmatch(name):
        return False
    normal = posixpath.normpath(name)
    return normal == name and normal != "." and not normal.startswith(("..", "/"))


def _cleaned(name: str) -> str:
    """``name`` without the characters MLflow refuses and without empty, ``.`` and ``..`` path parts."""
    parts = [part for part in _REFUSED.sub("", name).split("/") if part not in ("", ".", "..")]
    return "/".join(parts) or "metric"


def _client(tracking_uri: str) -> MlflowClient:
    """An ``MlflowClient``; MLflow's refusal of a local file store becomes one line with the ways out."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        return MlflowClient(tracking_uri)
    except MlflowException as err:
        if not tracking_uri.startswith(_LOCAL) or "MLFLOW_ALLOW_FILE_STORE" not in str(err):
            raise
        raise ValueError(
            f"MLFlowLogger: this MLflow refuses the local file store {tracking_uri}: pass tracking_uri= a server "
            "(http://127.0.0.1:5000) or sqlite:///mlflow.db (package mlflow), or set MLFLOW_ALLOW_FILE_STORE=true"
        ) from None
