"""File names for ``ModelCheckpoint``: filling the template, ``-vN`` versions, the ``last`` link."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from trainer.common.errors import UserError
from trainer.common.fs_safety import check_replaceable, swap_in

if TYPE_CHECKING:
    from trainer.trainer import Trainer

__all__ = [
    "check_lightning_options",
    "default_dirpath",
    "fill_template",
    "free_path",
    "plan_top_k",
    "rank_key",
    "save_message",
    "symlink",
]

_FIELD = re.compile(r"\{([^{}:]+)(:[^{}]*)?\}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+\-]")  # anything else (/, :, spaces, ...) becomes "_" in names


def check_lightning_options(
    save_last: Any,
    every_n_train_steps: int | None,
    every_n_epochs: int | None,
    train_time_interval: Any,
    monitor: str | None,
    save_top_k: int,
) -> None:
    """Refuse what Lightning's ``ModelCheckpoint`` refuses: an unknown ``save_last``, two schedules at
    once, a top k above one with nothing to rank by.

    Raises:
        UserError: naming the option(s) (a ``ValueError`` and Lightning's ``MisconfigurationException``).
    """
    if save_last not in (None, True, False, "link"):
        raise ValueError(f"save_last must be True, False, None or 'link', got {save_last!r}")
    if monitor is None and save_top_k not in (-1, 0, 1):
        raise UserError(
            f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None) is not a valid configuration. No quantity "
            "for top_k to track: pass monitor= a logged metric, or save_top_k=-1 (keep every save) or 1 (the newest)."
        )
    schedules = {"every_n_train_steps": every_n_train_steps, "every_n_epochs": every_n_epochs}
    given = [name for name, value in {**schedules, "train_time_interval": train_time_interval}.items() if value]
    if len(given) > 1:
        raise UserError(
            f"ModelCheckpoint: {' and '.join(given)} are mutually exclusive (as in Lightning); pick one. "
            f"Combination of parameters every_n_train_steps={every_n_train_steps}, every_n_epochs={every_n_epochs} "
            f"and train_time_interval={train_time_interval} should be mutually exclusive."
        )


def fill_template(template: str, metrics: dict[str, Any], insert_names: bool = True, equals: str = "=") -> str:
    """``template`` with every ``{name[:spec]}`` filled from ``metrics`` (``nan`` where missing).

    A field becomes ``name=value`` (``insert_names``) or ``value``; characters other than letters,
    digits and ``._=+-`` become ``_``, so every metric name gives a valid file name.

    >>> fill_template("{epoch}-{val/acc:.2f}", {"epoch": 3, "val/acc": 0.912})
    'epoch=3-val_acc=0.91'
    >>> fill_template("e{epoch:02d}", {"epoch": 3}, insert_names=False)
    'e03'
    """

    def fill(match: re.Match[str]) -> str:
        name, spec = match.group(1), match.group(2) or ""
        value = metrics.get(name)
        if isinstance(value, torch.Tensor):
            value = value.item()
        text = "nan" if value is None else format(value, spec[1:])
        return f"{name}{equals}{text}" if insert_names else text

    unsafe = _UNSAFE if equals == "=" else re.compile(rf"[^A-Za-z0-9._=+\-{re.escape(equals)}]")
    return unsafe.sub("_", _FIELD.sub(fill, template))


def free_path(path: str, taken: Callable[[str], bool], first_version: int = 1, join: str = "-") -> str:
    """``path`` if not ``taken``, else the first free ``<stem>-v<N><suffix>`` (Lightning's version counter).

    >>> free_path("a/epoch=1.ckpt", lambda p: p in {"a/epoch=1.ckpt", "a/epoch=1-v1.ckpt"})
    'a/epoch=1-v2.ckpt'
    """
    stem, suffix = os.path.splitext(path)
    candidate, version = path, first_version
    while taken(candidate):
        candidate = f"{stem}{join}v{version}{suffix}"
        version += 1
    return candidate


def symlink(target: str, link: str) -> None:
    """Point ``link`` at ``target`` (relative to the link's folder), replacing what was there atomically.

    A sharded checkpoint directory at ``link`` (an earlier save without links) is moved aside and
    removed once the link is in place; anything else that is not a checkpoint is refused.
    """
    check_replaceable(link)
    tmp = f"{link}.tmp-link"
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(os.path.relpath(target, os.path.dirname(link) or "."), tmp)
    swap_in(tmp, link)


def save_message(
    epoch: int, step: int, monitor: str | None, top_k: int, score: float | None, best: float | None, path: str | None
) -> str:
    """The line ``ModelCheckpoint(verbose=True)`` prints for a ranked save, worded as Lightning's.

    >>> save_message(1, 8, "val/acc", 1, 0.5, 0.5, "a.ckpt")
    "Epoch 1, global step 8: 'val/acc' reached 0.50000 (best 0.50000), saving model to 'a.ckpt' as top 1"
    """
    where = f"Epoch {epoch:d}, global step {step:d}: "
    if path is None:
        return f"{where}{monitor!r} was not in top {top_k}"
    if score is None or best is None:
        return f"{where}saving model to {path!r}"
    return f"{where}{monitor!r} reached {score:0.5f} (best {best:0.5f}), saving model to {path!r} as top {top_k}"


def rank_key(score: float, mode: str) -> float:
    """``score`` as ``mode="min"`` ranks it; NaN counts as the worst possible."""
    if math.isnan(score):
        return math.inf
    return score if mode == "min" else -score


def plan_top_k(
    best_k_models: dict[str, float], k: int, path: str, score: float | None, mode: str
) -> tuple[bool, list[str]]:
    """Whether a checkpoint at ``path`` with ``score`` joins the ``k`` kept, and which files it evicts.

    ``best_k_models``: the kept files and their scores, oldest first; ``score`` None (no monitor)
    keeps the newest ``k``.
    """
    if k == 0:
        return False, []
    others = {p: s for p, s in best_k_models.items() if p != path}
    if k == -1 or len(others) < k:
        return True, []
    if score is None:
        return True, list(others)[: len(others) - k + 1]
    worst = max(others, key=lambda p: rank_key(others[p], mode))
    if rank_key(score, mode) < rank_key(others[worst], mode):
        return True, [worst]
    return False, []


def default_dirpath(trainer: Trainer) -> str:
    """Lightning's default folder: ``<save_dir>/<name>/<version>/checkpoints`` of the first logger
    (``version_N`` for a number), else ``<default_root_dir>/checkpoints``: each run its own folder."""
    loggers = list(getattr(trainer, "loggers", None) or [])
    if not loggers:
        return str(trainer.checkpointing.default_directory())
    logger = loggers[0]
    save_dir = getattr(logger, "save_dir", None) or trainer.default_root_dir
    version = logger.version
    version = version if isinstance(version, str) else f"version_{version}"
    return os.path.join(save_dir, str(logger.name), version, "checkpoints")
