"""Metric routing: from ``self.log`` to ``callback_metrics``, the progress bar and the loggers.

``TrainModule.log`` lands in :meth:`MetricRouter.log`, which records the value in the store of the
stage in progress (a :class:`~trainer.metrics.store.MetricStore`, set by the loops with :meth:`logging`).
Values become visible to callbacks through :attr:`MetricRouter.callback_metrics` and reach the loggers
(callbacks overriding ``on_log_metrics``) through :meth:`MetricRouter.emit`, on rank 0's schedule.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from trainer.common.errors import LogRefusedError, MisconfigurationException, UserError
from trainer.common.tree import batch_size_of
from trainer.metrics.state import load_store_state, store_state
from trainer.metrics.store import MetricStore, _Entry

__all__ = ["EPOCH_DEFAULTS", "NO_LOG_HOOKS", "STEP_DEFAULTS", "MetricRouter", "PlainLog", "UnknownBatchSize"]

#: ``(on_step, on_epoch)`` defaults of ``self.log`` in training steps ...
STEP_DEFAULTS = (True, False)
#: ... and in epoch-end hooks and evaluation.
EPOCH_DEFAULTS = (False, True)

#: The hooks in which ``self.log`` is refused, Lightning's (its ``_FxValidator``): the set-up and
#: tear-down, the loaders, the batch transfer, the model-mode and checkpoint hooks, the ends of the
#: runs, ``lr_scheduler_step``, ``on_exception`` and all of ``predict``. The hook dispatch runs them
#: inside :meth:`MetricRouter.refusing`; the hooks the loops call directly are wrapped where called.
NO_LOG_HOOKS = frozenset(
    {
        "setup", "teardown", "prepare_data", "configure_model", "configure_sharded_model", "configure_callbacks",
        "configure_optimizers", "train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader",
        "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer", "lr_scheduler_step",
        "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end", "on_train_end",
        "on_validation_end", "on_test_end", "on_predict_start", "on_predict_end", "on_predict_epoch_start",
        "on_predict_epoch_end", "on_predict_batch_start", "on_predict_batch_end", "predict_step", "on_exception",
        "state_dict", "load_state_dict", "on_save_checkpoint", "on_load_checkpoint",
        "on_validation_model_zero_grad", "on_validation_model_eval", "on_validation_model_train",
        "on_test_model_eval", "on_test_model_train", "on_predict_model_eval",
    }
)  # fmt: skip

#: What a plain per-step ``self.log(name, tensor)`` does, worked out by its first call (see
#: :attr:`MetricRouter.plain`): the entry, the store's ``pending_step``, ``callback_metrics``,
#: ``progress_bar_metrics`` if the name is shown there (else None), and the dtype the value had.
PlainLog = tuple[
    _Entry, dict[str, torch.Tensor], dict[str, torch.Tensor], "dict[str, torch.Tensor] | None", torch.dtype
]


class UnknownBatchSize:
    """A current batch whose size nobody knows (a step that fetches its own batches): ``self.log`` without
    ``batch_size=`` raises ``MisconfigurationException(message)`` instead of guessing, as Lightning."""

    def __init__(self, message: str) -> None:
        self.message = message


class MetricRouter:
    """Where logged values go, and the latest of them.

    Args:
        emit_to_loggers: calls the loggers' ``on_log_metrics(metrics, step)`` (the hook dispatch);
            its third argument says whether the row gets the ``epoch`` (all but evaluation steps' rows).
        sanity_checking: tells whether the sanity check is running (its values reach no logger).
    """

    def __init__(
        self,
        emit_to_loggers: Callable[[dict[str, torch.Tensor], int, bool], None],
        sanity_checking: Callable[[], bool],
    ) -> None:
        self._emit_to_loggers = emit_to_loggers
        self._sanity_checking = sanity_checking
        #: Latest value of everything logged (tensors), read by checkpointing and early stopping.
        self.callback_metrics: dict[str, torch.Tensor] = {}
        #: Latest values handed to the loggers.
        self.logged_metrics: dict[str, torch.Tensor] = {}
        #: Latest values logged with ``prog_bar=True``.
        self.progress_bar_metrics: dict[str, torch.Tensor] = {}
        #: ``callback_metrics`` keys updated in the training epoch in progress.
        self.epoch_keys: set[str] = set()
        #: The batch whose step is running (``self.log`` infers epoch-mean weights from it).
        self.current_batch: Any = None
        #: ``"/dataloader_idx_N"`` while evaluating loader N of several (Lightning's key suffix), else "".
        self.dataloader_suffix = ""
        #: Keys logged with ``add_dataloader_idx=False`` while a loader of several ran, with that
        #: loader's suffix: an evaluation's results give them to that loader only, as Lightning's.
        self.loader_keys: dict[str, str] = {}
        self.store: MetricStore | None = None
        #: Evaluation steps whose values went to the loggers, by (stage, loader): their x-axis.
        self.eval_steps: dict[tuple[str, int], int] = {}
        #: The hook running inside :meth:`refusing` (named in the error of a ``self.log`` there).
        self.refused_hook = ""
        #: A ``predict`` runs (set by its entry point): a refusal there is said in Lightning's predict words.
        self.predicting = False
        self.defaults: tuple[bool, bool] = STEP_DEFAULTS
        #: Inside an evaluation loop: a step's values reach the progress bar and the loggers but not
        #: ``callback_metrics`` (Lightning's rule: callbacks see an evaluation's epoch values only).
        self.evaluating = False
        self._batch_size_cache: tuple[Any, int] = (None, 1)
        #: Keys logged with ``logger=False``: in ``callback_metrics``, never handed to the loggers.
        self.no_logger_keys: set[str] = set()
        #: The store of the training epoch in progress (its running sums go into checkpoints).
        self.train_store: MetricStore | None = None
        #: The training epoch's aggregates restored from a checkpoint, for :meth:`start_train_epoch`.
        self._resumed_epoch: dict[str, Any] | None = None
        #: ``TrainModule.log``'s shortcut for the call a training step makes every step: a name already
        #: logged in this batch loop, a scalar float tensor, every option at its default. Such a call
        #: only stores the value under its name (no epoch sums, no sync, no suffix), which the
        #: :data:`PlainLog` of the first call says where. One dict for the router's life, emptied
        #: whenever the store, the defaults or the metric dicts change, so a plan never outlives them.
        self.plain: dict[str, PlainLog] = {}

    @contextlib.contextmanager
    def logging(self, store: MetricStore, defaults: tuple[bool, bool], evaluating: bool = False) -> Iterator[None]:
        """Route ``self.log`` to ``store`` with ``defaults`` for ``(on_step, on_epoch)`` inside the block
        (``evaluating``: an evaluation loop's, see :attr:`evaluating`)."""
        previous = self.store, self.defaults, self.evaluating
        self.store, self.defaults, self.evaluating = store, defaults, evaluating
        self.plain.clear()
        if evaluating:  # an evaluation's own (kept after it: its results read them)
            self.loader_keys.clear()
        try:
            yield
        finally:
            self.store, self.defaults, self.evaluating = previous
            self.plain.clear()

    @contextlib.contextmanager
    def refusing(self, hook: str) -> Iterator[None]:
        """Inside the block ``self.log`` is refused, naming ``hook`` (Lightning refuses it in ``on_*_end``).

        The plain-log plans are set aside, not dropped: ``self.log``'s fast path must not bypass the
        refusal, and a refused hook that runs every step (a batch-transfer hook) must not make every
        plain ``self.log`` of the step work its plan out again."""
        previous = self.store, self.refused_hook, dict(self.plain)
        self.store, self.refused_hook = None, hook
        self.plain.clear()
        try:
            yield
        finally:
            self.store, self.refused_hook, plans = previous
            self.plain.clear()
            self.plain.update(plans)

    def no_log(self, hook: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (the user's ``hook``) called inside :meth:`refusing`: ``self.log`` there is refused naming ``hook``."""
        return _LogRefused(self, hook, fn)

    def _refusal(self, name: str) -> str:
        """The words of a refused ``self.log(name)``: Lightning's first (which hook, or predict's), then ours."""
        ours = (
            f" (self.log({name!r}): logging is not supported in predict, setup, teardown, the loaders, the batch "
            "transfer, on_fit_start/end, on_train/validation/test_end, on_*_model_eval/train, lr_scheduler_step "
            "or checkpoint hooks, as in Lightning. Log in the steps, the batch and backward hooks, "
            "on_train/validation/test_start or on_*_epoch_start/end.)"
        )
        if self.predicting:
            return (
                "You are trying to `self.log()` but the loop's result collection is not registered yet. This is most "
                "likely because you are trying to log in a `predict` hook, but it doesn't support logging" + ours
            )
        where = f"inside `{self.refused_hook}`" if self.refused_hook else "outside the steps and hooks of a loop"
        return (
            f"You can't `self.log()` {where}. HINT: You can still log directly to the logger by using "
            "`self.logger.experiment`." + ours
        )

    def log(
        self,
        name: str,
        value: Any,
        on_step: bool | None,
        on_epoch: bool | None,
        prog_bar: bool,
        sync_dist: bool,
        reduce_fx: str,
        batch_size: int | None,
        add_dataloader_idx: bool = True,
    ) -> None:
        """Back end of ``TrainModule.log`` (arguments in its order; positional, as it runs every step)."""
        store = self.store
        if store is None:
            raise LogRefusedError(self._refusal(name))
        if on_step is None:
            on_step = self.defaults[0]
        if on_epoch is None:
            on_epoch = self.defaults[1]
        if not (on_step or on_epoch):
            raise UserError(
                f"self.log({name!r}): on_step and on_epoch are both False, nothing would be logged "
                "(`self.log(on_step=False, on_epoch=False)` is not useful)"
            )
        suffix = self.dataloader_suffix
        if suffix and not add_dataloader_idx:
            self.loader_keys.update(dict.fromkeys((name, f"{name}_step", f"{name}_epoch"), suffix))
            suffix = ""
        self.plain.pop(name, None)  # this call may change what the next one must do; the end decides anew
        if batch_size is None and type(self.current_batch) is UnknownBatchSize:
            raise MisconfigurationException(self.current_batch.message)
        size = self._current_batch_size if batch_size is None else lambda: batch_size
        key = store.log(name, value, on_step, on_epoch, prog_bar, sync_dist, reduce_fx, size, suffix)
        if key is None:
            return
        tensor = store.pending_step[key]
        if self.evaluating:  # a step value of an evaluation: the progress bar only (loggers: at the step's end)
            if key in store.prog_bar_keys():
                self.progress_bar_metrics[key] = tensor
            return
        self._remember_one(key, tensor, store.prog_bar_keys())
        # Worked out for the next call of this name that passes every option at its default, if that call
        # will only store its value under the name (on_step only: the key is the name; no suffix to strip;
        # a tensor, not a Metric). The call itself checks the rest: a scalar of the dtype stored here.
        entry = store.entries.get(name)
        if (
            key == name
            and entry is not None
            and self.defaults is STEP_DEFAULTS
            and entry.metric is None
            and name.removesuffix("_step").removesuffix("_epoch") == name
        ):
            shown = self.progress_bar_metrics if name in store.prog_bar_keys() else None
            self.plain[name] = (entry, store.pending_step, self.callback_metrics, shown, tensor.dtype)

    def _current_batch_size(self) -> int:
        """``batch_size_of`` the current batch, worked out once per batch however many values are logged."""
        batch = self.current_batch
        cached_batch, size = self._batch_size_cache
        if cached_batch is not batch:
            size = batch_size_of(batch)
            self._batch_size_cache = (batch, size)
        return size

    def remember(self, values: Mapping[str, torch.Tensor], store: MetricStore) -> None:
        """Make ``values`` visible in ``callback_metrics`` (and the progress bar)."""
        if not values:
            return
        prog_bar = store.prog_bar_keys()
        for key, value in values.items():
            self._remember_one(key, value, prog_bar)

    def _remember_one(self, key: str, value: torch.Tensor, prog_bar: set[str]) -> None:
        self.callback_metrics[key] = value
        base = key.removesuffix("_step").removesuffix("_epoch")
        if base == key and "/dataloader_idx_" in key:  # ``loss_epoch/dataloader_idx_0``: also ``loss/dataloader_idx_0``
            head, sep, idx = key.rpartition("/dataloader_idx_")
            base = head.removesuffix("_step").removesuffix("_epoch") + sep + idx
        if base != key:
            self.callback_metrics[base] = value
        self.epoch_keys.add(key)
        self.epoch_keys.add(base)
        if key in prog_bar:
            self.progress_bar_metrics[key] = value

    def emit(self, metrics: dict[str, torch.Tensor], step: int, with_epoch: bool = True) -> None:
        """Hand ``metrics`` to the loggers at x = ``step`` (nothing during the sanity check).

        ``with_epoch``: the row also carries ``epoch`` (Lightning's rows do, but an evaluation step's).
        A row of logged values with a key ``step`` (``self.log("step", n)``) goes to the loggers at
        x = ``n``, without that key and without ``epoch``, as Lightning's trainer does for the rows
        whose step it chooses itself (``with_epoch``).
        """
        if self.no_logger_keys:
            metrics = {k: v for k, v in metrics.items() if k not in self.no_logger_keys}
        if not metrics:
            return
        self.logged_metrics.update(metrics)
        if self._sanity_checking():
            return
        if with_epoch and "step" in metrics:
            metrics = dict(metrics)
            step, with_epoch = int(metrics.pop("step")), False
        self._emit_to_loggers(metrics, step, with_epoch)

    def keep_logged(self, metrics: Mapping[str, torch.Tensor]) -> None:
        """Make step values the loggers are not given now (off the logging interval) ``logged_metrics``.

        Called on every step that logs: one ``dict.update`` unless a value was logged with ``logger=False``.
        """
        if self.no_logger_keys:
            metrics = {k: v for k, v in metrics.items() if k not in self.no_logger_keys}
        self.logged_metrics.update(metrics)

    def emit_eval_step(self, metrics: dict[str, torch.Tensor], prefix: str, dataloader_idx: int) -> None:
        """Hand an evaluation step's ``on_step`` values to the loggers, at x = the count of such steps.

        Lightning's x-axis for them: evaluation batches seen so far, per stage and loader (over the
        whole ``fit`` for validation).
        """
        key = (prefix, dataloader_idx)
        step = self.eval_steps.get(key, 0)
        if not self._sanity_checking():
            self.eval_steps[key] = step + 1
        self.emit(metrics, step, with_epoch=False)

    def publish_epoch(self, store: MetricStore, step: int) -> dict[str, torch.Tensor]:
        """Compute ``store``'s epoch values, make them visible and hand them to the loggers; return them."""
        values = store.epoch_values()
        self.remember(values, store)
        self.emit(values, step)
        return values

    def snapshot(self) -> tuple[dict[str, torch.Tensor], ...]:
        """Copies of the three metric dicts, for :meth:`restore` (the sanity check leaves no trace)."""
        return dict(self.callback_metrics), dict(self.progress_bar_metrics), dict(self.logged_metrics)

    def restore(self, snapshot: tuple[dict[str, torch.Tensor], ...]) -> None:
        """Put back what :meth:`snapshot` took."""
        self.callback_metrics, self.progress_bar_metrics, self.logged_metrics = snapshot
        self.plain.clear()

    # ----------------------------------------------------------------- checkpoints
    def start_train_epoch(self, store: MetricStore, module: torch.nn.Module | None) -> None:
        """Make ``store`` the training epoch's; after a mid-epoch resume, with the restored aggregates."""
        self.train_store = store
        self.epoch_keys.clear()
        self.plain.clear()
        resumed, self._resumed_epoch = self._resumed_epoch, None
        if resumed is not None:
            load_store_state(store, resumed["store"], module)
            self.epoch_keys.update(resumed["epoch_keys"])

    def state_dict(self, module: torch.nn.Module | None, mid_epoch: bool) -> dict[str, Any]:
        """What later decisions read: the three metric dicts and, ``mid_epoch``, the epoch's aggregates."""
        copies: dict[int, torch.Tensor] = {}  # a value in several dicts is copied (and saved) once
        state: dict[str, Any] = {
            "callback_metrics": _detached(self.callback_metrics, copies),
            "logged_metrics": _detached(self.logged_metrics, copies),
            "progress_bar_metrics": _detached(self.progress_bar_metrics, copies),
        }
        if mid_epoch and self.train_store is not None:
            state["train_epoch"] = {
                "store": store_state(self.train_store, module),
                "epoch_keys": sorted(self.epoch_keys),
            }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the epoch's aggregates wait for :meth:`start_train_epoch`."""
        self.callback_metrics = dict(state.get("callback_metrics", {}))
        self.logged_metrics = dict(state.get("logged_metrics", {}))
        self.progress_bar_metrics = dict(state.get("progress_bar_metrics", {}))
        self._resumed_epoch = state.get("train_epoch")
        self.plain.clear()


class _LogRefused:
    """A hook called inside :meth:`MetricRouter.refusing`; an object, not a closure, so that a trainer
    holding it (its resolved hooks) pickles as it did before."""

    __slots__ = ("fn", "hook", "router")

    def __init__(self, router: MetricRouter, hook: str, fn: Callable[..., Any]) -> None:
        self.router, self.hook, self.fn = router, hook, fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.router.refusing(self.hook):
            return self.fn(*args, **kwargs)


def _detached(values: Mapping[str, torch.Tensor], copies: dict[int, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached copies of ``values``; ``copies`` (by the original's id) shares one copy between dicts."""
    out: dict[str, torch.Tensor] = {}
    for key, value in values.items():
        if isinstance(value, torch.Tensor):
            copy = copies.get(id(value))
            if copy is None:
                copy = copies[id(value)] = value.detach().clone()
            value = copy
        out[key] = value
    return out
