"""``WandbLogger``: a Weights & Biases run, online or offline (rank 0 only)."""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from argparse import Namespace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from typing_extensions import override

from callbacks._tracker import CheckpointFile, TrackerLogger, import_tracker
from callbacks._wandb_history import STEP_KEY, history_rows, last_steps_in, whole_lines
from trainer.common.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["STEP_KEY", "WandbLogger", "history_rows"]

#: The name of the logger's own journal of rows, beside wandb's files.
JOURNAL = "geartrain-rows"


class WandbLogger(TrackerLogger):
    """Log to `Weights & Biases <https://wandb.ai>`_: Lightning's ``WandbLogger``, as a callback.

    Needs ``pip install 'geartrain[wandb]'``. Without an account or network, ``offline=True`` (or
    ``WANDB_MODE=offline``) writes the run under ``<save_dir>/wandb`` for ``wandb sync`` later.

    Every logging call is one row of the run's history with the metrics and ``trainer/global_step``,
    the x-axis of every metric.

    Args:
        name: the run's display name (under the ``geartrain`` command: the run directory).
        save_dir: folder of wandb's files (``<save_dir>/wandb``); made absolute when built. ``None``
            (and no ``dir``): the trainer's ``default_root_dir``, the run directory under ``geartrain``.
        version: the run's id: a run with that id is resumed (created if missing).
        offline: write locally only (cannot be combined with ``log_model``).
        dir: the same as ``save_dir`` (used when ``save_dir`` is ``None``).
        id: the same as ``version``.
        anonymous: ``True`` logs anonymously.
        project: the project (``None``: ``WANDB_PROJECT``, else ``"lightning_logs"``).
        log_model: upload checkpoints of :class:`~callbacks.ModelCheckpoint` as ``model`` artifacts
            with aliases ``latest``/``best``: ``"all"`` after every save, ``True`` when fitting ends
            successfully, ``False`` never.
        experiment: a ``wandb.Run`` to log to instead of starting one.
        prefix: written before every metric key as ``<prefix>-<key>``.
        checkpoint_name: the artifact's name (default ``model-<run id>``).
        add_file_policy: ``"mutable"`` copies a checkpoint before upload, ``"immutable"`` does not.
        **kwargs: passed to ``wandb.init`` (``entity``, ``group``, ``tags``, ``config``, ``mode``...).

    Under the ``geartrain`` command (``logger=wandb``) the run's config holds the resolved config,
    and ``geartrain.run_dir``/``geartrain.checkpoint_dir`` say where its files are.
    """

    def __init__(
        self,
        name: str | None = None,
        save_dir: str | os.PathLike[str] | None = ".",
        version: str | None = None,
        offline: bool = False,
        dir: str | os.PathLike[str] | None = None,
        id: str | None = None,
        anonymous: bool | None = None,
        project: str | None = None,
        log_model: Literal["all"] | bool = False,
        experiment: Any = None,
        prefix: str = "",
        checkpoint_name: str | None = None,
        add_file_policy: Literal["mutable", "immutable"] = "mutable",
        **kwargs: Any,
    ) -> None:
        import_tracker("wandb", "wandb", "WandbLogger")
        if offline and log_model:
            raise ConfigError(
                f"Providing log_model={log_model} and offline={offline} is an invalid configuration since model "
                "checkpoints cannot be uploaded in offline mode. Hint: Set `offline=False` to log your model."
            )
        super().__init__(log_model, prefix)
        folder = save_dir if save_dir is not None else dir
        self._offline = offline
        self._experiment = experiment
        self._checkpoint_name = checkpoint_name
        self.add_file_policy = add_file_policy
        self._project = project or os.environ.get("WANDB_PROJECT", "lightning_logs")
        self._wandb_dir = None if folder is None else os.path.abspath(os.fspath(folder))
        self._run_name = name
        self._run_id = version or id
        self._given_run_id = self._run_id
        #: Folders of earlier sessions of a resumed run (from the checkpoint), read for the steps written.
        self._earlier_dirs: list[str] = []
        #: The journal of rows logged with a step (see :meth:`_last_steps`), open while the run is.
        self._journal: Any = None
        #: A copy for another process (``ddp_spawn``) of a logger whose run was open: the run to attach
        #: to, and the process that holds it (wandb allows one writer per run id: resuming it fails).
        self._attach_id: str | None = None
        self._attach_pid: int | None = None
        #: Where wandb keeps the run's files (see :meth:`_files_root`), once the run is open.
        self._root_seen: str | None = None
        self._wandb_init: dict[str, Any] = {
            "name": name,
            "project": self._project,
            "dir": self._wandb_dir,
            "anonymous": "allow" if anonymous else None,
            **kwargs,
        }

    # ----------------------------------------------------------------- Lightning's properties
    @property
    @override
    def save_dir(self) -> str | None:  # type: ignore[override]
        """The folder holding ``wandb/`` (absolute)."""
        return self._wandb_dir

    @property
    @override
    def name(self) -> str | None:  # type: ignore[override]
        """The project (Lightning's meaning; the run's own name is ``experiment.name``)."""
        return self._project

    @property
    @override
    def version(self) -> str | None:  # type: ignore[override]
        """The run's id (the given one until the run starts; starting it is not forced)."""
        return self._experiment.id if self._experiment is not None else self._run_id

    @override
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if self._wandb_dir is None:
            self._wandb_dir = os.path.abspath(trainer.default_root_dir)
            self._wandb_init["dir"] = self._wandb_dir

    @override
    def state_dict(self) -> dict[str, Any]:
        # Where this run's files are: a resume from another run directory looks there too.
        state = super().state_dict()
        return {**state, "dir": self._files_root()} if state else state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        if self._resumed and state_dict.get("dir"):
            self._earlier_dirs.append(str(state_dict["dir"]))

    @override
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if self._experiment is not None:
            state["_run_id"] = self._experiment.id  # the copy resumes the run by its id
            # ...or, while this process holds it open, attaches to it (Lightning's way under ddp_spawn).
            state["_attach_id"] = getattr(self._experiment, "_attach_id", None)
            state["_attach_pid"] = os.getpid()
        state["_journal"] = None
        return state

    # ----------------------------------------------------------------- the run
    @override
    def _open_run(self) -> Any:
        import wandb

        if self._attach_id is not None and self._attach_pid != os.getpid() and hasattr(wandb, "_attach"):
            # The process that pickled this logger holds the run: write through it.
            return wandb._attach(attach_id=self._attach_id)
        init = dict(self._wandb_init)
        if self._offline:
            init["mode"] = "offline"
        if self._run_id is not None:
            init["id"], init["resume"] = self._run_id, "allow"
        if init["name"] is None:
            init["name"] = self._default_run_name()
        if init["dir"] is not None:
            # A folder that cannot be made is wandb's to handle: it warns and falls back to the temporary folder.
            with contextlib.suppress(OSError):
                os.makedirs(init["dir"], exist_ok=True)
        if wandb.run is not None and self._run_id is None:
            # As Lightning's: a run the script already started is the one this logger writes to.
            warnings.warn(
                "There is a wandb run already in progress and newly created instances of `WandbLogger` will reuse "
                "this run. If this is not desired, call `wandb.finish()` before instantiating `WandbLogger`.",
                UserWarning,
                stacklevel=3,
            )
            run = wandb.run
        else:
            run = wandb.init(**{k: v for k, v in init.items() if v is not None})
        self._run_id = run.id
        run_dir = getattr(run, "dir", None)  # <root>/wandb/<run folder>/files (a stand-in run may have none)
        parents = Path(run_dir).parents if isinstance(run_dir, str) else ()
        self._root_seen = str(parents[2]) if len(parents) > 2 else None
        define_metric = getattr(run, "define_metric", None)  # a stand-in run may lack it (Lightning checks too)
        if define_metric is None:
            pass
        elif self._wandb_init.get("sync_tensorboard"):
            # wandb mirrors TensorBoard's event files: TensorBoard's global_step is the x-axis.
            define_metric("*", step_metric="global_step")
        else:
            define_metric(STEP_KEY)
            define_metric("*", step_metric=STEP_KEY, step_sync=True)
        return run

    @override
    def _write_metrics(self, metrics: dict[str, float], step: int | None) -> None:
        if step is None or self._wandb_init.get("sync_tensorboard"):  # no trainer/global_step beside TensorBoard's
            self.experiment.log(metrics)
            return
        self.experiment.log({**metrics, STEP_KEY: step})
        if self._journal is None:
            path = Path(self._files_root() or ".", "wandb", f"{JOURNAL}-{self.experiment.id}.jsonl")
            path.parent.mkdir(parents=True, exist_ok=True)
            self._journal = path.open("a")
        # Reaches the operating system at once: a killed process loses none of it (a machine crash may).
        self._journal.write(json.dumps([step, metrics]) + "\n")
        self._journal.flush()

    @override
    def _last_steps(self) -> dict[str, int]:
        """What earlier sessions of the run logged, made whole in the run.

        wandb writes its local file every ``x_transaction_log_flush_interval`` seconds (15 by
        default) from a helper process that dies with the training process: a crash (``kill -9``)
        loses the rows it held, including rows of steps before the checkpoint, which the resumed
        fit does not compute again. So the logger also appends each row to a journal of its own,
        ``<save_dir>/wandb/geartrain-rows-<run id>.jsonl`` (one short line per logging call). At
        resume, the rows of the journal that wandb's files lack are logged again, and the resumed
        fit skips every ``(key, step)`` logged before.
        """
        run = self.experiment
        roots = dict.fromkeys(d for d in (*self._earlier_dirs, self._wandb_dir, self._files_root()) if d is not None)
        current = Path(run.dir).parent.resolve()
        folders = {f.resolve() for root in roots for f in Path(root, "wandb").glob(f"*run-*-{run.id}")} - {current}
        last = last_steps_in([folder / f"run-{run.id}.wandb" for folder in sorted(folders)])
        journals = {Path(root, "wandb", f"{JOURNAL}-{run.id}.jsonl").resolve() for root in roots}
        rows = [json.loads(line) for path in sorted(journals) if path.is_file() for line in whole_lines(path)]
        logged = dict(last)
        for step, row in rows:
            missing = {k: v for k, v in row.items() if step > last.get(k, -1)}
            if missing:
                self._write_metrics(missing, step)
            for key in row:
                logged[key] = max(logged.get(key, -1), step)
        return logged

    def _files_root(self) -> str | None:
        """The folder holding the run's ``wandb/`` folder: ``save_dir``, unless wandb could not write there
        and fell back to the temporary folder (as it does, with a warning)."""
        return self._root_seen or self._wandb_dir

    @override
    def _upload_checkpoint(self, checkpoint: CheckpointFile, checkpoint_callback: Any) -> None:
        import wandb

        run = self.experiment
        name = self._checkpoint_name or f"model-{run.id}"
        artifact = wandb.Artifact(name=name, type="model", metadata=checkpoint.metadata(checkpoint_callback))
        artifact.add_file(checkpoint.path, name="model.ckpt", policy=self.add_file_policy)
        run.log_artifact(artifact, aliases=checkpoint.aliases)

    @override
    def _record_run_context(self, context: dict[str, str], config: dict[str, Any] | None) -> None:
        if config is not None:
            self.log_hyperparams(config)
        if context:
            self.experiment.config.update(context, allow_val_change=True)

    # ----------------------------------------------------------------- Lightning's methods
    @override
    def log_hyperparams(self, params: dict[str, Any] | Namespace, metrics: dict[str, Any] | None = None) -> None:
        """Merge ``params`` into the run's config (nested as given; values that are not JSON become text)."""
        tree = vars(params) if isinstance(params, Namespace) else dict(params)
        plain = json.loads(json.dumps(tree, default=str))
        self.hparams.update(plain)
        if not self._writes:
            return
        self.experiment.config.update(plain, allow_val_change=True)
        if metrics:
            self.log_metrics(metrics, 0)

    # ----------------------------------------------------------------- media and artifacts (Lightning's)
    def log_table(
        self,
        key: str,
        columns: list[str | int] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
    ) -> None:
        """Log a ``wandb.Table`` given by ``columns`` and ``data``, or by a pandas ``dataframe``."""
        import wandb

        if self._writes:
            self._log_objects({key: wandb.Table(columns=columns, data=data, dataframe=dataframe)}, step)

    def log_text(
        self,
        key: str,
        columns: list[str | int] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
    ) -> None:
        """Log text as a table (``columns`` and ``data``, or a ``dataframe``)."""
        self.log_table(key, columns, data, dataframe, step)

    def log_image(self, key: str, images: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Log ``wandb.Image`` s; each keyword is a list with one value per image (``caption``, ``masks``...)."""
        self._log_media("Image", "images", key, images, step, kwargs)

    def log_audio(self, key: str, audios: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Log ``wandb.Audio`` s; each keyword is a list with one value per clip (``caption``, ``sample_rate``...)."""
        self._log_media("Audio", "audios", key, audios, step, kwargs)

    def log_video(self, key: str, videos: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Log ``wandb.Video`` s; each keyword is a list with one value per video (``caption``, ``fps``...)."""
        self._log_media("Video", "videos", key, videos, step, kwargs)

    def _log_media(
        self, kind: str, what: str, key: str, items: list[Any], step: int | None, kwargs: dict[str, Any]
    ) -> None:
        if not isinstance(items, list):
            raise TypeError(f'Expected a list as "{what}", found {type(items)}')
        for name, values in kwargs.items():
            if len(values) != len(items):
                raise ValueError(f"Expected {len(items)} items but only found {len(values)} for {name}")
        if not self._writes:
            return
        import wandb

        make = getattr(wandb, kind)
        self._log_objects(
            {key: [make(item, **{k: v[i] for k, v in kwargs.items()}) for i, item in enumerate(items)]}, step
        )

    def _log_objects(self, values: dict[str, Any], step: int | None) -> None:
        """Log wandb objects (tables, media) as they are, with the step as the x-axis when given."""
        values = self._with_prefix(values)
        self.experiment.log(values if step is None else {**values, STEP_KEY: step})

    @staticmethod
    def download_artifact(
        artifact: str,
        save_dir: str | os.PathLike[str] | None = None,
        artifact_type: str | None = None,
        use_artifact: bool | None = True,
    ) -> str:
        """Download ``artifact`` (``"entity/project/name:version"``) into ``save_dir``; return its folder.

        With a run active and ``use_artifact``, the run records that it used the artifact.
        """
        import wandb

        if wandb.run is not None and use_artifact:
            found = wandb.run.use_artifact(artifact)
        else:
            found = wandb.Api().artifact(artifact, type=artifact_type)
        folder: str = found.download(root=None if save_dir is None else os.fspath(save_dir))
        return folder

    def use_artifact(self, artifact: str, artifact_type: str | None = None) -> Any:
        """Record that this run uses ``artifact``; return the ``wandb.Artifact``."""
        return self.experiment.use_artifact(artifact, type=artifact_type)

    def watch(
        self, model: torch.nn.Module, log: str | None = "gradients", log_freq: int = 100, log_graph: bool = True
    ) -> None:
        """``wandb.watch`` the model: gradient (and parameter) histograms every ``log_freq`` steps."""
        self.experiment.watch(model, log=log, log_freq=log_freq, log_graph=log_graph)

    @override
    def finalize(self, status: str) -> None:
        """Upload the checkpoints due (``log_model=True``) after a successful fit; the run stays open.

        wandb finishes the run when the process exits; call ``logger.experiment.finish()`` to end it sooner.
        """
        if self._writes and status == "success" and self._experiment is not None:
            self._upload_pending()
