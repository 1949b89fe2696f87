"""Who is called first at each moment of a run: the one declaration of the hook order.

Lightning 2.6's rule, which geartrain follows: for a hook both the module and the callbacks define,
**the callbacks run first, then the module**, with these exceptions:

- ``on_train_epoch_end``: callbacks that do not monitor a metric, then the module, then the ones that
  do (checkpointing and early stopping), so those see what the module logs in its own hook;
- ``on_load_checkpoint``: the module first, then the callbacks (which then get their ``load_state_dict``);
- ``setup``/``teardown``: the data module, then the callbacks, then the module;
- hooks only one side has: ``on_sanity_check_*`` and ``on_log_metrics`` (callbacks),
  ``on_*_model_eval``/``_train``/``_zero_grad``, the batch-transfer hooks and the steps (module).

:class:`~trainer.hooks.HookDispatch` calls hooks as :func:`dispatch` says, the loops call
:func:`dispatch` where a hook is split, and the tests build the expected call lists from it.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["CALLBACKS", "MODULE", "MODULE_FIRST", "MONITORS_AFTER_MODULE", "OTHERS", "dispatch"]

#: The sides of a hook call: the module, every callback, the callbacks that do not monitor a metric
#: and those that do (:class:`~callbacks.base.Checkpoint` and early stopping).
Side = Literal["module", "callbacks", "others", "monitors"]
MODULE: Side = "module"
CALLBACKS: Side = "callbacks"
OTHERS: Side = "others"

#: Hooks where the module runs before the callbacks.
MODULE_FIRST = frozenset({"on_load_checkpoint"})
#: Hooks where monitoring callbacks run after the module and the other callbacks before it.
MONITORS_AFTER_MODULE = frozenset({"on_train_epoch_end"})


def dispatch(hook: str) -> tuple[Side, ...]:
    """The order of the sides called for ``hook``, e.g. ``("callbacks", "module")``."""
    if hook in MODULE_FIRST:
        return (MODULE, CALLBACKS)
    if hook in MONITORS_AFTER_MODULE:
        return (OTHERS, MODULE, "monitors")
    return (CALLBACKS, MODULE)
