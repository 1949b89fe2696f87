"""``CometLogger``: a Comet experiment, online or offline (rank 0 only), through the ``comet_ml`` package.

Lightning 2.6's ``CometLogger``. The experiment is started with ``comet_ml.start(...)`` when the
logger is built on rank 0 (on another rank, or in a copy sent to a worker, on first use of
``experiment``), configured by a ``comet_ml.ExperimentConfig`` of the keyword arguments given.
Values go through the methods ``comet_ml`` keeps for its Lightning integration
(``__internal_api__log_metrics__``, ``__internal_api__log_parameters__``,
``__internal_api__set_model_graph__``), as Lightning's logger calls them: Comet files them as
coming from Lightning. ``comet_ml`` is imported when the logger is built, never by ``import callbacks``.
"""

from __future__ import annotations

import logging
import os
from argparse import Namespace
from collections.abc import Mapping
from typing import Any, Literal

import torch
from typing_extensions import override

from callbacks._tracker import RemoteLogger, import_client

__all__ = ["FRAMEWORK_NAME", "CometLogger"]

#: What Comet records as the framework the values come from (Lightning's name for itself).
FRAMEWORK_NAME = "pytorch-lightning"
_REQUIREMENT = "comet-ml>=3.44.4"
_log = logging.getLogger(__name__)

#: Lightning 1.x's argument names -> the ones that replaced them (each still accepted, with a warning).
_RENAMED = {"experiment_name": "name", "project_name": "project", "offline": "online", "save_dir": "offline_directory"}


