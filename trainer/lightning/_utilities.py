"""The few Lightning names that have no geartrain object to alias: import flags, a model getter, the logo.

``trainer.lightning``'s table maps these under Lightning's paths (``utilities.imports``,
``utilities.model_helpers.get_torchvision_model``, ``cli_lightning_logo``, ...). Each keeps Lightning's
meaning: the availability flags are ``lightning_utilities`` requirement checks (that package comes with
torchmetrics), true when the package is installed at the version named.
"""

from __future__ import annotations

import functools
import operator
import sys
from collections.abc import Callable
from typing import Any, Union

from lightning_utilities.core.imports import RequirementCache, compare_version, package_available
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from callbacks._logger import DummyExperiment

__all__ = [
    "LIGHTNING_LOGO",
    "LRSchedulerType",
    "LRSchedulerTypeTuple",
    "cli_lightning_logo",
    "get_torchvision_model",
    "rank_zero_experiment",
]

# Lightning's availability flags (``lightning.pytorch.utilities.imports``), under its names.
_PYTHON_GREATER_EQUAL_3_11_0 = sys.version_info[:2] >= (3, 11)
_TORCH_GREATER_EQUAL_2_6 = compare_version("torch", operator.ge, "2.6.0")
_TORCH_GREATER_EQUAL_2_8 = compare_version("torch", operator.ge, "2.8.0")
_TORCH_EQUAL_2_8 = RequirementCache("torch>=2.8.0,<2.9.0")
_TORCH_EQUAL_2_9 = RequirementCache("torch>=2.9.0,<2.10.0")
_TORCHMETRICS_GREATER_EQUAL_0_8_0 = RequirementCache("torchmetrics>=0.8.0")
_TORCHMETRICS_GREATER_EQUAL_0_9_1 = RequirementCache("torchmetrics>=0.9.1")
_TORCHMETRICS_GREATER_EQUAL_0_11 = RequirementCache("torchmetrics>=0.11.0")
_TORCHMETRICS_GREATER_EQUAL_1_0_0 = RequirementCache("torchmetrics>=1.0.0")
_OMEGACONF_AVAILABLE = package_available("omegaconf")
_TORCHVISION_AVAILABLE = RequirementCache("torchvision")
_RICH_AVAILABLE = RequirementCache("rich>=10.2.2")

# ``utilities.types``' scheduler types, under Lightning's names (runtime values: a tuple for isinstance, a Union).
LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)
LRSchedulerType = Union[type[LRScheduler], type[ReduceLROnPlateau]]  # noqa: UP007

#: What :func:`cli_lightning_logo` prints (Lightning prints its own logo; geartrain prints its name).
LIGHTNING_LOGO: str = "geartrain (trainer.lightning: Lightning's API over geartrain)"


def cli_lightning_logo() -> None:
    """Print the banner a Lightning command-line program shows at start-up (a blank line either side)."""
    print()
    print("\033[0;35m" + LIGHTNING_LOGO + "\033[0m")
    print()


def get_torchvision_model(model_name: str, **kwargs: Any) -> Any:
    """``torchvision.models.get_model(model_name, **kwargs)``: a torchvision model by name (needs torchvision)."""
    if not _TORCHVISION_AVAILABLE:
        raise ModuleNotFoundError(str(_TORCHVISION_AVAILABLE))
    from torchvision import models

    return models.get_model(model_name, **kwargs)


def rank_zero_experiment(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Decorate a logger's ``experiment`` property: the real one on global rank 0, a :class:`DummyExperiment` elsewhere."""
    from trainer.common.rank_zero import rank_zero_only

    @functools.wraps(fn)
    def experiment(self: Any) -> Any:
        return DummyExperiment() if rank_zero_only.rank > 0 else fn(self)

    return experiment
