"""``TQDMProgressBar``: Lightning's tqdm bars, their counts, ``self.print`` through them, rank 0 only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import callbacks as cbs
from callbacks.tqdm_progress import Tqdm, TQDMProgressBar
from tests.helpers.callback_tools import NotRankZero
from tests.helpers.regression import Regressor, make_loader
from tests.helpers.trainers import quiet_trainer
from trainer import Trainer
from trainer.common.errors import MisconfigurationException


class Printing(Regressor):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        self.log("shown", 1.25, prog_bar=True)
        self.print("train", batch_idx, end="!")
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        self.print("val", batch_idx)
        return super().validation_step(batch, batch_idx)


def test_the_bars_count_the_batches_and_show_the_logged_values(tmp_path: Path) -> None:
    bar = TQDMProgressBar(refresh_rate=2)
    logger = cbs.CSVLogger(tmp_path, version=3)
    trainer = quiet_trainer(tmp_path, callbacks=[bar], logger=logger, max_epochs=2, num_sanity_val_steps=1)
    trainer.fit(Printing(), make_loader(12, 4), make_loader(8, 4))
    train = bar.train_progress_bar
    assert (train.n, train.total, train.desc) == (3, 3, "Epoch 1: ")  # the last batch is shown though 3 % 2
    assert train.postfix == "v_num=3, shown=1.250"  # Lightning's standard item, then prog_bar values, padded
    assert (bar.val_progress_bar.n, bar.val_progress_bar.total) == (2, 2)
    assert bar.val_progress_bar.desc == "Validation DataLoader 0: "
    assert bar.get_metrics(trainer, trainer.lightning_module) == {"v_num": 3, "shown": 1.25}


def test_print_goes_through_the_bar_while_it_draws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    written: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(Tqdm, "write", staticmethod(lambda s, **kw: written.append((s, kw))))
    quiet_trainer(tmp_path, callbacks=[TQDMProgressBar()], max_steps=1).fit(
        Printing(), make_loader(4, 4), make_loader(4, 4)
    )
    assert written == [("train 0", {"end": "!"}), ("val 0", {})]


def test_print_uses_the_builtin_print_when_the_bar_is_off(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(Tqdm, "write", staticmethod(lambda *a, **k: pytest.fail("a disabled bar wrote")))
    bar = TQDMProgressBar(refresh_rate=0)
    quiet_trainer(tmp_path, callbacks=[bar], max_steps=1).fit(Printing(), make_loader(4, 4), make_loader(4, 4))
    assert capsys.readouterr().out == "train 0!val 0\n"


def test_other_ranks_draw_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bar = TQDMProgressBar()
    quiet_trainer(tmp_path, callbacks=[bar], max_steps=2, strategy=NotRankZero(device="cpu")).fit(
        Printing(), make_loader(8, 4)
    )
    assert bar.is_disabled and bar.train_progress_bar.disable
    assert capsys.readouterr() == ("", "")


def test_one_progress_bar_and_not_beside_enable_progress_bar_false() -> None:
    with pytest.raises(MisconfigurationException, match=r"^You added multiple progress bar callbacks"):
        Trainer(callbacks=[TQDMProgressBar(), cbs.ProgressBar()], logger=False)
    with pytest.raises(MisconfigurationException, match=r"enable_progress_bar=False` but found `TQDMProgressBar"):
        Trainer(callbacks=[TQDMProgressBar()], enable_progress_bar=False, logger=False)


def test_refresh_rate_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TQDM_MINITERS", "7")
    assert (TQDMProgressBar(refresh_rate=3).refresh_rate, TQDMProgressBar(refresh_rate=9).refresh_rate) == (7, 9)
    monkeypatch.delenv("TQDM_MINITERS")
    monkeypatch.setenv("COLAB_GPU", "1")
    assert (TQDMProgressBar().refresh_rate, TQDMProgressBar(refresh_rate=2).refresh_rate) == (20, 2)


def test_numbers_are_padded_so_the_postfix_keeps_its_width() -> None:
    got = [Tqdm.format_num(n) for n in (1.2, 3, "7", "abc", 1e-9, torch.tensor(0.5).item())]
    assert got == ["1.200", "3", "7.000", "abc", "1e-9", "0.500"]