class CometLogger(RemoteLogger):
    """Track parameters, metrics and the model's graph with `Comet <https://www.comet.com>`_ (Lightning's ``CometLogger``).

    Needs ``pip install comet-ml``. Online, Comet takes its API key from ``api_key``, ``comet login``
    or ``COMET_API_KEY``; ``online=False`` writes the experiment to ``offline_directory``.

    Args:
        api_key: Comet API key.
        workspace: the workspace (default: yours).
        project: the project (default: Comet's ``Uncategorized``).
        experiment_key: the key of an experiment to continue, or of the new one (32 to 50 alphanumerics).
        mode: ``"get_or_create"``, ``"get"`` (continue ``experiment_key``) or ``"create"`` (always a new one).
        online: ``False`` writes an offline experiment.
        prefix: passed to Comet with every metric (Comet puts it before the name).
        **kwargs: given to ``comet_ml.ExperimentConfig`` (``name``, ``log_code``, ``offline_directory``,
            ...). Lightning 1.x's ``experiment_name``, ``project_name``, ``offline`` and ``save_dir``
            are still accepted with a warning (``offline`` is read as ``online``, as Lightning 2.6 does).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        workspace: str | None = None,
        project: str | None = None,
        experiment_key: str | None = None,
        mode: Literal["get_or_create", "get", "create"] | None = None,
        online: bool | None = None,
        prefix: str | None = None,
        **kwargs: Any,
    ) -> None:
        import_client("comet_ml", _REQUIREMENT)
        super().__init__()
        project, online = self._renamed(kwargs, project, online)
        self._api_key = api_key
        self._workspace = workspace
        self._mode = mode
        self._online = online
        self._project_name = project
        self._experiment_key = experiment_key
        self._prefix = prefix  # type: ignore[assignment]
        self._kwargs: dict[str, Any] = kwargs
        # Read by comet_ml when it is first imported: no automatic logging of its own beside this logger's.
        os.environ["COMET_DISABLE_AUTO_LOGGING"] = "1"
        import comet_ml

        config = dict(kwargs)
        if online is False:
            config["disabled"] = True
        self._comet_config = comet_ml.ExperimentConfig(**config)
        if self._writes:  # only the global rank 0 process (the launcher says which) starts the experiment
            self._experiment = self._open_run()

    @staticmethod
    def _renamed(kwargs: dict[str, Any], project: str | None, online: bool | None) -> tuple[str | None, bool | None]:
        """Map Lightning 1.x's argument names in ``kwargs`` to today's, warning as Lightning does."""
        for old, new in _RENAMED.items():
            if old not in kwargs:
                continue
            _log.warning(f"The parameter `{old}` is deprecated, please use `{new}` instead.")
            if old == "project_name":
                if project is None:
                    project = kwargs.pop(old)
                    continue
            elif old == "offline":
                if online is None:
                    online = kwargs.pop(old)
                    continue
            elif new not in kwargs:
                kwargs[new] = kwargs.pop(old)
                continue
            _log.warning(f"You specified both `{old}` and `{new}` parameters, please use `{new}` only")
        return project, online

    @override
    def _open_run(self) -> Any:
        import comet_ml

        experiment = comet_ml.start(
            api_key=self._api_key,
            workspace=self._workspace,
            project=self._project_name,
            experiment_key=self._experiment_key,
            mode=self._mode,
            online=self._online,
            experiment_config=self._comet_config,
        )
        if experiment is None:
            raise comet_ml.exceptions.ExperimentNotFound("Failed to create Comet experiment.")
        self._experiment_key = experiment.get_key()
        self._project_name = experiment.project_name
        experiment.log_other("Created from", FRAMEWORK_NAME)
        return experiment

    # ----------------------------------------------------------------- Lightning's properties

    @property
    @override
    def save_dir(self) -> str | None:  # type: ignore[override]
        """The offline experiment's folder (``offline_directory``; ``None`` when not set)."""
        folder = getattr(self._comet_config, "offline_directory", None)
        return folder if folder is None or isinstance(folder, str) else os.fspath(folder)

    @property
    @override
    def name(self) -> str | None:  # type: ignore[override]
        """The project's name."""
        return self._project_name

    @property
    @override
    def version(self) -> str | None:  # type: ignore[override]
        """The experiment's key (``None`` while no experiment exists here: asking does not start one)."""
        return None if self._experiment is None else self._experiment.get_key()

    # ----------------------------------------------------------------- Lightning's logger methods
    @override
    def log_hyperparams(self, params: dict[str, Any] | Namespace, metrics: dict[str, Any] | None = None) -> None:
        """Record ``params`` (nested dicts are flattened by Comet)."""
        tree = vars(params) if isinstance(params, Namespace) else params
        self.hparams.update(tree)
        if not self._writes:
            return
        self.experiment.__internal_api__log_parameters__(
            parameters=tree, framework=FRAMEWORK_NAME, flatten_nested=True, source="manual"
        )

    @override
    def log_metrics(self, metrics: Mapping[str, float | torch.Tensor], step: int | None = None) -> None:
        """Send ``metrics`` at ``step``; an ``epoch`` key becomes Comet's epoch. ``metrics`` is not changed."""
        if not self._writes:
            return
        values = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}
        epoch = values.pop("epoch", None)
        self.experiment.__internal_api__log_metrics__(
            values, step=step, epoch=epoch, prefix=self._prefix, framework=FRAMEWORK_NAME
        )

    @override
    def log_graph(self, model: torch.nn.Module, input_array: torch.Tensor | None = None) -> None:
        """Record the model's structure (only once an experiment exists)."""
        if self._writes and self._experiment is not None:
            self._experiment.__internal_api__set_model_graph__(graph=model, framework=FRAMEWORK_NAME)

    @override
    def finalize(self, status: str) -> None:
        """Send what is buffered; the experiment is not ended, so it can be used after training.

        Call ``logger.experiment.end()`` to end it.
        """
        if self._writes and self._experiment is not None:
            self._experiment.flush()

    @override
    def __getstate__(self) -> dict[str, Any]:
        """A copy for another process: the experiment's key instead of the experiment (a live connection)."""
        state = super().__getstate__()
        if self._experiment is not None:
            state["_experiment_key"] = self._experiment.get_key()
        return state
