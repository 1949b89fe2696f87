"""Hook dispatch: who is called, in which order, for every moment of a run.

A hook named ``on_x`` runs every callback whose class overrides it, in the order the callbacks were
given, then the module's method: Lightning's order, with its exceptions, declared once in
:mod:`trainer.hook_order`. Which callbacks override which hook is worked out once when
the trainer is built (:func:`callbacks.base.overridden_hooks`), and the callables of a run are resolved
on first use, so a hook that neither the module nor any callback overrides costs one dict lookup, and
the loops can ask :meth:`HookDispatch.overridden` once per epoch and skip it altogether.

With a profiler (``Trainer(profiler=...)``) each resolved callable is wrapped once in its own action
(``[LightningModule]Net.on_train_start``, ``[Callback]<the callback's state_key>.on_train_batch_end``, as
Lightning names them, so two callbacks of one class are two actions); without
one the resolved callables are the hooks themselves, as before profilers existed.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback, check_hooks, overridden_hooks
from trainer.hook_order import MODULE_FIRST
from trainer.metrics.routing import NO_LOG_HOOKS
from trainer.profilers.base import Profiler, is_active, profiled

if TYPE_CHECKING:
    from trainer.module import TrainModule

__all__ = ["HookDispatch", "is_overridden"]

_Resolved = tuple[Callable[..., Any] | None, tuple[Callable[..., Any], ...]]


class HookDispatch:
    """Calls the hooks of one trainer's module and callbacks.

    Args:
        callbacks: the trainer's callbacks, in calling order.
        owner: what callbacks receive as their first argument (the :class:`~trainer.Trainer`).
    """

    def __init__(self, callbacks: list[Callback], owner: Any) -> None:
        check_hooks(callbacks)  # a hook that is never called is refused at Trainer(...)
        self.callbacks = callbacks
        self._owner = owner
        self._by_hook = overridden_hooks(callbacks)
        self._module: TrainModule | None = None
        self._resolved: dict[str, _Resolved] = {}
        self._profiler: Profiler | None = None

    def bind(self, module: TrainModule) -> None:
        """Dispatch to ``module`` from now on (once per ``fit``/``validate``/... call)."""
        check_hooks(self.callbacks)  # again: callbacks may have been added since (configure_callbacks)
        # ... to the list itself too (``trainer.callbacks.append(cb)``, as Lightning users do): look again.
        self._by_hook = overridden_hooks(self.callbacks)
        self._module = module
        for cb in self.callbacks:
            # Lightning's ``self.log`` in a callback: the module's, attached for the run (a class's own wins).
            if not hasattr(type(cb), "log"):
                cb.log = module.log  # type: ignore[attr-defined]
                cb.log_dict = module.log_dict  # type: ignore[attr-defined]
        self._resolved = {}
        profiler = getattr(self._owner, "profiler", None)
        self._profiler = profiler if is_active(profiler) else None
        if self._profiler is not None:
            # Lightning times every hook of every callback, its base class's empty ones too, so its
            # report has a row per callback and hook. Only under a profiler: without one a hook nobody
            # overrides stays uncalled. Loggers are no callbacks in Lightning, and ``on_log_metrics`` is ours.
            loggers = {id(lg) for lg in getattr(self._owner, "loggers", None) or ()}
            for hook, overriding in self._by_hook.items():
                if hook != "on_log_metrics":
                    chosen = {id(cb) for cb in overriding}
                    self._by_hook[hook] = [
                        cb
                        for cb in self.callbacks
                        if id(cb) in chosen or (id(cb) not in loggers and callable(getattr(cb, hook, None)))
                    ]

    def __call__(self, hook: str, *args: Any) -> Any:
        """Call every callback overriding ``hook``, then the module's (:mod:`trainer.hook_order`); return the module's result."""
        try:
            module_fn, callback_fns = self._resolved[hook]
        except KeyError:
            module_fn, callback_fns = self._resolved[hook] = self._resolve(hook)
        if hook in MODULE_FIRST:
            out = module_fn(*args) if module_fn is not None else None
            for fn in callback_fns:
                fn(*args)
            return out
        for fn in callback_fns:
            fn(*args)
        return module_fn(*args) if module_fn is not None else None

    def module(self, hook: str, *args: Any, **kwargs: Any) -> Any:
        """Call only the module's ``hook`` (for epoch ends, where metrics are computed in between)."""
        assert self._module is not None
        call = self._no_log(hook, getattr(self._module, hook))
        if self._profiler is not None:
            with self._profiler.profile(f"[LightningModule]{type(self._module).__name__}.{hook}"):
                return call(*args, **kwargs)
        return call(*args, **kwargs)

    def datamodule(self, datamodule: Any, hook: str, *args: Any, **kwargs: Any) -> Any:
        """Call the data module's ``hook``, in the profiler's ``[LightningDataModule]<class>.<hook>`` action
        when one profiles (Lightning's name), so its ``prepare_data``/``setup``/``state_dict`` show in the report."""
        if self._profiler is not None:
            with self._profiler.profile(f"[LightningDataModule]{type(datamodule).__name__}.{hook}"):
                return getattr(datamodule, hook)(*args, **kwargs)
        return getattr(datamodule, hook)(*args, **kwargs)

    def callbacks_only(self, hook: str, *args: Any, monitors: bool | None = None, **kwargs: Any) -> None:
        """Call only the callbacks overriding ``hook`` (hooks the module does not have, e.g. ``on_log_metrics``).

        ``kwargs`` are passed by name, as Lightning passes them (``setup(trainer, module, stage=...)``).
        ``monitors``: True for only the callbacks that monitor a metric (checkpointing, early
        stopping), False for only the others, None for all (see :mod:`trainer.hook_order`).
        """
        callbacks = self._by_hook[hook]
        if monitors is not None:
            callbacks = [cb for cb in callbacks if _monitors(cb) is monitors]
        router = getattr(self._owner, "metric_router", None)
        refusing = router.refusing(hook) if callbacks and router is not None and hook in NO_LOG_HOOKS else None
        with refusing or contextlib.nullcontext():  # self.log there is refused naming the hook, as in Lightning
            if self._profiler is not None:
                for cb in callbacks:
                    with self._profiler.profile(f"[Callback]{cb.state_key}.{hook}"):
                        getattr(cb, hook)(self._owner, self._module, *args, **kwargs)
                return
            for cb in callbacks:
                getattr(cb, hook)(self._owner, self._module, *args, **kwargs)

    def reaches_user_code(self, hook: str) -> bool:
        """Whether ``hook`` calls code of the user's: the module's override, or a callback whose class's
        ``hook`` is not geartrain's own. The loops shape an argument that only such code reads (Lightning's
        ``on_train_batch_end`` outputs) for it alone: geartrain's callbacks take it as it comes, for free."""
        try:
            module_fn, _ = self._resolved[hook]
        except KeyError:
            module_fn, _ = self._resolved[hook] = self._resolve(hook)
        if module_fn is not None:
            return True
        own = ("callbacks", "trainer", "strategies")

        def users(cb: Any) -> bool:  # set on the instance (a LambdaCallback's function, a Mock's): the user's
            fn = getattr(type(cb), hook, None)
            return fn is None or hook in getattr(cb, "__dict__", {}) or fn.__module__.split(".")[0] not in own

        return any(users(cb) for cb in self._by_hook.get(hook, ()))

    def overridden(self, hook: str) -> bool:
        """Whether the module or a callback does something in ``hook``, so it must be called at all."""
        try:
            module_fn, callback_fns = self._resolved[hook]
        except KeyError:
            module_fn, callback_fns = self._resolved[hook] = self._resolve(hook)
        return module_fn is not None or bool(callback_fns)

    def bound(self, hook: str) -> Callable[..., Any] | None:
        """``hook`` as one callable for a loop to keep, or None where nobody overrides it.

        Where only the module or only callbacks override ``hook`` (the order then cannot matter), the
        callable calls them directly, without a dispatch per call; it returns what :meth:`__call__`
        would: the module's result, or None.
        """
        if not self.overridden(hook):
            return None
        module_fn, callback_fns = self._resolved[hook]
        if not callback_fns:
            return module_fn
        if module_fn is not None:
            return functools.partial(self, hook)
        arity = _TRAIN_BATCH_ARITY.get(hook)
        methods = tuple(_bound_method(fn, self._owner, self._module) for fn in callback_fns)
        if arity is not None and all(m is not None for m in methods):
            return _call_methods(methods, self._owner, self._module, arity)  # type: ignore[arg-type]

        def call_each(*args: Any) -> None:
            for fn in callback_fns:
                fn(*args)

        return call_each

    def _no_log(self, hook: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, or where Lightning refuses ``self.log`` in ``hook`` (:data:`~trainer.metrics.routing.NO_LOG_HOOKS`)
        ``fn`` inside the router's refusal, so a ``self.log`` there names the hook."""
        router = getattr(self._owner, "metric_router", None)
        return fn if router is None or hook not in NO_LOG_HOOKS else router.no_log(hook, fn)

    def _resolve(self, hook: str) -> _Resolved:
        """The module's ``hook`` (None where it keeps TrainModule's empty default) and the callbacks' ones."""
        from trainer.module import TrainModule

        module = self._module
        assert module is not None
        fn = getattr(module, hook)
        if getattr(fn, "__func__", None) is getattr(TrainModule, hook, None):
            fn = None  # TrainModule's hooks do nothing; skipping the call changes nothing
        owner = self._owner
        partials = tuple(functools.partial(getattr(cb, hook), owner, module) for cb in self._by_hook.get(hook, ()))
        fn = None if fn is None else self._no_log(hook, fn)
        callback_fns: tuple[Callable[..., Any], ...] = tuple(self._no_log(hook, cb) for cb in partials)
        if self._profiler is not None:  # each callable in its own action, wrapped once here
            fn = profiled(self._profiler, f"[LightningModule]{type(module).__name__}.{hook}", fn)
            callback_fns = tuple(
                profiled(self._profiler, f"[Callback]{cb.state_key}.{hook}", cb_fn)
                for cb, cb_fn in zip(self._by_hook.get(hook, ()), callback_fns, strict=True)
            )
        return fn, callback_fns


#: The training loop's per-batch hooks that :meth:`HookDispatch.bound` serves, with the number of
#: arguments the loops pass them (always by position).
_TRAIN_BATCH_ARITY = {
    "on_train_batch_start": 2,
    "on_train_batch_end": 3,
    "on_before_backward": 1,
    "on_after_backward": 0,
    "on_before_optimizer_step": 1,
    "on_before_zero_grad": 1,
}


def _bound_method(fn: Callable[..., Any], owner: Any, module: Any) -> Callable[..., Any] | None:
    """The callback's own bound method behind ``fn`` when ``fn`` is the plain ``partial(method, owner, module)``
    :meth:`HookDispatch._resolve` makes; None where it is wrapped (``self.log`` refused there, a profiler)."""
    if type(fn) is not functools.partial or fn.keywords or len(fn.args) != 2:
        return None
    if fn.args[0] is not owner or fn.args[1] is not module:
        return None
    return fn.func


def _call_methods(methods: tuple[Callable[..., Any], ...], owner: Any, module: Any, arity: int) -> Callable[..., None]:
    """Call each of ``methods`` with ``owner, module`` and the loop's ``arity`` arguments, in order.

    A call with its arguments written out is a plain Python call for the interpreter; a
    ``functools.partial`` (or ``*args``) makes every per-batch hook of every callback a call through
    C, with an argument array allocated for it.
    """
    if arity == 0:

        def call_each_0() -> None:
            for method in methods:
                method(owner, module)

        return call_each_0
    if arity == 1:

        def call_each_1(a: Any) -> None:
            for method in methods:
                method(owner, module, a)

        return call_each_1
    if arity == 2:

        def call_each_2(a: Any, b: Any) -> None:
            for method in methods:
                method(owner, module, a, b)

        return call_each_2

    def call_each_3(a: Any, b: Any, c: Any) -> None:
        for method in methods:
            method(owner, module, a, b, c)

    return call_each_3


def is_overridden(method_name: str, instance: object | None = None, parent: type | None = None) -> bool:
    """Whether ``instance`` defines ``method_name`` otherwise than ``parent`` does (Lightning's function).

    ``parent`` defaults to :class:`~trainer.TrainModule`, :class:`~trainer.DataModule` or
    :class:`~callbacks.Callback`, whichever ``instance`` is. A method set to ``None`` on the instance
    (``model.validation_step = None``) counts as not overridden, as does a missing one; one ``parent``
    does not define counts as overridden; a ``functools.wraps`` wrapper, a ``functools.partial`` or a
    ``Mock(wraps=...)`` is judged by the function it wraps (a wrapper around None is not overridden).

    >>> from trainer import TrainModule
    >>> class Net(TrainModule):
    ...     def validation_step(self, batch, batch_idx): ...
    >>> is_overridden("validation_step", Net()), is_overridden("test_step", Net())
    (True, False)
    """
    from trainer.datamodule import DataModule
    from trainer.module import TrainModule

    if instance is None:
        return False
    if parent is None:
        parent = next((p for p in (TrainModule, DataModule, Callback) if isinstance(instance, p)), None)
        if parent is None:
            raise ValueError(
                f"is_overridden({method_name!r}): pass parent= for a {type(instance).__name__}, which is not a "
                "TrainModule, DataModule or Callback"
            )
    fn = getattr(instance, method_name, None)
    if fn is None:
        return False
    fn = getattr(fn, "__wrapped__", fn)
    mock = sys.modules.get("unittest.mock")  # a Mock exists only where that module was imported
    if mock is not None and isinstance(fn, mock.Mock):  # Mock(wraps=...): judged by what it wraps
        fn = fn._mock_wraps
    elif isinstance(fn, functools.partial):
        fn = fn.func
    if fn is None:  # a wrapper around None (a hook switched off on the class): not overridden, as Lightning
        return False
    parent_fn = getattr(parent, method_name, None)
    if parent_fn is None:  # a method the parent lacks: defining one overrides
        return True
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return code is None or code is not getattr(getattr(parent_fn, "__func__", parent_fn), "__code__", None)


def _monitors(cb: Callback) -> bool:
    """Whether ``cb`` is one of the callbacks Lightning calls after the module in ``on_train_epoch_end``."""
    from callbacks.base import Checkpoint
    from callbacks.early_stopping import EarlyStopping

    return isinstance(cb, (Checkpoint, EarlyStopping))
