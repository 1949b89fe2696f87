"""Lazy layers train however the data comes, under every strategy, with the run's state untouched.

The shapes come from one forward before the strategy wraps the module; the loaders passed to
``fit``, a data module's and the module's own ``train_dataloader()`` must all give the same run,
bitwise, and so must ``example_input_array`` (the forward moves no batch-norm statistics).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.helpers import lazy_jobs
from tests.helpers.distributed import spawn


def _assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_every_way_of_giving_data_trains_the_same_lazy_module() -> None:
    expected = lazy_jobs.fit("loader")
    assert expected["net.0.weight"].shape == (12, 5)
    for route in ("datamodule", "module", "example"):
        _assert_equal(lazy_jobs.fit(route), expected)


def test_a_module_without_forward_trains_on_one_device_as_in_plain_pytorch() -> None:
    # Lightning-style: the layers are called in training_step; the first step gives the shapes.
    for route in ("loader", "datamodule"):
        state = lazy_jobs.fit(route, no_forward=True)
        assert state["net.0.weight"].shape == (12, 5) and torch.isfinite(state["net.0.weight"]).all()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lazy_layers_with_a_data_module_under_ddp_and_fsdp() -> None:
    results: list[dict[str, Any]] = spawn(lazy_jobs.ranks, ["ddp", "fsdp"], world_size=2)
    for rank in results:
        for strategy in ("ddp", "fsdp"):
            _assert_equal(rank[strategy]["datamodule"], rank[strategy]["loader"])
        # Without forward() the trainer cannot give the shapes before DDP wraps the module: one line says so.
        assert "define forward() and set `self.example_input_array`" in rank["no_forward"]
