"""Lightning's small public helpers under its paths (``utilities.parameter_tying``, ``.memory``, ``.enums``, ...).

Each is checked for what a program relies on: tied weights stay one tensor through training, the
clip enum trains as its string does, the FLOP count is the arithmetic of the layer.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch
from trainer.lightning.demos.boring_classes import BoringModel
from trainer.lightning.utilities import (
    FLOAT32_EPSILON,
    GradClipAlgorithmType,
    find_shared_parameters,
    measure_flops,
    set_shared_parameters,
    suggested_max_num_workers,
)
from trainer.lightning.utilities.memory import is_oom_error, recursive_detach
from trainer.lightning.utilities.parsing import is_picklable

import trainer.lightning as pl
from tests.helpers.trainers import quiet_trainer


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(3, 3, bias=False)
        self.decoder = torch.nn.Sequential(torch.nn.Linear(3, 3, bias=False))
        self.decoder[0].weight = self.encoder.weight


def test_shared_parameters_are_found_and_tied_again() -> None:
    net = Tied()
    groups = find_shared_parameters(net)
    assert groups == [["encoder.weight", "decoder.0.weight"]]
    assert find_shared_parameters(torch.nn.Linear(2, 2)) == []
    net.decoder[0].weight = torch.nn.Parameter(net.encoder.weight.detach().clone())  # the tie broken
    assert find_shared_parameters(net) == []
    assert set_shared_parameters(net, groups) is net
    assert net.decoder[0].weight is net.encoder.weight
    net.encoder.weight.data.add_(1.0)
    assert torch.equal(net.decoder[0].weight, net.encoder.weight)


def test_recursive_detach_keeps_the_collection() -> None:
    x = torch.ones(2, requires_grad=True) * 2
    out = recursive_detach({"a": [x, 3], "b": (x,)}, to_cpu=True)
    assert out["a"][1] == 3 and not out["a"][0].requires_grad and not out["b"][0].requires_grad
    assert torch.equal(out["a"][0], x.detach()) and x.requires_grad


def test_memory_errors_are_told_apart() -> None:
    assert is_oom_error(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert is_oom_error(RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: 8 bytes"))
    assert not is_oom_error(RuntimeError("shape mismatch"))
    assert not is_oom_error(ValueError("CUDA out of memory"))


def test_clip_enum_is_the_string_it_names() -> None:
    assert GradClipAlgorithmType.VALUE == "value" and GradClipAlgorithmType.NORM == "Norm"
    assert GradClipAlgorithmType.supported_types() == ["value", "norm"]
    assert GradClipAlgorithmType.supported_type("norm") and not GradClipAlgorithmType.supported_type("max")
    weights = {}
    for algorithm in ("value", GradClipAlgorithmType.VALUE):
        torch.manual_seed(0)
        module = BoringModel()
        quiet_trainer(max_steps=3, gradient_clip_val=1e-3, gradient_clip_algorithm=algorithm).fit(module)
        weights[str(algorithm)] = copy.deepcopy(module.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(*(w.values() for w in weights.values())))


def test_small_helpers_answer_as_lightnings() -> None:
    assert torch.finfo(torch.float32).eps == FLOAT32_EPSILON
    assert is_picklable([1, "a"]) and not is_picklable(lambda: 1)
    cpus = len(os.sched_getaffinity(0))
    assert suggested_max_num_workers(1) == max(1, cpus - 1)
    with pytest.raises(ValueError, match="local_world_size"):
        suggested_max_num_workers(0)
    layer = torch.nn.Linear(8, 4, bias=False)
    x = torch.randn(5, 8)
    assert measure_flops(layer, lambda: layer(x)) == 2 * 5 * 8 * 4  # a multiply and an add per weight and row
    # The backward adds the weight's gradient, as many again (the input needs none).
    assert measure_flops(layer, lambda: layer(x), lambda y: y.sum()) == 2 * (2 * 5 * 8 * 4)


def test_version_and_the_possible_user_warnings_switch() -> None:
    assert pl.__version__.startswith("2.")
    code = (
        "import warnings, trainer.lightning\n"
        "from trainer.common.errors import PossibleUserWarning\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.warn('x', PossibleUserWarning)\n"
        "print(len(seen))\n"
    )
    for setting, expected in (("off", "0"), ("1", "1")):
        env = {**os.environ, "POSSIBLE_USER_WARNINGS": setting}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == expected
