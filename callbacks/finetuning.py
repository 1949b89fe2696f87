"""Fine-tuning callbacks: ``BaseFinetuning`` (freeze, then unfreeze as you decide) and ``BackboneFinetuning``.

Lightning 2.6's names and semantics. ``freeze_before_training`` runs at ``setup``, before the optimizer
is built (so build it from the parameters that require gradients); ``finetune_function`` runs at every
epoch's start and may unfreeze modules and add them to the optimizer as a new parameter group.

Resuming is exact: the callback's state names the parameters of every group it added, and the
trainer hands it the checkpoint (``on_load_checkpoint``) before it loads the optimizer's state, so the
groups are rebuilt first and the saved optimizer state (momentum of the unfrozen backbone included)
loads into an optimizer of the same shape, with the unfrozen parameters trainable again.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Generator, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import Module, ModuleDict
from torch.nn.modules.batchnorm import _BatchNorm

from callbacks.base import Callback

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

__all__ = ["BackboneFinetuning", "BaseFinetuning", "multiplicative"]

log = logging.getLogger(__name__)

Modules = Module | Iterable[Module | Iterable[Any]]


def multiplicative(epoch: int) -> float:
    """``BackboneFinetuning``'s default ``lambda_func``: the backbone's learning rate doubles every epoch."""
    return 2.0


class BaseFinetuning(Callback):
    """Freeze modules before training and unfreeze them during it; subclass and implement the two hooks.

    Example:
        >>> class Unfreeze(BaseFinetuning):
        ...     def freeze_before_training(self, pl_module):
        ...         self.freeze(pl_module.backbone)
        ...     def finetune_function(self, pl_module, epoch, optimizer):
        ...         if epoch == 3:
        ...             self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, lr=1e-3)
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
        >>> BaseFinetuning.freeze(net, train_bn=True)
        >>> [p.requires_grad for p in net.parameters()]
        [False, False, True, True]
    """

    def __init__(self) -> None:
        #: Per optimizer index, its parameter groups with parameter names instead of tensors.
        self._internal_optimizer_metadata: dict[int, list[dict[str, Any]]] = {}
        self._restarting = False
        self._rebuilt = False  # the groups were rebuilt from the checkpoint in on_load_checkpoint
        #: The last epoch ``finetune_function`` ran for: a run resumed in the middle of an epoch does not
        #: run it again for that epoch (it would unfreeze twice, or move a learning rate twice).
        self._finetuned_epoch = -1

    # ----------------------------------------------------------------- to implement
    def freeze_before_training(self, pl_module: TrainModule) -> None:
        """Freeze what starts frozen (called at ``setup``, before ``configure_optimizers``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement freeze_before_training(pl_module)")

    def finetune_function(self, pl_module: TrainModule, epoch: int, optimizer: torch.optim.Optimizer) -> None:
        """Unfreeze what is due at ``epoch`` (called at every epoch's start, for every optimizer)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement finetune_function(pl_module, epoch, optimizer)"
        )

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The parameter groups, by parameter name (plain data: loads with ``weights_only=True``)."""
        return {
            "internal_optimizer_metadata": self._internal_optimizer_metadata,
            "finetuned_epoch": self._finetuned_epoch,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (also a bare metadata dict, as older Lightning wrote)."""
        self._restarting = True
        self._internal_optimizer_metadata = state_dict.get("internal_optimizer_metadata", state_dict)
        self._finetuned_epoch = state_dict.get("finetuned_epoch", -1)

    # ----------------------------------------------------------------- hooks
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        """Freeze before the optimizer is built."""
        self.freeze_before_training(pl_module)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """Rebuild the saved parameter groups before the trainer loads the optimizers' state into them."""
        own = checkpoint.get("callbacks", {}).get(self.state_key)
        if own is None or not trainer.optimizers:
            return
        metadata = own.get("internal_optimizer_metadata", own)
        self._rebuild(trainer, pl_module, metadata)
        self._restore_trainable(pl_module, own)
        self._rebuilt = True  # on_fit_start must not rebuild again: that would undo the optimizer state's rates

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """State loaded without its checkpoint (``load_state_dict`` alone): rebuild the groups now."""
        if self._restarting and not self._rebuilt and self._internal_optimizer_metadata:
            self._rebuild(trainer, pl_module, self._internal_optimizer_metadata)
        self._restarting = self._rebuilt = False

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Call :meth:`finetune_function` for every optimizer and record the groups it has now."""
        if trainer.current_epoch <= self._finetuned_epoch:
            return  # resumed in the middle of an epoch this ran for already
        self._finetuned_epoch = trainer.current_epoch
        for opt_idx, optimizer in enumerate(trainer.optimizers):
            num_param_groups = len(optimizer.param_groups)
            self.finetune_function(pl_module, trainer.current_epoch, optimizer)
            self._store(pl_module, opt_idx, num_param_groups, optimizer.param_groups)

    # ----------------------------------------------------------------- helpers (Lightning's static API)
    @staticmethod
    def flatten_modules(modules: Modules) -> list[Module]:
        """The leaf modules (and modules with parameters of their own) in ``modules``, in order."""
        if isinstance(modules, ModuleDict):
            modules = modules.values()
        if isinstance(modules, Iterable):
            found: list[Module] = []
            for m in modules:
                found.extend(BaseFinetuning.flatten_modules(m))
            candidates: Iterable[Module] = found
        else:
            candidates = modules.modules()
        return [m for m in candidates if not list(m.children()) or m._parameters]

    @staticmethod
    def filter_params(
        modules: Modules, train_bn: bool = True, requires_grad: bool = True
    ) -> Generator[torch.nn.Parameter, None, None]:
        """The parameters of ``modules`` whose ``requires_grad`` is ``requires_grad`` (batch norms' only with ``train_bn``)."""
        for mod in BaseFinetuning.flatten_modules(modules):
            if isinstance(mod, _BatchNorm) and not train_bn:
                continue
            for param in mod.parameters(recurse=False):
                if param.requires_grad == requires_grad:
                    yield param

    @staticmethod
    def make_trainable(modules: Modules) -> None:
        """Unfreeze: gradients for every parameter, running statistics for batch norms."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm):
                module.track_running_stats = True
            for param in module.parameters(recurse=False):
                param.requires_grad = True

    @staticmethod
    def freeze_module(module: Module) -> None:
        """Freeze one module's own parameters (and a batch norm's running statistics)."""
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for param in module.parameters(recurse=False):
            param.requires_grad = False

    @staticmethod
    def freeze(modules: Modules, train_bn: bool = True) -> None:
        """Freeze ``modules``; batch norms stay trainable with ``train_bn``."""
        for mod in BaseFinetuning.flatten_modules(modules):
            if isinstance(mod, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(mod)
            else:
                BaseFinetuning.freeze_module(mod)

    @staticmethod
    def filter_on_optimizer(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        """``params`` not already in ``optimizer`` (compared by value, as Lightning); warns about the others."""
        out: list[torch.Tensor] = []
        removed: list[torch.Tensor] = []
        for param in params:
            held = any(torch.equal(p, param) for group in optimizer.param_groups for p in group["params"])
            (removed if held else out).append(param)
        if removed:
            warnings.warn(
                "The provided params to be frozen already exist within another group of this optimizer."
                " Those parameters will be skipped.\n"
                "HINT: Did you init your optimizer in `configure_optimizer` as such:\n"
                f" {type(optimizer)}(filter(lambda p: p.requires_grad, self.parameters()), ...) ",
                UserWarning,
                stacklevel=2,
            )
        return out

    @staticmethod
    def unfreeze_and_add_param_group(
        modules: Modules,
        optimizer: torch.optim.Optimizer,
        lr: float | None = None,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
    ) -> None:
        """Unfreeze ``modules`` and add their parameters to ``optimizer`` as a new group.

        Its learning rate is ``lr``, or the first group's divided by ``initial_denom_lr`` when ``lr`` is None.
        """
        BaseFinetuning.make_trainable(modules)
        params_lr = optimizer.param_groups[0]["lr"] if lr is None else float(lr)
        denom_lr = initial_denom_lr if lr is None else 1.0
        params = BaseFinetuning.filter_on_optimizer(
            optimizer, BaseFinetuning.filter_params(modules, train_bn=train_bn, requires_grad=True)
        )
        if params:
            optimizer.add_param_group({"params": params, "lr": params_lr / denom_lr})

    # ----------------------------------------------------------------- internals
    @staticmethod
    def _apply_mapping_to_param_groups(
        param_groups: list[dict[str, Any]], mapping: dict[Any, Any]
    ) -> list[dict[str, Any]]:
        return [
            {**{k: v for k, v in g.items() if k != "params"}, "params": [mapping[p] for p in g["params"]]}
            for g in param_groups
        ]

    def _store(
        self, pl_module: TrainModule, opt_idx: int, num_param_groups: int, current_param_groups: list[dict[str, Any]]
    ) -> None:
        mapping = {p: n for n, p in pl_module.named_parameters()}
        if opt_idx not in self._internal_optimizer_metadata:
            self._internal_optimizer_metadata[opt_idx] = self._apply_mapping_to_param_groups(
                current_param_groups, mapping
            )
        elif num_param_groups != len(current_param_groups):
            self._internal_optimizer_metadata[opt_idx].extend(
                self._apply_mapping_to_param_groups(current_param_groups[num_param_groups:], mapping)
            )

    def _rebuild(self, trainer: Trainer, pl_module: TrainModule, metadata: dict[int, list[dict[str, Any]]]) -> None:
        """Give each optimizer the saved groups; parameters of groups added since it was built become trainable."""
        named = dict(pl_module.named_parameters())
        for opt_idx, optimizer in enumerate(trainer.optimizers):
            if opt_idx not in metadata:
                continue
            before = {id(p) for group in optimizer.param_groups for p in group["params"]}
            groups = self._apply_mapping_to_param_groups(metadata[opt_idx], named)
            optimizer.param_groups = groups
            added = {id(p) for group in groups for p in group["params"]} - before
            owners = [m for m in pl_module.modules() if any(id(p) in added for p in m.parameters(recurse=False))]
            if owners:
                self.make_trainable(owners)

    def _restore_trainable(self, pl_module: TrainModule, state: dict[str, Any]) -> None:
        """On resume, after the groups are rebuilt: unfreeze what ``finetune_function`` had unfrozen beyond
        the parameters of the added groups (a subclass that knows, e.g. batch norms left out of a group)."""


class BackboneFinetuning(BaseFinetuning):
    """Freeze ``pl_module.backbone``, unfreeze it at ``unfreeze_backbone_at_epoch`` with its own learning rate.

    At that epoch the backbone joins the optimizer as a new group at ``backbone_initial_lr`` (default:
    the current learning rate times ``backbone_initial_ratio_lr``); at every later epoch its learning
    rate is multiplied by ``lambda_func(epoch + 1)``, kept at most the current one with ``should_align``.

    Args:
        unfreeze_backbone_at_epoch: the epoch (from 0) at which the backbone starts training.
        lambda_func: epoch -> multiplier of the backbone's learning rate.
        backbone_initial_ratio_lr: the backbone's first learning rate, as a share of the current one.
        backbone_initial_lr: the backbone's first learning rate (overrides the ratio).
        should_align: never let the backbone's learning rate exceed the current one.
        initial_denom_lr: passed to :meth:`unfreeze_and_add_param_group`.
        train_bn: keep batch norms trainable while the rest is frozen.
        verbose: log the learning rates at each epoch.
        rounding: digits of the logged learning rates.
    """

    def __init__(
        self,
        unfreeze_backbone_at_epoch: int = 10,
        lambda_func: Callable[[int], float] = multiplicative,
        backbone_initial_ratio_lr: float = 1e-1,
        backbone_initial_lr: float | None = None,
        should_align: bool = True,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
        verbose: bool = False,
        rounding: int = 12,
    ) -> None:
        super().__init__()
        self.unfreeze_backbone_at_epoch = unfreeze_backbone_at_epoch
        self.lambda_func = lambda_func
        self.backbone_initial_ratio_lr = backbone_initial_ratio_lr
        self.backbone_initial_lr = backbone_initial_lr
        self.should_align = should_align
        self.initial_denom_lr = initial_denom_lr
        self.train_bn = train_bn
        self.verbose = verbose
        self.rounding = rounding
        self.previous_backbone_lr: float | None = None

    def state_dict(self) -> dict[str, Any]:
        """The groups and the backbone's last learning rate."""
        return {**super().state_dict(), "previous_backbone_lr": self.previous_backbone_lr}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.previous_backbone_lr = state_dict["previous_backbone_lr"]
        super().load_state_dict(state_dict)

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        """Refuse a module without a ``backbone`` submodule, then freeze it."""
        if not isinstance(getattr(pl_module, "backbone", None), Module):
            raise ValueError(
                f"BackboneFinetuning needs an nn.Module attribute `backbone` on {type(pl_module).__name__} "
                "(self.backbone = ...); for other layouts subclass BaseFinetuning"
            )
        super().setup(trainer, pl_module, stage)

    def freeze_before_training(self, pl_module: TrainModule) -> None:
        """Freeze the backbone (its batch norms stay trainable, as in Lightning; ``train_bn`` applies to unfreezing)."""
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module: TrainModule, epoch: int, optimizer: torch.optim.Optimizer) -> None:
        """Unfreeze at ``unfreeze_backbone_at_epoch``; afterwards, move the backbone's learning rate."""
        if epoch == self.unfreeze_backbone_at_epoch:
            current_lr = optimizer.param_groups[0]["lr"]
            initial_backbone_lr = (
                self.backbone_initial_lr
                if self.backbone_initial_lr is not None
                else current_lr * self.backbone_initial_ratio_lr
            )
            self.previous_backbone_lr = initial_backbone_lr
            self.unfreeze_and_add_param_group(
                pl_module.backbone,
                optimizer,
                initial_backbone_lr,
                train_bn=self.train_bn,
                initial_denom_lr=self.initial_denom_lr,
            )
            if self.verbose:
                log.info(
                    f"Current lr: {round(current_lr, self.rounding)}, "
                    f"Backbone lr: {round(initial_backbone_lr, self.rounding)}"
                )
        elif epoch > self.unfreeze_backbone_at_epoch:
            assert self.previous_backbone_lr is not None
            current_lr = optimizer.param_groups[0]["lr"]
            next_lr = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            if self.should_align and next_lr > current_lr:
                next_lr = current_lr
            optimizer.param_groups[-1]["lr"] = next_lr
            self.previous_backbone_lr = next_lr
            if self.verbose:
                log.info(
                    f"Current lr: {round(current_lr, self.rounding)}, Backbone lr: {round(next_lr, self.rounding)}"
                )

    def _restore_trainable(self, pl_module: TrainModule, state: dict[str, Any]) -> None:
        if state.get("previous_backbone_lr") is not None:  # the backbone had been unfrozen
            self.make_trainable(pl_module.backbone)
