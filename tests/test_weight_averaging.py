"""``WeightAveraging`` / ``EMAWeightAveraging``: bitwise equal to a hand-written EMA loop, validation on the
average, Lightning's checkpoint layout, exact resume, and DDP/FSDP equal to one process."""

from __future__ import annotations

import copy
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from callbacks import Callback, EMAWeightAveraging, WeightAveraging
from tests.helpers import jobs
from tests.helpers.forked import ForkedJob, start_forked
from tests.helpers.regression import Regressor, make_loader
from tests.helpers.trainers import quiet_trainer, spawned
from trainer import Trainer, TrainModule

DECAY = 0.75  # far from 1, so every update moves the average visibly
K = 2  # accumulation: the average moves after optimizer steps, not after batches


class Watched(Regressor):
    """Records the weights validation ran with (the first validation batch of every epoch)."""

    def __init__(self) -> None:
        super().__init__()
        self.validated_with: list[dict[str, torch.Tensor]] = []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            self.validated_with.append({k: v.detach().clone() for k, v in self.net.state_dict().items()})
        super().validation_step(batch, batch_idx)


def reference_ema(
    net: nn.Module, loader: DataLoader[Any], epochs: int, should: Callable[[int], bool]
) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """Hand-written: SGD with accumulation ``K``; after optimizer step ``i`` (from 0), if ``should(i)``, the
    first update copies the weights and later ones do ``ema = decay * ema + (1 - decay) * w``.

    Returns the final EMA and the EMA at the end of every epoch (what validation must see: before the
    first update, the average is the initial weights).
    """
    initial = {k: v.detach().clone() for k, v in net.state_dict().items()}
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    ema: dict[str, torch.Tensor] | None = None
    per_epoch = []
    step = 0
    n = len(loader)
    for _ in range(epochs):
        for i, (x, y) in enumerate(loader):
            (F.mse_loss(net(x), y) / K).backward()
            if (i + 1) % K == 0 or i == n - 1:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if should(step):
                    current = {k: v.detach() for k, v in net.state_dict().items()}
                    if ema is None:
                        ema = {k: v.clone() for k, v in current.items()}
                    else:
                        ema = {k: DECAY * ema[k] + (1 - DECAY) * current[k] for k in ema}
                step += 1
        per_epoch.append({k: v.clone() for k, v in (initial if ema is None else ema).items()})
    assert ema is not None
    return ema, per_epoch


def _net_weights(module: TrainModule) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.net.state_dict().items()}  # type: ignore[union-attr]


def _assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize(
    ("options", "should"),
    [
        ({}, lambda i: True),
        ({"update_every_n_steps": 2, "update_starting_at_step": 3}, lambda i: i >= 3 and i % 2 == 0),
    ],
    ids=["every-step", "every-2nd-from-3"],
)
def test_ema_equals_a_hand_written_loop_bitwise(options: dict[str, Any], should: Callable[[int], bool]) -> None:
    module = Watched()
    net = copy.deepcopy(module.net)
    loader = make_loader(n=20, batch_size=3)  # 7 batches: windows of 2 and a last one of 1
    trainer = quiet_trainer(
        callbacks=[EMAWeightAveraging(decay=DECAY, **options)], max_epochs=3, accumulate_grad_batches=K
    )
    trainer.fit(module, loader, make_loader(n=6, batch_size=3, seed=1))
    ema, per_epoch = reference_ema(net, loader, 3, should)
    _assert_equal(_net_weights(module), ema)  # at the end of fit the module holds the average
    # Validation ran on the average of that moment (swapped in), training went on with the raw weights.
    assert len(module.validated_with) == 3
    for seen, expected in zip(module.validated_with, per_epoch):
        _assert_equal(seen, expected)
    assert not torch.equal(ema["0.weight"], net.state_dict()["0.weight"])  # the average is not the weights


