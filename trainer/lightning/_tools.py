"""Lightning's small public helpers that work on a module, a collection or an exception, not on a run.

``trainer.lightning``'s table maps them under Lightning's paths (``utilities.parameter_tying``,
``utilities.memory``, ``utilities.enums``, ``utilities.parsing.is_picklable``, ...), each with
Lightning's meaning, so programs that call them port by their imports alone. Nothing in geartrain's
training path uses them.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from lightning_utilities.core.enums import StrEnum

from trainer.hparams import is_picklable

__all__ = [
    "FLOAT16_EPSILON",
    "FLOAT32_EPSILON",
    "FLOAT64_EPSILON",
    "GradClipAlgorithmType",
    "LightningEnum",
    "find_shared_parameters",
    "garbage_collection_cuda",
    "is_cuda_out_of_memory",
    "is_cudnn_snafu",
    "is_oom_error",
    "is_out_of_cpu_memory",
    "is_picklable",
    "lightning_getattr",
    "lightning_hasattr",
    "lightning_setattr",
    "measure_flops",
    "parse_class_init_keys",
    "recursive_detach",
    "set_shared_parameters",
    "suggested_max_num_workers",
]

#: The machine epsilon of each float type, under Lightning's names.
FLOAT16_EPSILON = torch.finfo(torch.float16).eps
FLOAT32_EPSILON = torch.finfo(torch.float32).eps
FLOAT64_EPSILON = torch.finfo(torch.float64).eps


class LightningEnum(StrEnum):
    """A string enum compared without regard to case (``GradClipAlgorithmType.NORM == "Norm"``)."""


class GradClipAlgorithmType(LightningEnum):
    """What ``gradient_clip_algorithm`` can be: clip the gradients' total norm, or each value."""

    VALUE = "value"
    NORM = "norm"

    @staticmethod
    def supported_type(val: str) -> bool:
        """Whether ``val`` is one of the values (case matters, as in Lightning)."""
        return val in GradClipAlgorithmType.supported_types()

    @staticmethod
    def supported_types() -> list[str]:
        """The values: ``["value", "norm"]``."""
        return [member.value for member in GradClipAlgorithmType]


