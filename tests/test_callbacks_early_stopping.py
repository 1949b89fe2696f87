"""EarlyStopping: stops at the expected epoch for known metric sequences; ranks agree."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
import torch

from callbacks import EarlyStopping, ModelCheckpoint
from callbacks.early_stopping import EarlyStoppingReason
from tests.helpers.callback_tools import OtherRankStrategy, Scripted, loaders
from tests.helpers.trainers import quiet_trainer
from trainer.checkpoint.files import load_checkpoint


def _run(es: EarlyStopping, scores: list[float], **kwargs: object) -> int:
    """Fit on ``scores`` (val/score per epoch); return the number of epochs that ran."""
    train, val = loaders()
    trainer = quiet_trainer(callbacks=[es], max_epochs=len(scores), **kwargs)
    module = Scripted(scores)
    trainer.fit(module, train, val)
    assert trainer.global_step % 4 == 0  # stopped at an epoch boundary, after a whole epoch
    return trainer.global_step // 4


@pytest.mark.parametrize(
    ("scores", "kwargs", "epochs"),
    [
        ([1.0, 0.9, 0.95, 0.92, 0.91, 0.5, 0.4], {"patience": 3}, 5),  # no new best in 3 checks after 0.9
        ([1.0, 0.9, 0.95, 0.85, 0.91, 0.92, 0.93, 0.1], {"patience": 3}, 7),  # 0.85 resets the wait
        ([1.0, 0.96, 0.97, 0.5], {"patience": 2, "min_delta": 0.05}, 3),  # 0.96 is better, not by > 0.05
        ([1.0, 1.2, 0.8], {"patience": 0}, 2),  # patience 0: the first check without improvement stops
        ([0.5, 0.6, 0.7, 0.95, 0.99], {"mode": "max", "stopping_threshold": 0.9}, 4),
        ([0.5, 0.6, 3.0, 0.4], {"divergence_threshold": 2.0, "patience": 10}, 3),
        ([0.5, math.nan, 0.4], {"patience": 10}, 2),
        ([0.5, math.inf, 0.4], {"patience": 10, "check_finite": False}, 3),
    ],
)
def test_stops_at_the_expected_epoch(scores: list[float], kwargs: dict[str, object], epochs: int) -> None:
    es = EarlyStopping(monitor="val/score", verbose=False, **kwargs)  # type: ignore[arg-type]
    assert _run(es, scores) == epochs
    assert es.stopped_epoch == (epochs - 1 if epochs < len(scores) else 0)  # 0: not stopped, as Lightning's
    assert (es.stopping_reason is EarlyStoppingReason.NOT_STOPPED) == (epochs == len(scores))


def test_patience_counts_validation_runs_not_epochs() -> None:
    # Validation only after epochs 1, 3, 5, 7; the value stops improving after epoch 1.
    scores = [9.0, 1.0, 9.0, 2.0, 9.0, 3.0, 9.0, 4.0]
    es = EarlyStopping(monitor="val/score", patience=2, verbose=False)
    assert _run(es, scores, check_val_every_n_epoch=2) == 6
    assert es.best_score == 1.0 and es.wait_count == 2


def test_says_why_and_keeps_state_in_checkpoints(tmp_path: object) -> None:
    out = io.StringIO()
    es = EarlyStopping(monitor="val/score", patience=1, stream=out)
    ck = ModelCheckpoint(dirpath=tmp_path, save_top_k=0, save_last=True)  # type: ignore[arg-type]
    train, val = loaders()
    quiet_trainer(callbacks=[es, ck], max_epochs=5).fit(Scripted([1.0, 2.0, 0.5, 0.5, 0.5]), train, val)
    assert out.getvalue() == (
        "EarlyStopping: stopping after epoch 1: val/score did not improve by more than 0.0 for 1 checks; best 1\n"
    )
    state = load_checkpoint(ck.last_model_path)["callbacks"]["EarlyStopping{'monitor': 'val/score', 'mode': 'min'}"]
    assert state == {
        "wait_count": 1,
        "best_score": 1.0,
        "stopped_epoch": 1,
        "patience": 1,
        "stopping_reason": EarlyStoppingReason.PATIENCE_EXHAUSTED.value,
        "stopping_reason_message": "val/score did not improve by more than 0.0 for 1 checks; best 1",
    }


def test_a_checkpoint_from_before_lightnings_state_key_still_resumes_its_state(tmp_path: Path) -> None:
    """Files written under geartrain's earlier key (``EarlyStopping[monitor=...,mode=...]``) keep their patience."""
    ck = ModelCheckpoint(dirpath=tmp_path, save_top_k=0, save_last=True)
    train, val = loaders()
    es = EarlyStopping(monitor="val/score", patience=3, verbose=False)
    quiet_trainer(callbacks=[es, ck], max_epochs=2).fit(Scripted([1.0, 2.0]), train, val)
    state = torch.load(ck.last_model_path, weights_only=True)
    saved = state["callbacks"].pop("EarlyStopping{'monitor': 'val/score', 'mode': 'min'}")
    state["callbacks"]["EarlyStopping[monitor=val/score,mode=min]"] = saved
    torch.save(state, tmp_path / "earlier.ckpt")
    resumed = EarlyStopping(monitor="val/score", patience=3, verbose=False)
    trainer = quiet_trainer(callbacks=[resumed], max_epochs=2)
    trainer.fit(Scripted([1.0, 2.0]), train, val, ckpt_path=str(tmp_path / "earlier.ckpt"))
    assert (resumed.best_score, resumed.wait_count) == (1.0, 1)


