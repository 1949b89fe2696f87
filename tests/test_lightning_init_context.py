"""``strategy.tensor_init_context(empty_init)`` and ``trainer.init_module(empty_init)`` as Lightning 2.6's
(issue #33, found by Lightning's suite): modules built inside are on the strategy's device in the
precision's dtype; ``empty_init=True`` skips the weights' initialisation, else they are initialised as
anywhere else (same weights as a module built outside, from the same seed).
"""

from __future__ import annotations

import pytest
import torch
from trainer.lightning.plugins import DoublePrecision, HalfPrecision, Precision

from strategies import SingleDeviceStrategy
from tests.helpers.trainers import quiet_trainer


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [(Precision(), torch.float32), (DoublePrecision(), torch.float64), (HalfPrecision("16-true"), torch.float16)],
)
@pytest.mark.parametrize("empty_init", [None, False, True])
def test_tensor_init_context_places_casts_and_initialises_unless_told(
    precision: Precision, dtype: torch.dtype, empty_init: bool | None
) -> None:
    strategy = SingleDeviceStrategy(device="cpu", precision_plugin=precision)
    torch.manual_seed(0)
    expected = torch.nn.Linear(3, 2, dtype=dtype).weight
    torch.manual_seed(0)
    with strategy.tensor_init_context(empty_init=empty_init):
        layer = torch.nn.Linear(3, 2)
        filled = torch.empty(4).fill_(0.5)  # not an initialiser: runs under empty_init=True too
    assert layer.weight.dtype == layer.bias.dtype == filled.dtype == dtype
    assert layer.weight.device == layer.bias.device == torch.device("cpu")
    assert bool((filled == 0.5).all())
    if not empty_init:
        assert torch.equal(layer.weight, expected)  # the same draws as outside the context


def test_init_module_skips_initialisation_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    original = torch.Tensor.uniform_

    def counted(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append("uniform_")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "uniform_", counted)
    trainer = quiet_trainer()
    for empty_init, initialised in ((None, True), (False, True), (True, False)):
        calls.clear()
        with trainer.init_module(empty_init=empty_init):
            torch.nn.Linear(2, 2)
        assert bool(calls) is initialised, empty_init
