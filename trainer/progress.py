"""Every counter of a run in one checkpointable object."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["Progress"]


@dataclass
class Progress:
    """Where a run stands. Saved whole into checkpoints and restored whole on resume.

    Attributes:
        epoch: the training epoch in progress (or last finished), from 0.
        global_step: optimizer steps taken.
        batch_in_epoch: training batches consumed in ``epoch``.
        epoch_finished: True once ``epoch``'s end-of-epoch work (validation, schedulers) is done,
            so a resume starts at ``epoch + 1``.
        should_stop: set by callbacks (early stopping, timers) to end training after this step.
        skipped_steps: optimizer steps skipped by the precision plugin (fp16 overflow).
        nonfinite_skipped: optimizer steps dropped for a non-finite loss (``on_nonfinite="skip"``).
        nonfinite_in_a_row: such steps since the last good one.
        batches_before_epoch: training batches of the finished epochs (for validation every n batches
            across epochs, ``check_val_every_n_epoch=None``).
        validated_at: ``batches_before_epoch + batch_in_epoch`` when the latest validation inside the
            training loop started (-1: none yet). A resume from a checkpoint saved after a batch at
            which validation was due, but before it ran (``on_train_batch_end``, a preemption save),
            runs that validation first, so it draws its random numbers as the uninterrupted run did.
    """

    epoch: int = 0
    global_step: int = 0
    batch_in_epoch: int = 0
    epoch_finished: bool = False
    should_stop: bool = False
    skipped_steps: int = 0
    nonfinite_skipped: int = 0
    nonfinite_in_a_row: int = 0
    batches_before_epoch: int = 0
    validated_at: int = -1

    def state_dict(self) -> dict[str, Any]:
        """The counters as a plain dict."""
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counters; keys this version does not know are ignored."""
        for f in fields(self):
            if f.name in state:
                setattr(self, f.name, type(getattr(self, f.name))(state[f.name]))