def test_typo_in_monitor_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match=r"EarlyStopping\(monitor='val/scroe'\).*never logged"):
        _run(EarlyStopping(monitor="val/scroe"), [1.0, 2.0])


def test_a_rank_that_wants_to_go_on_stops_when_another_rank_stops() -> None:
    # This rank's own values keep improving; the other rank votes to stop after the third check.
    strategy = OtherRankStrategy(other_votes=[0.0, 0.0, 1.0, 0.0])
    es = EarlyStopping(monitor="val/score", patience=5, verbose=False)
    assert _run(es, [5.0, 4.0, 3.0, 2.0, 1.0], strategy=strategy) == 3
    assert es.stopping_reason_message == "another process decided to stop"
    assert es.stopping_reason is EarlyStoppingReason.NOT_STOPPED  # as Lightning: this rank did not decide
    assert [vote for vote, _ in strategy.reduce_calls] == [0.0, 0.0, 0.0]


def test_every_rank_judges_rank_zeros_value() -> None:
    # Locally the value improves every epoch, but rank 0 saw no improvement after its first check:
    # this rank follows rank 0's values, so both stop after the same epoch.
    strategy = OtherRankStrategy(rank0_values=[1.0, 1.0, 1.0, 1.0])
    es = EarlyStopping(monitor="val/score", patience=2, verbose=False)
    assert _run(es, [5.0, 4.0, 3.0, 2.0, 1.0], strategy=strategy) == 3
    assert es.best_score == 1.0
    assert [vote for vote, _ in strategy.reduce_calls] == [0.0, 0.0, 1.0]


def test_best_score_is_stored_as_lightning_stores_it(tmp_path: Path) -> None:
    """A 0-d tensor: Lightning's resume calls ``best_score.to(device)`` (a float crashed it); exact in float64."""
    ck = ModelCheckpoint(dirpath=tmp_path, save_top_k=0, save_last=True)
    es = EarlyStopping(monitor="val/score", patience=3, verbose=False)
    train, val = loaders()
    quiet_trainer(callbacks=[es, ck], max_epochs=2).fit(Scripted([0.1 + 1e-12, 2.0]), train, val)
    saved = torch.load(ck.last_model_path, weights_only=True)["callbacks"]
    best = saved["EarlyStopping{'monitor': 'val/score', 'mode': 'min'}"]["best_score"]
    assert isinstance(best, torch.Tensor) and best.dim() == 0
    assert best.to(torch.device("cpu")).item() == es.best_score  # Lightning's use of it; our float, exactly
    resumed = EarlyStopping(monitor="val/score", patience=3, verbose=False)
    quiet_trainer(callbacks=[resumed], max_epochs=2).fit(Scripted([0.1, 2.0]), train, val, ckpt_path=ck.last_model_path)
    assert (resumed.best_score, resumed.wait_count) == (es.best_score, 1)
