"""The character-LM example: trains, samples text at the end, composes as Hydra experiments; the corpus is the novel."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from examples.charlm import DEFAULT_PATH, VOCAB, CharData, CharLM, decode, encode
from tests.helpers.cli import run_geartrain
from tests.helpers.trainers import quiet_trainer
from trainer import seed_everything
from trainer.cli.app import config_dir

TINY = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32}


def _experiment_override(name: str) -> str:
    """``experiment=x`` where the root config lists the group, ``+experiment=x`` where it does not yet."""
    listed = "experiment" in (config_dir() / "config.yaml").read_text()
    return f"{'' if listed else '+'}experiment={name}"


def test_trains_and_prints_a_sample_at_the_end(capsys: pytest.CaptureFixture[str]) -> None:
    seed_everything(0)
    module = CharLM(**TINY, lr=1e-2, warmup_steps=2, sample_chars=40, prompt="The ")
    data = CharData(batch_size=16, block_size=32)
    # Validation every 10 batches: a run stopped by max_steps inside its first epoch validates only when due (Lightning).
    trainer = quiet_trainer(
        strategy="auto", num_sanity_val_steps=2, max_steps=30, limit_val_batches=2, val_check_interval=10
    )
    trainer.fit(module, datamodule=data)
    assert float(trainer.callback_metrics["train/loss"]) < math.log(len(VOCAB)) - 0.8  # learnt the letters
    assert math.isfinite(float(trainer.callback_metrics["val/loss"]))
    assert module.sample.startswith("The ") and len(module.sample) == 44
    assert f"--- sample after 30 steps ---\n{module.sample}" in capsys.readouterr().out


def test_corpus_is_the_whole_novel_in_vocabulary_without_a_licence_text() -> None:
    text = DEFAULT_PATH.read_text(encoding="ascii")
    assert 300_000 < len(text) < 500_000 and set(text) <= set(VOCAB)
    # Persuasion complete, first line to last (examples/data/README.md records where it comes from).
    assert text.startswith("Persuasion\n") and text.endswith("\nFinis\n")
    assert "Jane Austen" in text[:100] and "Chapter 24\n" in text
    # The public-domain claim holds only for the bare text: no Project Gutenberg header or footer.
    assert "gutenberg" not in text.lower() and "ebook" not in text.lower()


def test_encode_decode_round_trip_and_unknown_characters() -> None:
    text = DEFAULT_PATH.read_text(encoding="ascii")
    assert decode(encode(text[:1000])) == text[:1000]
    assert decode(encode("caf\u00e9\tx")) == "caf??x"  # outside the vocabulary: "?"


def test_data_reads_a_utf8_corpus_and_splits_train_from_validation(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("abcd\u00e9" * 200, encoding="utf-8")  # 1,000 characters
    data = CharData(batch_size=4, block_size=10, val_fraction=0.2, path=str(corpus))
    data.setup("fit")
    assert data.train_set is not None and data.val_set is not None
    assert (len(data.train_set), len(data.val_set)) == (79, 19)  # (800 - 1) // 10, (200 - 1) // 10
    x, y = data.train_set[1]
    assert decode(x) == "abcd?abcd?" and decode(y) == "bcd?abcd?a"
    assert decode(data.val_set[0][0]) == "abcd?abcd?"  # validation starts where training ends


@pytest.mark.parametrize(("name", "target"), [("charlm", "SingleDeviceStrategy"), ("charlm_amp", "AMPStrategy")])
def test_experiments_compose(name: str, target: str) -> None:
    with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
        cfg = compose("config", overrides=[_experiment_override(name)])
    assert cfg.model._target_ == "trainer.examples.charlm.CharLM"
    assert cfg.data.block_size == cfg.model.block_size
    assert type(instantiate(cfg.strategy)).__name__ == target


def test_ddp_experiment_builds_on_charlm_with_two_processes() -> None:
    cfg = OmegaConf.load(config_dir() / "experiment" / "charlm_ddp.yaml")
    assert list(cfg.defaults) == ["charlm", {"override /strategy": "ddp"}]
    assert cfg.trainer.devices == 2 and cfg.data.batch_size * 2 == 32


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_geartrain_experiment_charlm_runs_from_the_command_line(tmp_path: Path) -> None:
    overrides = [f"model.{k}={v}" for k, v in TINY.items()] + [
        "trainer.max_steps=2",
        "trainer.val_check_interval=1",
        "trainer.limit_val_batches=1",
        "trainer.enable_progress_bar=false",
        "model.sample_chars=10",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    out = run_geartrain(_experiment_override("charlm"), *overrides, cwd=tmp_path, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "--- sample after 2 steps ---" in out.stdout
    assert list((tmp_path / "run" / "checkpoints").glob("*.ckpt"))
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)["progress"]["global_step"] == 2
