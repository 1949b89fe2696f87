"""Lightning callbacks geartrain does not have yet: the names exist, and building one says what to use.

A Lightning project importing one of these fails at the line that builds it, with the
alternative, instead of at import time with a bare ``ImportError`` (or, worse, running without it).
"""

from __future__ import annotations

from typing import Any, NoReturn

from callbacks.base import Callback

__all__ = ["UNSUPPORTED", "unsupported_class"]

#: Lightning callback name -> what to do instead.
UNSUPPORTED: dict[str, str] = {
    "WeightAveraging": "average weights yourself in on_train_batch_end with torch.optim.swa_utils.AveragedModel",
    "EMAWeightAveraging": (
        "keep an EMA copy with torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay)) "
        "updated in on_train_batch_end"
    ),
    "StochasticWeightAveraging": (
        "use torch.optim.swa_utils.AveragedModel and SWALR in your module (configure_optimizers and on_train_epoch_end)"
    ),
    "BackboneFinetuning": "freeze the backbone with module.freeze()/requires_grad_ and unfreeze it in on_train_epoch_start",
    "BaseFinetuning": "freeze and unfreeze parameters in on_train_epoch_start of a Callback of your own",
    "BasePredictionWriter": "write predictions in on_predict_batch_end / on_predict_epoch_end of a Callback of your own",
    "BatchSizeFinder": "pick the batch size yourself (trainer.Tuner offers lr_find)",
    "LearningRateFinder": "trainer.Tuner(trainer).lr_find(module, ...) before fitting",
    "GradientAccumulationScheduler": "Trainer(accumulate_grad_batches=k) with a fixed k",
    "ModelPruning": "torch.nn.utils.prune in on_train_epoch_end of a Callback of your own",
    "SpikeDetection": "Trainer's non-finite loss policy, or a check of the loss in on_train_batch_end",
}


def unsupported_class(name: str) -> type[Callback]:
    """A ``Callback`` subclass named ``name`` whose construction raises ``NotImplementedError``."""
    instead = UNSUPPORTED[name]

    def __init__(self: Callback, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"callbacks.{name} is not supported yet: {instead}")

    return type(
        name,
        (Callback,),
        {"__init__": __init__, "__doc__": f"Not supported yet: {instead}.", "__module__": "callbacks"},
    )