def find_shared_parameters(module: torch.nn.Module) -> list[list[str]]:
    """Groups of names under which one parameter object appears more than once (tied weights).

    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    >>> net[1].weight = net[0].weight
    >>> find_shared_parameters(net)
    [['0.weight', '1.weight']]
    """
    names: dict[torch.nn.Parameter, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        names.setdefault(param, []).append(name)
    return [group for group in names.values() if len(group) > 1]


def set_shared_parameters(module: torch.nn.Module, shared_params: list[list[str]]) -> torch.nn.Module:
    """Tie again what :func:`find_shared_parameters` found (after a move or a copy broke the ties).

    Every name of a group is set to the first name's parameter; returns ``module``.
    """
    for group in shared_params:
        ref = module.get_parameter(group[0])
        for path in group[1:]:
            owner, _, attr = path.rpartition(".")
            setattr(module.get_submodule(owner), attr, ref)
    return module


def recursive_detach(in_dict: Any, to_cpu: bool = False) -> Any:
    """The collection with every tensor detached (and moved to the CPU with ``to_cpu``)."""

    def detach(t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        return t.cpu() if to_cpu else t

    return apply_to_collection(in_dict, torch.Tensor, detach)


def _message_of(exception: BaseException) -> str | None:
    """The one string argument of a ``RuntimeError``, the form torch's allocation errors take."""
    if isinstance(exception, RuntimeError) and len(exception.args) == 1 and isinstance(exception.args[0], str):
        return exception.args[0]
    return None


def is_cuda_out_of_memory(exception: BaseException) -> bool:
    """Whether ``exception`` is CUDA running out of memory."""
    text = _message_of(exception)
    return text is not None and "CUDA" in text and "out of memory" in text


def is_cudnn_snafu(exception: BaseException) -> bool:
    """Whether ``exception`` is cuDNN's "not supported", which large inputs cause like a lack of memory."""
    text = _message_of(exception)
    return text is not None and "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED." in text


def is_out_of_cpu_memory(exception: BaseException) -> bool:
    """Whether ``exception`` is the CPU allocator failing."""
    text = _message_of(exception)
    return text is not None and "DefaultCPUAllocator: can't allocate memory" in text


def is_oom_error(exception: BaseException) -> bool:
    """Whether ``exception`` says memory ran out (CUDA, cuDNN or CPU)."""
    return is_cuda_out_of_memory(exception) or is_cudnn_snafu(exception) or is_out_of_cpu_memory(exception)


def garbage_collection_cuda() -> None:
    """Collect Python's garbage, then give CUDA's cached blocks back; an out-of-memory error there is ignored."""
    gc.collect()
    try:
        torch.cuda.empty_cache()
    except RuntimeError as exception:
        if not is_oom_error(exception):
            raise


def suggested_max_num_workers(local_world_size: int) -> int:
    """An upper bound for ``DataLoader(num_workers=)``: this process's CPUs shared by the processes of
    this machine, one left for each main process; at least 1.

    Raises:
        ValueError: ``local_world_size`` below 1.
    """
    if local_world_size < 1:
        raise ValueError(f"`local_world_size` should be >= 1, got {local_world_size}.")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // local_world_size - 1)


def measure_flops(
    model: torch.nn.Module,
    forward_fn: Callable[[], torch.Tensor],
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> int:
    """The floating-point operations of ``forward_fn()`` (and of the backward of ``loss_fn`` of it), counted
    by ``torch.utils.flop_counter.FlopCounterMode``; build ``model`` on the meta device to count for free."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        out = forward_fn()
        if loss_fn is not None:
            loss_fn(out).backward()
    return counter.get_total_flops()


def parse_class_init_keys(cls: type) -> tuple[str, str | None, str | None]:
    """The names ``cls.__init__`` gives its ``self``, ``*args`` and ``**kwargs`` (None for one it lacks)."""
    import inspect

    params = list(inspect.signature(cls.__init__).parameters.values())  # type: ignore[misc]
    varargs = next((p.name for p in params if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
    varkw = next((p.name for p in params if p.kind is inspect.Parameter.VAR_KEYWORD), None)
    return params[0].name, varargs, varkw


def _attribute_holders(model: Any, attribute: str) -> list[Any]:
    """Where ``attribute`` lives: the module, its ``hparams``, its trainer's data module, that one's ``hparams``."""
    holders: list[Any] = []
    datamodule = getattr(getattr(model, "_trainer", None), "datamodule", None)
    for owner in (model, datamodule):
        if owner is None:
            continue
        if hasattr(owner, attribute):
            holders.append(owner)
        hparams = getattr(owner, "hparams", None)
        if hparams is not None and attribute in hparams:
            holders.append(hparams)
    return holders


def _missing(attribute: str) -> AttributeError:
    return AttributeError(
        f"{attribute} is neither stored in the model namespace nor the `hparams` namespace/dict, nor the datamodule."
    )


def lightning_hasattr(model: Any, attribute: str) -> bool:
    """Whether the module, its ``hparams``, its data module or that one's ``hparams`` has ``attribute``."""
    return bool(_attribute_holders(model, attribute))


def lightning_getattr(model: Any, attribute: str) -> Any:
    """``attribute`` from the last of :func:`lightning_hasattr`'s places that has it (the data module's first)."""
    holders = _attribute_holders(model, attribute)
    if not holders:
        raise _missing(attribute)
    holder = holders[-1]
    return holder[attribute] if isinstance(holder, dict) else getattr(holder, attribute)


def lightning_setattr(model: Any, attribute: str, value: Any) -> None:
    """Set ``attribute`` in every one of :func:`lightning_hasattr`'s places that has it (the tuner's batch size)."""
    holders = _attribute_holders(model, attribute)
    if not holders:
        raise _missing(attribute)
    for holder in holders:
        if isinstance(holder, dict):
            holder[attribute] = value
        else:
            setattr(holder, attribute, value)
