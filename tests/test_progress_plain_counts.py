"""Plain progress lines count batches in words that read right: "1 batch", "2 batches"."""

from __future__ import annotations

import io
import re

from callbacks import ProgressBar
from tests.helpers.callback_tools import Scripted, loaders
from tests.helpers.trainers import quiet_trainer


def test_one_validation_batch_is_one_batch() -> None:
    out = io.StringIO()
    train, val = loaders(n_val=8)  # one validation batch of 8
    quiet_trainer(callbacks=[ProgressBar(stream=out)], max_epochs=1, num_sanity_val_steps=0).fit(Scripted(), train, val)
    (line,) = [line for line in out.getvalue().splitlines() if line.startswith("validation")]
    assert re.match(r"validation \| epoch 0 \| 1 batch \| ", line), line
