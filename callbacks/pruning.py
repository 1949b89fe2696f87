"""``ModelPruning``: prune weights during training with ``torch.nn.utils.prune`` (Lightning 2.6's callback).

Pruning happens at the end of each training epoch (or, with ``prune_on_train_epoch_end=False``, of each
validation epoch outside the sanity check), by the amount asked for that epoch. ``torch.nn.utils.prune``
reparametrizes a pruned tensor: the module keeps ``<name>_orig`` (the same ``Parameter`` object, so the
optimizer keeps training it) and a ``<name>_mask`` buffer, and recomputes ``<name>`` before each forward.
With ``make_pruning_permanent`` (the default) checkpoints hold the pruned tensors under their own
names (``mask * orig``), the module keeps its masks to continue training, and the end of training
removes the reparametrization from the module itself.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from copy import deepcopy
from functools import partial
from typing import TYPE_CHECKING, Any

import torch.nn.utils.prune as torch_prune
from torch import Tensor, nn
from typing_extensions import override

from callbacks.base import Callback
from trainer.common.errors import MisconfigurationException
from trainer.common.rank_zero import rank_zero_debug, rank_zero_only

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["ModelPruning"]

log = logging.getLogger(__name__)

#: ``pruning_fn`` by name -> (function pruning one tensor, its ``BasePruningMethod`` class for global pruning).
_BY_NAME: dict[str, tuple[Callable[..., Any], type[torch_prune.BasePruningMethod]]] = {
    "ln_structured": (torch_prune.ln_structured, torch_prune.LnStructured),
    "l1_unstructured": (torch_prune.l1_unstructured, torch_prune.L1Unstructured),
    "random_structured": (torch_prune.random_structured, torch_prune.RandomStructured),
    "random_unstructured": (torch_prune.random_unstructured, torch_prune.RandomUnstructured),
}

ParamList = Sequence[tuple[nn.Module, str]]
Amount = int | float


#: Modules that only hold others: never pruned themselves when every parameter is chosen (with any
#: module that has a ``training_step``: the TrainModule itself, or one nested in it).
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def _is_container(module: nn.Module) -> bool:
    return isinstance(module, _CONTAINERS) or callable(getattr(module, "training_step", None))


def _per_epoch(value: Any, epoch: int) -> Any:
    """``value(epoch)`` for a callable setting, else ``value``."""
    return value(epoch) if callable(value) else value


class ModelPruning(Callback):
    """Prune parameters with ``torch.nn.utils.prune`` during training, as Lightning's ``ModelPruning``.

    Args:
        pruning_fn: ``"l1_unstructured"``, ``"random_unstructured"``, ``"ln_structured"``,
            ``"random_structured"``, or a ``torch.nn.utils.prune.BasePruningMethod`` subclass (the class,
            with ``use_global_unstructured=True``).
        parameters_to_prune: ``(module, parameter_name)`` pairs; empty: every parameter named in
            ``parameter_names`` of every module that is not a container.
        parameter_names: ``"weight"`` and/or ``"bias"`` (default both).
        use_global_unstructured: prune the chosen tensors together (the smallest over all of them);
            only unstructured methods can.
        amount: fraction (float) or count (int) to prune, or a callable of the epoch returning one; 0
            prunes nothing that epoch.
        apply_pruning: whether to prune, or a callable of the epoch returning it.
        make_pruning_permanent: checkpoints hold the pruned tensors under their own names, and the end
            of training removes the reparametrization from the module.
        use_lottery_ticket_hypothesis: after pruning, reset the remaining weights to their values at
            ``setup`` (a bool, or a callable of the epoch).
        resample_parameters: with the lottery ticket hypothesis, reset to fresh values instead
            (``reset_parameters()`` of a copy of the original layer).
        pruning_dim: the dimension of structured pruning (required by ``*_structured``).
        pruning_norm: the norm of ``ln_structured`` (required by it).
        verbose: 0 quiet, 1 logs the overall sparsity after each pruning, 2 also each tensor's.
        prune_on_train_epoch_end: prune at the end of the training epoch; ``False``: of the validation epoch.

    Raises:
        MisconfigurationException: for a parameter name other than ``weight``/``bias``, an unknown or
            misconfigured ``pruning_fn``, a structured method with global pruning, an ``amount`` that is
            no number or callable, or a ``verbose`` outside (0, 1, 2).
    """

    PARAMETER_NAMES = ("weight", "bias")

    def __init__(
        self,
        pruning_fn: Callable[..., Any] | str,
        parameters_to_prune: ParamList = (),
        parameter_names: list[str] | None = None,
        use_global_unstructured: bool = True,
        amount: Amount | Callable[[int], Amount] = 0.5,
        apply_pruning: bool | Callable[[int], bool] = True,
        make_pruning_permanent: bool = True,
        use_lottery_ticket_hypothesis: bool | Callable[[int], bool] = True,
        resample_parameters: bool = False,
        pruning_dim: int | None = None,
        pruning_norm: int | None = None,
        verbose: int = 0,
        prune_on_train_epoch_end: bool = True,
    ) -> None:
        self._use_global_unstructured = use_global_unstructured
        self._parameters_to_prune: ParamList = parameters_to_prune
        self._use_lottery_ticket_hypothesis = use_lottery_ticket_hypothesis
        self._resample_parameters = resample_parameters
        self._prune_on_train_epoch_end = prune_on_train_epoch_end
        self._parameter_names = tuple(parameter_names or self.PARAMETER_NAMES)
        self._global_kwargs: dict[str, Any] = {}
        #: id of a module -> a copy of it taken at ``setup`` and its ``(index, name)`` entries.
        self._original_layers: dict[int, dict[str, Any]] | None = None
        self._pruning_method_name: str | None = None
        for name in self._parameter_names:
            if name not in self.PARAMETER_NAMES:
                raise MisconfigurationException(
                    f"The provided `parameter_names` name: {name} isn't in {self.PARAMETER_NAMES}: "
                    "ModelPruning prunes weights and biases"
                )
        self.pruning_fn = self._resolve_pruning_fn(pruning_fn, use_global_unstructured, pruning_dim, pruning_norm)
        self._apply_pruning = apply_pruning
        self._make_pruning_permanent = make_pruning_permanent
        if isinstance(amount, bool) or not (isinstance(amount, (int, float)) or callable(amount)):
            raise MisconfigurationException(
                f"`amount` should be provided and be either an int, a float or Callable function, got {amount!r}"
            )
        self.amount = amount
        if verbose not in (0, 1, 2):
            raise MisconfigurationException(f"`verbose` must be any of (0, 1, 2), got {verbose!r}")
        self._verbose = verbose

    def _resolve_pruning_fn(
        self, pruning_fn: Any, use_global: bool, pruning_dim: int | None, pruning_norm: int | None
    ) -> Any:
        """The function (local pruning) or ``BasePruningMethod`` class (global pruning) to call."""
        if isinstance(pruning_fn, str):
            key = pruning_fn.lower()
            if key not in _BY_NAME:
                raise MisconfigurationException(
                    f"The provided `pruning_fn` {key} isn't available in PyTorch's built-in functions: "
                    f"{list(_BY_NAME)} "
                )
            kwargs: dict[str, Any] = {}
            if key.endswith("_structured"):
                if pruning_dim is None:
                    raise MisconfigurationException(
                        "When requesting `structured` pruning, the `pruning_dim` should be provided."
                    )
                if key == "ln_structured":
                    if pruning_norm is None:
                        raise MisconfigurationException(
                            "When requesting `ln_structured` pruning, the `pruning_norm` should be provided."
                        )
                    kwargs["n"] = pruning_norm
                kwargs["dim"] = pruning_dim
            resolved = self._create_pruning_fn(key, **kwargs)
        elif self._is_pruning_method(pruning_fn):
            if not use_global:
                raise MisconfigurationException(
                    "PyTorch `BasePruningMethod` is currently only supported with `use_global_unstructured=True`."
                )
            resolved = pruning_fn
            self._pruning_method_name = pruning_fn.__name__
        else:
            raise MisconfigurationException(
                f"`pruning_fn` is expected to be a str in {list(_BY_NAME)} or a PyTorch `BasePruningMethod`. "
                f"Found: {pruning_fn}. HINT: if passing a `BasePruningMethod`, pass the class, not an instance"
            )
        if use_global and getattr(resolved, "PRUNING_TYPE", None) != "unstructured":
            raise MisconfigurationException(
                'Only the "unstructured" PRUNING_TYPE is supported with `use_global_unstructured=True`. '
                f"Found method {resolved} of type {getattr(resolved, 'PRUNING_TYPE', None)}: pass "
                "use_global_unstructured=False to prune each tensor on its own"
            )
        return resolved

    def _create_pruning_fn(self, pruning_fn: str, **kwargs: Any) -> Any:
        """``pruning_fn``'s ``BasePruningMethod`` class (global pruning) or its function with ``kwargs`` bound."""
        function, method = _BY_NAME[pruning_fn]
        self._pruning_method_name = method.__name__
        if self._use_global_unstructured:
            self._global_kwargs = kwargs
            return method
        return partial(function, **kwargs)

    def filter_parameters_to_prune(self, parameters_to_prune: ParamList = ()) -> ParamList:
        """Override to choose which of the ``(module, name)`` pairs are pruned; all of them by default."""
        return parameters_to_prune

    def make_pruning_permanent(self, module: nn.Module) -> None:
        """Remove the pruning reparametrization from every submodule: ``<name>`` becomes a parameter again."""
        for _, sub in module.named_modules():
            for key, hook in list(sub._forward_pre_hooks.items()):
                if isinstance(hook, torch_prune.BasePruningMethod):
                    hook.remove(sub)
                    del sub._forward_pre_hooks[key]

    @staticmethod
    def _copy_param(new: nn.Module, old: nn.Module, name: str) -> None:
        """Set ``new``'s (unpruned) values of ``name`` to ``old``'s."""
        dst = getattr(new, name + "_orig", None)
        if dst is None:
            dst = getattr(new, name, None)
        src = getattr(old, name, None)
        if isinstance(dst, Tensor) and isinstance(src, Tensor):
            dst.data = src.data.to(dst.device)

    def apply_lottery_ticket_hypothesis(self) -> None:
        """Reset the weights that survive pruning to their values at ``setup`` (the "winning ticket").

        Step 4 of the lottery ticket hypothesis (Frankle and Carbin): the mask stays, the values
        restart from the original ones, or from a fresh initialization with ``resample_parameters``.
        """
        assert self._original_layers is not None, "setup() records the original layers first"
        for entry in self._original_layers.values():
            source = entry["data"]
            if self._resample_parameters and callable(getattr(source, "reset_parameters", None)):
                source = deepcopy(source)  # the recorded original stays as it was
                source.reset_parameters()
            for index, name in entry["names"]:
                module, _ = self._parameters_to_prune[index]
                self._copy_param(module, source, name)

    def _apply_local_pruning(self, amount: Amount) -> None:
        for module, name in self._parameters_to_prune:
            self.pruning_fn(module, name=name, amount=amount)

    def _resolve_global_kwargs(self, amount: Amount) -> dict[str, Any]:
        """The keywords of the pruning method's constructor that it takes, ``amount`` among them."""
        self._global_kwargs["amount"] = amount
        accepted = set(inspect.signature(self.pruning_fn).parameters) - {"self"}
        return {k: v for k, v in self._global_kwargs.items() if k in accepted}

    def _apply_global_pruning(self, amount: Amount) -> None:
        torch_prune.global_unstructured(
            self._parameters_to_prune, pruning_method=self.pruning_fn, **self._resolve_global_kwargs(amount)
        )

    @staticmethod
    def _get_pruned_stats(module: nn.Module, name: str) -> tuple[int, int]:
        """(zeros in the mask, size of the mask) of ``module.<name>``; (0, 1) before its first pruning."""
        mask = getattr(module, f"{name}_mask", None)
        if mask is None:
            return 0, 1
        return int((mask == 0).sum().item()), mask.numel()

    def apply_pruning(self, amount: Amount) -> None:
        """Prune ``parameters_to_prune`` by ``amount`` (a fraction or a count), logging sparsity if verbose."""
        before = [self._get_pruned_stats(m, n) for m, n in self._parameters_to_prune] if self._verbose else []
        if self._use_global_unstructured:
            self._apply_global_pruning(amount)
        else:
            self._apply_local_pruning(amount)
        if self._verbose:
            after = [self._get_pruned_stats(m, n) for m, n in self._parameters_to_prune]
            self._log_sparsity_stats(before, after, amount=amount)

    @rank_zero_only
    def _log_sparsity_stats(self, prev: list[tuple[int, int]], curr: list[tuple[int, int]], amount: Amount = 0) -> None:
        total = sum(size for _, size in curr)
        before = sum(zeros for zeros, _ in prev)
        after = sum(zeros for zeros, _ in curr)
        log.info(
            f"Applied `{self._pruning_method_name}`. Pruned: {before}/{total} ({before / total:.2%}) -> "
            f"{after}/{total} ({after / total:.2%})"
        )
        if self._verbose == 2:
            for (module, name), (zeros0, size0), (zeros1, size1) in zip(self._parameters_to_prune, prev, curr):
                log.info(
                    f"Applied `{self._pruning_method_name}` to `{module!r}.{name}` with amount={amount}. Pruned: "
                    f"{zeros0} ({zeros0 / size0:.2%}) -> {zeros1} ({zeros1 / size1:.2%})"
                )

    @override
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        chosen = self.sanitize_parameters_to_prune(pl_module, self._parameters_to_prune, self._parameter_names)
        self._parameters_to_prune = self.filter_parameters_to_prune(chosen)
        if self._use_lottery_ticket_hypothesis:
            # One copy per module (taken now, before any pruning) and the entries that prune it.
            self._original_layers = {}
            for index, (module, name) in enumerate(self._parameters_to_prune):
                entry = self._original_layers.setdefault(id(module), {"data": deepcopy(module), "names": []})
                entry["names"].append((index, name))

    def _run_pruning(self, current_epoch: int) -> None:
        amount = _per_epoch(self.amount, current_epoch)
        if not _per_epoch(self._apply_pruning, current_epoch) or not amount:
            return
        self.apply_pruning(amount)
        if _per_epoch(self._use_lottery_ticket_hypothesis, current_epoch):
            self.apply_lottery_ticket_hypothesis()

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._prune_on_train_epoch_end:
            rank_zero_debug("`ModelPruning.on_train_epoch_end`. Applying pruning")
            self._run_pruning(pl_module.current_epoch)

    @override
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not trainer.sanity_checking and not self._prune_on_train_epoch_end:
            rank_zero_debug("`ModelPruning.on_validation_epoch_end`. Applying pruning")
            self._run_pruning(pl_module.current_epoch)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._make_pruning_permanent:
            rank_zero_debug("`ModelPruning.on_train_end`. Pruning is made permanent for this checkpoint")
            self.make_pruning_permanent(pl_module)

    def _make_pruning_permanent_on_state_dict(self, pl_module: TrainModule) -> dict[str, Any]:
        """The module's state dict with each pruned tensor as ``mask * orig`` under its own name, on the CPU."""
        state = pl_module.state_dict()
        for name in [k[: -len("_mask")] for k in state if k.endswith("_mask")]:
            orig = state.pop(name + "_orig")
            mask = state.pop(name + "_mask")
            state[name] = mask.to(dtype=orig.dtype) * orig
        return {k: v.cpu() if isinstance(v, Tensor) else v for k, v in state.items()}

    @override
    def on_save_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
        if self._make_pruning_permanent:
            rank_zero_debug("`ModelPruning.on_save_checkpoint`. Pruning is made permanent for this checkpoint")
            # The file gets pruned tensors; the module keeps its masks to go on training, and so does
            # a run resumed from the file (the masks travel in this callback's state).
            masks = {k: v.cpu() for k, v in pl_module.state_dict().items() if k.endswith("_mask")}
            checkpoint["state_dict"] = self._make_pruning_permanent_on_state_dict(pl_module)
            if isinstance(checkpoint.get("callbacks"), dict):
                own = checkpoint["callbacks"].setdefault(self.state_key, {})
                own["masks"] = {k[: -len("_mask")]: v for k, v in masks.items()}

    @override
    def on_load_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """Prune the module with the checkpoint's masks before its weights load: the run goes on exactly.

        A file written with ``make_pruning_permanent`` holds the pruned tensors under their own names
        and the masks in this callback's state; the tensors become ``<name>_orig`` again.
        """
        state = checkpoint.get("state_dict")
        if not isinstance(state, dict):
            return
        saved = checkpoint.get("callbacks", {}).get(self.state_key, {}).get("masks", {})
        masks = {k[: -len("_mask")]: v for k, v in state.items() if k.endswith("_mask")} or dict(saved)
        for name, mask in masks.items():
            path, _, attr = name.rpartition(".")
            module = pl_module.get_submodule(path)
            if not hasattr(module, attr + "_mask"):
                torch_prune.custom_from_mask(module, attr, mask.to(getattr(module, attr).device))
            if name in state and name + "_orig" not in state:  # a permanent file: back to the reparametrization
                state[name + "_orig"] = state.pop(name)
                state[name + "_mask"] = mask

    @staticmethod
    def sanitize_parameters_to_prune(
        pl_module: nn.Module, parameters_to_prune: ParamList = (), parameter_names: Sequence[str] = ()
    ) -> ParamList:
        """Check ``parameters_to_prune`` against the model; empty: every ``parameter_names`` parameter.

        Raises:
            MisconfigurationException: a module of ``parameters_to_prune`` is not in the model, or one
                has no such attribute, or the value is not a list/tuple of ``(module, name)`` pairs.
        """
        names = parameter_names or ModelPruning.PARAMETER_NAMES
        modules = [m for m in pl_module.modules() if not _is_container(m)]
        if not parameters_to_prune:
            return [(m, p) for p in names for m in modules if isinstance(getattr(m, p, None), nn.Parameter)]
        if not (
            isinstance(parameters_to_prune, (list, tuple))
            and all(isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in parameters_to_prune)
            and all(isinstance(m, nn.Module) and isinstance(n, str) for m, n in parameters_to_prune)
        ):
            raise MisconfigurationException(
                "The provided `parameters_to_prune` should either be list of tuple"
                " with 2 elements: (nn.Module, parameter_name_to_prune) or None"
            )
        known = {id(m) for m in modules}
        missing_modules = [m for m, _ in parameters_to_prune if id(m) not in known]
        missing_parameters = [n for m, n in parameters_to_prune if id(m) in known and not hasattr(m, n)]
        if missing_modules or missing_parameters:
            raise MisconfigurationException(
                "Some provided `parameters_to_prune` don't exist in the model."
                f" Found missing modules: {missing_modules} and missing parameters: {missing_parameters}"
            )
        return parameters_to_prune

    @staticmethod
    def _is_pruning_method(method: Any) -> bool:
        """Whether ``method`` is a ``torch.nn.utils.prune.BasePruningMethod`` subclass (the class itself)."""
        return inspect.isclass(method) and issubclass(method, torch_prune.BasePruningMethod)
