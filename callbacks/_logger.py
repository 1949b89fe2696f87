"""``Logger``: what TensorBoard and CSV loggers share, with Lightning's logger interface.

A logger is a callback (``is_logger = True``): the trainer hands it the values due for writing
through ``on_log_metrics``, which goes to :meth:`Logger.log_metrics`, the method a Lightning user
calls directly. Lightning's names are all here: ``name``, ``version``, ``root_dir``, ``log_dir``,
``save_dir``, ``experiment``, ``log_hyperparams``, ``log_metrics``, ``log_graph``, ``save``,
``finalize``, ``after_save_checkpoint``, ``group_separator``.

Folders follow Lightning: ``<save_dir>/<name>/version_<N>``, where ``N`` is one more than the
highest existing ``version_N`` under ``<save_dir>/<name>`` when ``version`` is ``None``; an empty
``name`` or a string ``version`` (``""`` for none) leaves that level out. Only rank 0 writes; on other
ranks ``experiment`` is an object whose methods do nothing.
"""

from __future__ import annotations

import functools
import os
import re
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from callbacks.base import Callback
from trainer.common.errors import refuse_url
from trainer.common.rank_zero import launcher_rank

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = [
    "DummyExperiment",
    "DummyLogger",
    "Logger",
    "NoOpExperiment",
    "run_hparams",
]

_VERSION_DIR = re.compile(r"version_(\d+)$")


class DummyExperiment:
    """Lightning's stand-in for ``experiment`` on ranks other than 0: every method call does nothing.

    Item access is answered too (``experiment["loss"].append(...)``), for trackers whose experiment
    is a mapping of series.
    """

    def nop(self, *args: Any, **kwargs: Any) -> None:
        """Do nothing."""

    def __getattr__(self, _: str) -> Any:
        return self.nop

    def __getitem__(self, _: Any) -> DummyExperiment:
        return self

    def __setitem__(self, *args: Any) -> None:
        pass


class NoOpExperiment(DummyExperiment):
    """What geartrain's loggers hand out as ``experiment`` where they do not write (a :class:`DummyExperiment`)."""


