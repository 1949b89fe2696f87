"""grad_norm and callbacks.GradientMonitor: gradient norms as Lightning names them, and histograms."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.nn import functional as F

import callbacks as cbs
from tests.helpers.callback_tools import Recorder
from tests.helpers.regression import Regressor, make_loader, plain_copy, sgd
from tests.helpers.trainers import quiet_trainer, spawned
from trainer.utils import grad_norm


def _with_grads() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    net[2].bias.requires_grad_(False)  # a parameter without a gradient gets no entry
    net(torch.randn(5, 3)).pow(2).sum().backward()
    return net


@pytest.mark.parametrize("norm_type", [2, 1.0, "inf", 3.5])
def test_grad_norm_equals_vector_norms_of_the_gradients_by_hand(norm_type: float | str) -> None:
    net = _with_grads()
    p = float(norm_type)
    norms = grad_norm(net, norm_type)
    grads = {name: param.grad for name, param in net.named_parameters() if param.grad is not None}
    assert list(norms) == [f"grad_{p}_norm/{name}" for name in grads] + [f"grad_{p}_norm_total"]
    for name, grad in grads.items():
        assert torch.equal(norms[f"grad_{p}_norm/{name}"], torch.linalg.vector_norm(grad, ord=p))
    every = torch.cat([g.flatten() for g in grads.values()])
    total = norms[f"grad_{p}_norm_total"]
    assert total.dim() == 0 and torch.allclose(total, torch.linalg.vector_norm(every, ord=p), rtol=1e-6)


def test_grad_norm_refuses_a_non_positive_norm_and_is_empty_without_gradients() -> None:
    with pytest.raises(ValueError, match=r"`norm_type` must be a positive number or .inf."):
        grad_norm(_with_grads(), 0)
    assert grad_norm(nn.Linear(2, 2), 2) == {}
    assert set(grad_norm(_with_grads(), 2, group_separator="_")) >= {"grad_2.0_norm_0.weight"}


def test_monitor_logs_the_norms_of_the_gradients_a_hand_written_loop_computes(tmp_path: Path) -> None:
    module, recorder = Regressor(), Recorder()
    reference = plain_copy(module)
    monitor = cbs.GradientMonitor(log_every_n_steps=2)
    quiet_trainer(tmp_path, callbacks=[monitor, recorder], max_epochs=1).fit(module, make_loader(20, 4))
    # The same five steps by hand: the norms at steps 0, 2 and 4 (every second step, from the first).
    optimizer, expected = sgd(reference), {}
    for step, (x, y) in enumerate(make_loader(20, 4)):
        F.mse_loss(reference(x), y).backward()
        if step % 2 == 0:
            for name, param in reference.named_parameters():
                assert param.grad is not None
                expected[(f"grad_2.0_norm/net.{name}", step)] = float(torch.linalg.vector_norm(param.grad))
        optimizer.step()
        optimizer.zero_grad()
    logged = {(tag, step): value for tag, step, value in recorder.rows if tag.startswith("grad_2.0_norm/")}
    assert logged == expected  # bitwise: the same gradients, the same norm
    totals = recorder.of("grad_2.0_norm_total")
    assert [step for step, _ in totals] == [0, 2, 4]
    for step, total in totals:
        parts = [value for (tag, s), value in expected.items() if s == step]
        assert total == pytest.approx(math.sqrt(sum(v * v for v in parts)), rel=1e-6)


def test_monitor_draws_weight_and_gradient_histograms_in_tensorboard(tmp_path: Path) -> None:
    logger = cbs.TensorBoardLogger(tmp_path)
    monitor = cbs.GradientMonitor(log_every_n_steps=3, histograms=True)
    quiet_trainer(tmp_path, callbacks=[monitor], logger=logger, max_epochs=1).fit(Regressor(), make_loader(24, 4))
    acc = EventAccumulator(str(logger.log_dir), size_guidance={"histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    assert "grad_2.0_norm_total" in tags["scalars"]
    names = [f"net.{i}.{kind}" for i in (0, 2) for kind in ("weight", "bias")]
    assert set(tags["histograms"]) == {f"{what}/{n}" for what in ("weights", "gradients") for n in names}
    events = acc.Histograms("gradients/net.0.weight")
    assert [e.step for e in events] == [0, 3] and events[0].histogram_value.num == 8 * 4


def test_monitor_is_off_unless_added_and_checks_its_arguments() -> None:
    assert not any(isinstance(cb, cbs.GradientMonitor) for cb in quiet_trainer(logger=None).callbacks)
    with pytest.raises(ValueError, match=r"log_every_n_steps=0"):
        cbs.GradientMonitor(log_every_n_steps=0)
    with pytest.raises(ValueError, match=r"norm_type=-1"):
        cbs.GradientMonitor(norm_type=-1)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_under_ddp_and_fsdp_the_norms_are_of_the_full_synchronised_gradients(tmp_path: Path, strategy: str) -> None:
    # Two ranks on half batches of 4 train like one process on batches of 8 (the DDP/FSDP contract), so
    # the norms rank 0 logs are those of the one-process gradients (up to the all-reduce's rounding);
    # under FSDP each rank holds a shard of each gradient, gathered into the norm of the whole.
    def run(root: Path, batch_size: int, **kwargs: object) -> dict[tuple[str, int], float]:
        recorder_path = root / "csv"
        logger = cbs.CSVLogger(recorder_path, name="", version="")
        monitor = cbs.GradientMonitor(log_every_n_steps=1)
        quiet_trainer(root, callbacks=[monitor], logger=logger, max_epochs=1, **kwargs).fit(
            Regressor(), make_loader(32, batch_size)
        )
        rows = list(csv.DictReader((recorder_path / "metrics.csv").open()))
        return {(k, int(r["step"])): float(v) for r in rows for k, v in r.items() if k.startswith("grad_") and v}

    one = run(tmp_path / "one", 8)
    two = run(tmp_path / strategy, 4, strategy=spawned(strategy), devices=2)
    assert set(two) == set(one) and len({step for _, step in one}) == 4
    for key, value in one.items():
        assert two[key] == pytest.approx(value, rel=1e-5), key