def test_weight_averaging_defaults_to_the_equal_weight_mean_and_should_update_by_epoch() -> None:
    class ByEpoch(WeightAveraging):
        def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
            return epoch_idx is not None

    module = Regressor()
    net = copy.deepcopy(module.net)
    loader = make_loader(n=8, batch_size=4)
    quiet_trainer(callbacks=[ByEpoch()], max_epochs=3).fit(module, loader)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    snapshots = []
    for _ in range(3):
        for x, y in loader:
            F.mse_loss(net(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        snapshots.append({k: v.detach().clone() for k, v in net.state_dict().items()})
    mean = {k: torch.stack([s[k] for s in snapshots]).mean(0) for k in snapshots[0]}
    for key, value in _net_weights(module).items():
        torch.testing.assert_close(value, mean[key], rtol=0, atol=1e-7)


class SaveAt(Callback):
    """Saves ``step<N>.ckpt`` right after optimizer steps ``steps`` (as a kill after that step would find)."""

    def __init__(self, root: Path, steps: set[int]) -> None:
        self.root, self.steps, self.saved = root, steps, 0

    def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, *args: Any) -> None:
        step = trainer.global_step
        if step in self.steps and step != self.saved:
            trainer.save_checkpoint(self.root / f"step{step}.ckpt")
            self.saved = step


def test_checkpoint_layout_is_lightnings_and_resume_is_exact(tmp_path: Path) -> None:
    loader, val = make_loader(n=20, batch_size=3), make_loader(n=6, batch_size=3, seed=1)
    steps = {2, 5, 8}  # mid-epoch (4 steps an epoch), an epoch's last step, the next epoch

    def fit(ckpt: Path | None, extra: list[Callback]) -> Regressor:
        module = Regressor()
        ema = EMAWeightAveraging(decay=DECAY)
        trainer = quiet_trainer(callbacks=[ema, *extra], max_epochs=3, accumulate_grad_batches=K)
        trainer.fit(module, loader, val, ckpt_path=ckpt)
        return module

    whole = fit(None, [SaveAt(tmp_path, steps)])
    state = torch.load(tmp_path / "step5.ckpt", weights_only=True)
    # Lightning's layout: the average is the state_dict, the training weights are kept beside it.
    assert set(state["averaging_state"]) == {"n_averaged"} and int(state["averaging_state"]["n_averaged"]) == 5
    assert state["state_dict"].keys() == state["current_model_state"].keys()
    assert not torch.equal(state["state_dict"]["net.0.weight"], state["current_model_state"]["net.0.weight"])
    assert state["callbacks"]["EMAWeightAveraging"]["latest_update_step"] == 5
    # load_from_checkpoint-style use of the file gets the average.
    plain = Regressor(seed=3)
    plain.load_state_dict(state["state_dict"])
    for step in sorted(steps):
        resumed = fit(tmp_path / f"step{step}.ckpt", [])
        _assert_equal(_net_weights(resumed), _net_weights(whole))


def test_evaluating_a_checkpoint_uses_the_average(tmp_path: Path) -> None:
    module = Regressor()
    trainer = quiet_trainer(callbacks=[EMAWeightAveraging(decay=DECAY)], max_epochs=1)
    trainer.fit(module, make_loader(n=12, batch_size=3))
    path = tmp_path / "end.ckpt"
    trainer.save_checkpoint(path)  # after fit: the module holds the average
    val = make_loader(n=6, batch_size=3, seed=1)
    direct = quiet_trainer().validate(module, val)[0]["val_loss"]
    again = quiet_trainer(callbacks=[EMAWeightAveraging()]).validate(Regressor(seed=9), val, ckpt_path=path)
    assert again[0]["val_loss"] == direct


def test_layers_made_in_configure_model_are_averaged_too() -> None:
    class Late(Regressor):
        def __init__(self) -> None:
            super().__init__()
            del self.net

        def configure_model(self) -> None:
            if not hasattr(self, "net"):
                torch.manual_seed(0)
                self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    module = Late()
    ema = EMAWeightAveraging(decay=DECAY)
    with pytest.warns(UserWarning, match="overrides configure_model"):
        quiet_trainer(callbacks=[ema], max_epochs=1).fit(module, make_loader(n=8, batch_size=4))
    assert ema._average_model is not None
    averaged = dict(ema._average_model.module.named_parameters())
    assert averaged.keys() == dict(module.named_parameters()).keys() and len(averaged) == 4
    _assert_equal(_net_weights(module), {k[4:]: v.detach() for k, v in averaged.items()})


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"decay=1\.5"):
        EMAWeightAveraging(decay=1.5)
    with pytest.raises(ValueError, match="update_every_n_steps"):
        EMAWeightAveraging(update_every_n_steps=-1)


# ----------------------------------------------------------------- several processes
def _fit_blocknet(strategy: str, per_rank_batch: int, root: Path) -> dict[str, torch.Tensor]:
    module = jobs.BlockNet()
    trainer = quiet_trainer(
        root,
        strategy=spawned(strategy),
        devices=2 if strategy != "single" else 1,
        callbacks=[EMAWeightAveraging(decay=0.8)],
        max_steps=6,
        accumulate_grad_batches=2,
        limit_val_batches=2,
        val_check_interval=4,
    )
    trainer.fit(
        module,
        DataLoader(jobs.dataset(64), batch_size=per_rank_batch, shuffle=False),
        DataLoader(jobs.dataset(20, seed=2), batch_size=per_rank_batch),
    )
    return jobs.weights(module)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_average_under_two_processes_equals_one_process(strategy: str, tmp_path: Path) -> None:
    expected = _fit_blocknet("single", jobs.GLOBAL_BATCH, tmp_path / "one")
    got = _fit_blocknet(strategy, jobs.GLOBAL_BATCH // 2, tmp_path / strategy)
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], atol=1e-6, rtol=0, msg=key)
    assert not torch.allclose(expected["head.weight"], jobs.BlockNet().head.weight.detach())


# ----------------------------------------------------------------- kill -9
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill_9_at_several_points_then_resume_is_exact(tmp_path: Path) -> None:
    """EMA (validation on the average mid-epoch) with an accumulation schedule, killed at four points."""
    from tests.helpers import averaging_job

    def start(out: Path, *args: str) -> ForkedJob:
        """``averaging_job.py OUT ARGS`` in a process of its own, forked from this one (imports paid once)."""
        return start_forked(averaging_job.main, [str(out), *args])

    whole = tmp_path / "whole"
    reference = start(whole)  # beside the interrupted runs
    killed = tmp_path / "killed"
    # Epoch 0 (10 steps, factor 1): mid-epoch and after a validation; epoch 1 (factor 2): mid-window
    # batches print the same step twice, so the kill may land inside a window; epoch 2.
    for n, point in enumerate(["STEP 3", "VAL 8", "STEP 13", "STEP 17"]):
        proc = start(killed, "--delay", *(["--resume"] if n else []))
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == point:
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
    proc = start(killed, "--resume")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    _, err = reference.communicate(timeout=180)
    assert reference.returncode == 0, err[-3000:]
    _assert_equal(torch.load(killed / "final.pt", weights_only=True), torch.load(whole / "final.pt", weights_only=True))
