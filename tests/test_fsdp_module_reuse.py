"""A module that FSDP sharded in place, reused by a one-process Trainer: one line says what happened and what to do.

After ``fit`` with FSDP the module's parameters stay sharded (DTensors), as in Lightning. A one-process
Trainer given that module used to fail deep inside torch's first forward ("mixed torch.Tensor and
DTensor"); the strategy refuses it before anything runs, naming the parameter and the ways out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.distributed import restored_environment
from tests.helpers.tiny_mlp import TinyMLP, make_batches
from tests.helpers.trainers import quiet_trainer
from trainer.common.errors import UserError


def test_a_module_fsdp_sharded_is_refused_by_a_one_process_trainer_in_one_line(tmp_path: Path) -> None:
    module = TinyMLP()
    with restored_environment():
        quiet_trainer(tmp_path / "fsdp", strategy="fsdp", accelerator="cpu", devices=1, max_steps=2).fit(
            module, make_batches(2)
        )
        from torch.distributed.tensor import DTensor

        assert isinstance(module.net[0].weight, DTensor)  # sharded in place, as Lightning leaves it
        one = quiet_trainer(tmp_path / "one", strategy="single", accelerator="cpu", max_steps=2)
        with pytest.raises(UserError) as refused:
            one.fit(module, make_batches(2))
    message = str(refused.value)
    assert "\n" not in message
    assert "parameter 'net.0.weight' is sharded across processes (a DTensor)" in message
    assert "strategy='fsdp'" in message and "load_from_checkpoint" in message and "model_state_dict()" in message
