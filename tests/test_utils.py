"""``move_to_device`` / ``Strategy.batch_to_device`` on nested batches, and ``batch_size_of``."""

from __future__ import annotations

from collections import OrderedDict, defaultdict, namedtuple
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from strategies import SingleDeviceStrategy
from strategies.precision import HalfPrecision
from trainer import seed_everything
from trainer.common.tree import device_mover
from trainer.utils import apply_to_tensors, batch_size_of, move_to_device

META = torch.device("meta")  # a second device every machine has: moving there is observable

Pair = namedtuple("Pair", ["x", "y"])


@dataclass
class Sample:
    image: torch.Tensor
    label: torch.Tensor
    name: str
    extras: dict[str, Any] = field(default_factory=dict)


class Opaque:
    """An object the trainer knows nothing about; it must come back as the very same object."""

    def __init__(self) -> None:
        self.tensor = torch.ones(2)  # not looked into: it is the user's business


def test_move_to_device_rebuilds_containers_and_keeps_other_objects() -> None:
    opaque, text = Opaque(), "label"
    batch = {
        "list": [torch.ones(2), opaque, 3],
        "tuple": (torch.ones(1), text),
        "pair": Pair(torch.ones(3), torch.zeros(3, dtype=torch.long)),
        "sample": Sample(torch.ones(2, 2), torch.tensor([1]), "a", {"mask": torch.ones(2)}),
        "ordered": OrderedDict(a=torch.ones(1)),
        "none": None,
    }
    moved = move_to_device(batch, META)

    assert type(moved) is dict and moved.keys() == batch.keys()
    assert moved["list"][0].device == META and moved["list"][1] is opaque and moved["list"][2] == 3
    assert opaque.tensor.device.type == "cpu"
    assert type(moved["tuple"]) is tuple and moved["tuple"][0].device == META and moved["tuple"][1] is text
    assert type(moved["pair"]) is Pair
    assert moved["pair"].x.device == META and moved["pair"].y.dtype == torch.long
    sample = moved["sample"]
    assert type(sample) is Sample and sample.name == "a"
    assert sample.image.device == META and sample.label.device == META and sample.extras["mask"].device == META
    assert type(moved["ordered"]) is OrderedDict and moved["ordered"]["a"].device == META
    assert moved["none"] is None
    assert batch["list"][0].device.type == "cpu"  # the input batch is not modified in place


def test_the_loops_mover_does_what_move_to_device_does() -> None:
    """``device_mover(device)`` (what the loops call per batch) is ``move_to_device`` to that device."""
    cpu = device_mover(torch.device("cpu"))
    in_place = (torch.ones(2), torch.zeros(2, dtype=torch.long))
    assert cpu(in_place) is in_place  # the usual batch, already on the CPU: returned as it is
    listed = [torch.ones(1)]
    assert cpu(listed) is listed
    mixed = (torch.ones(1), "id-7")  # not only tensors: rebuilt as move_to_device rebuilds it
    assert type(cpu(mixed)) is tuple and cpu(mixed)[1] == "id-7"
    off_cpu = (torch.ones(1), torch.ones(1, device=META))
    with pytest.raises(NotImplementedError, match="meta"):  # a tensor elsewhere is moved (meta has no data)
        cpu(off_cpu)
    assert cpu({"x": torch.ones(1)})["x"].device.type == "cpu"
    moved = device_mover(META)(in_place)
    assert [t.device for t in moved] == [META, META]


def test_objects_without_tensors_come_back_identical() -> None:
    for obj in (Opaque(), "text", 3, 2.5, None, b"bytes"):
        assert move_to_device(obj, META) is obj


def test_defaultdict_keeps_its_default_factory() -> None:
    batch: defaultdict[str, Any] = defaultdict(list, {"x": torch.ones(1)})
    moved = move_to_device(batch, META)
    assert type(moved) is defaultdict and moved.default_factory is list
    assert moved["x"].device == META
    assert moved["missing"] == []


def test_strategy_batch_to_device_moves_and_casts_with_the_precision() -> None:
    strategy = SingleDeviceStrategy(device="meta")
    moved = strategy.batch_to_device((torch.ones(2), {"y": torch.zeros(2, dtype=torch.long)}))
    assert moved[0].device == META and moved[1]["y"].device == META

    half = SingleDeviceStrategy(precision=HalfPrecision(), device="cpu")
    x, y = half.batch_to_device((torch.ones(2), torch.zeros(2, dtype=torch.long)))
    assert x.dtype == torch.bfloat16 and y.dtype == torch.long  # only floating point is cast


def test_apply_to_tensors_applies_a_function() -> None:
    out = apply_to_tensors([torch.ones(2), (torch.zeros(1),)], lambda t: t + 1)
    assert torch.equal(out[0], torch.full((2,), 2.0)) and torch.equal(out[1][0], torch.ones(1))


@pytest.mark.parametrize(
    ("batch", "size"),
    [
        (torch.zeros(5, 3), 5),
        (torch.tensor(2.0), 1),
        ((torch.zeros(4, 2), torch.zeros(4)), 4),
        ({"text": ["a", "b"], "ids": torch.zeros(3, 7)}, 3),
        ({"ids": torch.zeros(6, 2), "mask": torch.zeros(2)}, 6),
        (Sample(torch.zeros(7, 2), torch.zeros(7), "n"), 7),
        (Pair([torch.zeros(2, 1)], torch.zeros(9)), 2),
        (["no", "tensors"], 1),
        ("text", 1),
        (None, 1),
    ],
)
def test_batch_size_of(batch: Any, size: int) -> None:
    assert batch_size_of(batch) == size


def test_seed_everything_makes_torch_repeatable() -> None:
    seed_everything(3)
    a = torch.rand(3)
    seed_everything(3)
    assert torch.equal(a, torch.rand(3))
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*32\)"):
        seed_everything(-1)