class Logger(Callback):
    """Base of the loggers: folder layout, version numbering, prefixes and the rank-0 rule.

    Args:
        save_dir: root folder (``None``: the trainer's ``default_root_dir``, known at ``setup``).
        name: sub-folder of ``save_dir`` for this kind of run; ``""`` or ``None`` for none.
        version: ``None`` for the next free ``version_N``; an int ``N`` for ``version_N``; a string
            for that folder name (``""`` writes straight into ``<save_dir>/<name>``).
        prefix: put before every metric key as ``<prefix>-<key>``.
    """

    is_logger = True
    runs_in_fast_dev_run = False
    #: Between a prefix and a key (Lightning's ``LOGGER_JOIN_CHAR``).
    LOGGER_JOIN_CHAR = "-"
    # Class-level defaults, so that a Lightning-style subclass whose __init__ does not call ours works.
    _save_dir: Path | None = None
    _name = ""
    _version: int | str | None = None
    _prefix = ""
    _writes = True

    def __init__(
        self,
        save_dir: str | os.PathLike[str] | None = None,
        name: str | None = "",
        version: int | str | None = None,
        prefix: str = "",
    ) -> None:
        refuse_url(save_dir, f"{type(self).__name__}(save_dir)")
        self._save_dir = Path(save_dir) if save_dir is not None else None
        self._name = name or ""
        self._version = version
        self._prefix = prefix
        #: False on ranks other than 0: nothing is written there. Known from the launcher's environment
        #: before a trainer sets the logger up (torchrun's RANK, srun's SLURM_PROCID).
        self._writes = launcher_rank() == 0
        #: Hyperparameters recorded so far (flattened).
        self.hparams: dict[str, Any] = {}

    # ----------------------------------------------------------------- where
    @property
    def save_dir(self) -> str:
        """The root folder given (``"."`` until a trainer supplies its ``default_root_dir``)."""
        return str(self._save_dir) if self._save_dir is not None else "."

    @property
    def name(self) -> str:
        """The experiment's sub-folder name (``""`` for none)."""
        return self._name

    @property
    def group_separator(self) -> str:
        """What separates a metric's group from its name (``"train/loss"``)."""
        return "/"

    @property
    def root_dir(self) -> str | None:
        """``<save_dir>/<name>``: the folder holding every version of this experiment (``None`` when a
        subclass's ``save_dir`` is ``None``: it keeps no local files)."""
        save_dir = self.save_dir
        if save_dir is None:
            return None
        return os.path.join(save_dir, self.name) if self.name else save_dir

    @property
    def version(self) -> int | str:
        """This run's version: the next free number under :attr:`root_dir`, worked out once.

        Until a trainer supplies ``save_dir`` the number is only looked up, not kept: it is chosen in
        the folder the files will really go to.
        """
        if self._version is None:
            if self._save_dir is None:
                return self._next_version()
            self._version = self._next_version()
        return self._version

    @property
    def log_dir(self) -> str | None:
        """The folder this run's files go into, ``<root_dir>/<version folder>`` (a ``str``, as Lightning's;
        ``None`` without a local folder)."""
        root = self.root_dir
        if root is None:
            return None
        version = self.version
        folder = version if isinstance(version, str) else f"version_{version}"
        return os.path.join(root, folder) if folder else root

    def _next_version(self) -> int:
        root = self.root_dir
        if root is None:
            return 0
        try:
            found = [int(m.group(1)) for p in os.listdir(root) if (m := _VERSION_DIR.match(p))]
        except OSError:
            found = []
        return max(found) + 1 if found else 0

    def __getstate__(self) -> dict[str, Any]:
        # A copy sent to worker processes carries the version this process chose, so the caller's
        # logger and the one that writes name the same folder.
        if self._version is None and self._save_dir is not None:
            self._version = self._next_version()
        return self.__dict__.copy()

    # ----------------------------------------------------------------- what
    def _with_prefix(self, metrics: Mapping[str, Any]) -> dict[str, Any]:
        if not self._prefix:
            return dict(metrics)
        return {f"{self._prefix}{self.LOGGER_JOIN_CHAR}{k}": v for k, v in metrics.items()}

    def log_metrics(self, metrics: Mapping[str, float | torch.Tensor], step: int | None = None) -> None:
        """Write ``metrics`` at ``step`` (rank 0 only). A logger of your own overrides this."""
        raise NotImplementedError(f"{type(self).__name__} must implement log_metrics(metrics, step=None)")

    def log_hyperparams(self, params: dict[str, Any] | Namespace, metrics: dict[str, Any] | None = None) -> None:
        """Record hyperparameters (rank 0 only); ``metrics`` are written with them at step 0."""
        raise NotImplementedError(f"{type(self).__name__} must implement log_hyperparams(params, metrics=None)")

    def log_graph(self, model: torch.nn.Module, input_array: torch.Tensor | None = None) -> None:
        """Record the model's graph where the format has one (not in CSV: nothing happens)."""

    def save(self) -> None:
        """Write what is buffered to disk."""

    def finalize(self, status: str) -> None:
        """The run ended with ``status`` (``"success"``, ``"failed"``): write everything out."""
        self.save()

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """Called by :class:`~callbacks.ModelCheckpoint` after each checkpoint it writes."""

    # ----------------------------------------------------------------- as a callback
    @override
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if self._save_dir is None:
            self._save_dir = Path(trainer.default_root_dir)
        self._writes = trainer.is_global_zero
        if self._writes and type(self).version is Logger.version:
            # A folder logger picks its version_N now, before any logger of the run makes its folder: two
            # loggers given one save_dir and name (TensorBoard and CSV) share version_0, as in Lightning.
            _ = self.version
        # Lightning's trainer hands the hyperparameters to its loggers at every entry point, so a
        # validate-, test- or predict-only run has its hparams.yaml too. After a fit that recorded
        # them, they are not written again (TensorBoard would get a second hparams session).
        if stage != "fit" and not getattr(self, "hparams", None):
            self._log_module_hparams(pl_module, trainer)

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        # As Lightning's trainer does: the run's hyperparameters go to every logger when fitting starts.
        self._log_module_hparams(pl_module, trainer)

    def _log_module_hparams(self, module: TrainModule, trainer: Trainer | None = None) -> None:
        """``log_hyperparams(...)`` of :func:`run_hparams` on rank 0, unless there are none."""
        hparams = run_hparams(module, trainer)
        if self._writes and hparams:
            self.log_hyperparams(hparams)

    def on_log_metrics(
        self, trainer: Trainer, pl_module: TrainModule, metrics: dict[str, torch.Tensor], step: int
    ) -> None:
        """geartrain's hook for loggers (``callbacks.base.LOG_METRICS_HOOK``): a row is due; write it."""
        # On every rank, as Lightning's trainer calls it (geartrain's own loggers write on rank 0 only; a
        # logger of the user's own sees each rank's values). By keyword: a subclass reading them by name sees the same.
        self.log_metrics(metrics={key: float(value) for key, value in metrics.items()}, step=step)

    @override
    def teardown(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if self._writes:
            self.finalize("success")

    @override
    def on_exception(self, trainer: Trainer, pl_module: TrainModule, exception: BaseException) -> None:
        if self._writes:
            self.finalize("failed")


class DummyLogger(Logger):
    """The logger a ``fast_dev_run`` puts where the run's loggers were (Lightning's ``DummyLogger``).

    Lightning's rule: a quick check run writes no logs, yet code that logs through ``self.logger``
    (``self.logger.experiment.add_image(...)``, ``self.logger.log_metrics(...)``,
    ``self.logger.log_text(...)`` written for a ``WandbLogger``) still runs. Every method of any of
    geartrain's loggers does nothing here, ``experiment`` takes any call, ``name`` and ``version`` are
    ``""``. Unlike Lightning's, a name no logger has (``self.logger.foo``) is an ``AttributeError``: the
    trainer asks its callbacks what they are by their attributes (``best_model_path``, ``dirpath``...).
    """

    runs_in_fast_dev_run = True

    def __init__(self) -> None:
        super().__init__()
        self._writes = False
        self._experiment = NoOpExperiment()

    @property
    def experiment(self) -> NoOpExperiment:
        """An object whose every method does nothing."""
        return self._experiment

    @property
    @override
    def name(self) -> str:
        return ""

    @property
    @override
    def version(self) -> str:
        return ""

    @override
    def log_metrics(self, *args: Any, **kwargs: Any) -> None:
        """Does nothing."""

    @override
    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        """Does nothing."""

    @override
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        self._writes = False  # nothing to write, on any rank

    def __getitem__(self, index: int) -> DummyLogger:
        """``self.logger[0]`` is this logger (Lightning code written for a list of loggers)."""
        return self

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_") and name in _logger_methods():
            return _nop
        raise AttributeError(f"'DummyLogger' object has no attribute {name!r} (no logger of geartrain's has it)")


def _nop(*args: Any, **kwargs: Any) -> None:
    """What a logger's method does on a :class:`DummyLogger`: nothing."""


@functools.cache
def _logger_methods() -> frozenset[str]:
    """The public methods of geartrain's loggers (read once, when a :class:`DummyLogger` is first asked)."""
    import inspect

    import callbacks

    names: set[str] = set()
    for cls_name in ("CSVLogger", "TensorBoardLogger", "MLFlowLogger", "WandbLogger", "CometLogger", "LitLogger"):
        cls = getattr(callbacks, cls_name)
        names.update(n for n, member in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_"))
    return frozenset(names - set(dir(Callback)))


def run_hparams(module: Any, trainer: Any = None) -> dict[str, Any]:
    """The hyperparameters Lightning's trainer hands its loggers: the module's merged with its data module's.

    As in Lightning, these are ``hparams_initial``, the values ``save_hyperparameters`` recorded (a
    later ``self.hparams.x = ...`` is not logged), without LightningCLI's ``_class_path``. A side that
    said ``save_hyperparameters(logger=False)`` is left out. A key both sides hold with different
    values (another type, another tensor object, or unequal) is a ``RuntimeError``, as in Lightning:
    the logged run would misstate one of them.
    """
    module_hparams = _initial_hparams(module) if getattr(module, "_log_hyperparams", True) else None
    datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
    data_hparams = None
    if datamodule is not None and getattr(datamodule, "_log_hyperparams", True):
        data_hparams = _initial_hparams(datamodule)
    if module_hparams is None or data_hparams is None:
        chosen = module_hparams if module_hparams is not None else (data_hparams or {})
        return {k: v for k, v in chosen.items() if k != "_class_path"}
    clashes = [
        key
        for key in module_hparams.keys() & data_hparams.keys()
        if key != "_class_path" and _differ(module_hparams[key], data_hparams[key])
    ]
    if clashes:
        raise RuntimeError(
            f"Error while merging hparams: the keys {clashes} are present in both the LightningModule's and "
            "LightningDataModule's hparams but have different values; rename one of them, or call "
            "save_hyperparameters(logger=False) on one side"
        )
    return {k: v for k, v in {**module_hparams, **data_hparams}.items() if k != "_class_path"}


def _initial_hparams(owner: Any) -> dict[str, Any]:
    """``owner.hparams_initial`` as a dict (an object without one: its ``hparams``)."""
    initial = getattr(owner, "hparams_initial", None)
    if initial is None:
        initial = getattr(owner, "hparams", None)
    return dict(initial or {})


def _differ(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return True
    if isinstance(a, torch.Tensor):
        return a is not b
    try:
        return bool(a != b)
    except Exception:  # an object whose comparison does not give one truth value
        return True


def flat_params(params: dict[str, Any] | Namespace, separator: str = "/") -> dict[str, Any]:
    """Hyperparameters as ``{"a/b": value}`` with values TensorBoard and YAML accept."""
    tree = vars(params) if isinstance(params, Namespace) else dict(params)
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Namespace):
            value = vars(value)
        if isinstance(value, Mapping):
            out.update({f"{key}{separator}{k}": v for k, v in flat_params(dict(value), separator).items()})
        elif isinstance(value, (bool, int, float, str)):
            out[str(key)] = value
        elif isinstance(value, torch.Tensor) and value.numel() == 1:
            out[str(key)] = value.item()
        elif value is None:
            out[str(key)] = "None"
        else:
            out[str(key)] = str(value)
    return out
