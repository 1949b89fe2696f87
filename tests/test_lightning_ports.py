"""Two Lightning projects, written as Lightning code, run on geartrain after changing their imports only.

``tests/ports/digits_port.py`` follows the lightning-hydra-template's MNIST project (a DataModule that
saves its hyperparameters, a module with torchmetrics, a ReduceLROnPlateau dict, the template's
callbacks); ``tests/ports/gan_port.py`` is Lightning's basic GAN example (manual optimisation, two
optimizers, ``toggle_optimizer``, images through ``self.loggers[0].experiment``). Each is trained on
one process and on two (DDP over gloo). The expected numbers are what Lightning 2.6.6 gives for the
same files with Lightning's imports (global steps, epochs, hyperparameters, result shapes).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import REPO_ROOT, numerics
from tests.ports import digits_port, gan_port, numbers_ports, pl_programs

LIGHTNING_WEIGHTS = REPO_ROOT / "tests" / "data" / "lightning" / "ports_numbers.pt"
LIGHTNING_PROGRAMS = REPO_ROOT / "tests" / "data" / "lightning" / "ports_programs.pt"


def _image_tags(log_dir: str) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(log_dir, size_guidance={"images": 0})
    events.Reload()
    return set(events.Tags()["images"])


def _check_digits(result: dict[str, Any]) -> None:
    assert result["hparams_lr"] == 0.01
    assert result["hparams_keys"] == ["compile", "lr", "weight_decay"]  # ``net`` was ignored
    assert result["dm_batch_size"] == 64
    assert result["current_epoch"] == 3  # Lightning: epochs finished
    assert result["global_step"] == 57  # 3 epochs of ceil(1197 / 64) steps (or of 32 per rank on 2 ranks)
    assert isinstance(result["test"], list) and len(result["test"]) == 1
    assert set(result["test"][0]) == {"test/loss", "test/acc"}
    assert result["test"][0]["test/acc"] >= 0.9
    assert result["val_acc_best"] >= result["val_acc"] >= 0.9
    assert result["best"].startswith("epoch_0") and result["best"].endswith(".ckpt")


def test_digits_template_project_trains_and_tests_the_best_checkpoint(tmp_path: Path) -> None:
    _check_digits(digits_port.train(str(tmp_path)))


@pytest.mark.slow
def test_digits_template_project_under_ddp(tmp_path: Path) -> None:
    _check_digits(digits_port.train(str(tmp_path), "ddp_spawn", 2))


def _hand_written_gan(epochs: int) -> gan_port.GAN:
    """Lightning's GAN step written out by hand, with the same random draws in the same order."""
    gan_port.seed_everything(7)
    dm = gan_port.DigitsImages(batch_size=64)
    dm.setup("fit")
    model = gan_port.GAN()
    opt_g, opt_d = model.configure_optimizers()[0]
    bce = torch.nn.functional.binary_cross_entropy
    loader = dm.train_dataloader()
    for _ in range(epochs):
        for imgs, _ in loader:
            z = torch.randn(imgs.shape[0], model.hparams.latent_dim)
            ones, zeros = torch.ones(imgs.size(0), 1), torch.zeros(imgs.size(0), 1)
            for p in model.discriminator.parameters():  # toggle_optimizer(opt_g)
                p.requires_grad_(False)
            model(z)  # the generated images the example logs
            bce(model.discriminator(model(z)), ones).backward()
            opt_g.step()
            opt_g.zero_grad()
            for p in model.discriminator.parameters():
                p.requires_grad_(True)
            for p in model.generator.parameters():  # toggle_optimizer(opt_d)
                p.requires_grad_(False)
            real = bce(model.discriminator(imgs), ones)
            fake = bce(model.discriminator(model(z).detach()), zeros)
            ((real + fake) / 2).backward()
            opt_d.step()
            opt_d.zero_grad()
            for p in model.generator.parameters():
                p.requires_grad_(True)
        # The epoch's validation, as Lightning runs it: its loader's iterator draws its base seed from
        # the global generator, and nothing puts that draw back (only the sanity check is isolated).
        iter(dm.val_dataloader())
    return model


def test_gan_example_equals_the_hand_written_loop_bitwise(tmp_path: Path) -> None:
    model, result = gan_port.train(str(tmp_path))
    assert result["global_step"] == 32  # two optimizer steps per batch, 8 batches, 2 epochs
    assert result["current_epoch"] == 2
    assert result["hparams"]["latent_dim"] == 16 and result["hparams"]["lr"] == 0.0002
    assert Path(result["log_dir"]) == tmp_path / "gan" / "version_0"
    assert {"train/generated_images", "validation/generated_images"} <= _image_tags(result["log_dir"])
    reference = _hand_written_gan(2)
    for (name, ours), theirs in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(ours, theirs), name
    assert all(p.requires_grad for p in model.parameters())  # every toggle was undone


@pytest.mark.slow
def test_gan_example_under_ddp(tmp_path: Path) -> None:
    # Each optimizer updates only its half of the module: DDP must be told (Lightning needs the same).
    model, result = gan_port.train(str(tmp_path), "ddp_spawn_find_unused_parameters_true", 2)
    assert result["global_step"] == 16  # 4 batches per rank and epoch
    assert result["current_epoch"] == 2
    assert {"train/generated_images", "validation/generated_images"} <= _image_tags(result["log_dir"])
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_the_recordings_are_compared_on_the_pinned_cpu_kernels() -> None:
    """The recordings were made with the kernels tests/helpers/numerics.py pins; this process computes with them
    too (pinned before torch was imported), so the comparisons hold on any x86-64 machine, not only the one
    that recorded them."""
    assert {key: os.environ.get(key) for key in numerics.PINNED} == numerics.PINNED
    assert torch.backends.cpu.get_cpu_capability() == "DEFAULT"


@pytest.mark.parametrize("port", ["numbers_ports", "pl_programs"])
def test_a_ports_geartrain_imports_are_all_in_the_block_the_recording_swaps(port: str) -> None:
    """record_ports.py swaps the marked import block for Lightning's; an import of geartrain outside it (an import
    sorter moving one out) would leave the Lightning recording run importing geartrain."""
    text = (REPO_ROOT / "tests" / "ports" / f"{port}.py").read_text()
    head, rest = re.split(r"^# --- imports: .*$", text, maxsplit=1, flags=re.M)
    _, tail = rest.split("# --- end of imports ---")
    assert not re.findall(r"^\s*(?:from|import)\s+(?:trainer|callbacks|strategies)\b.*$", head + tail, re.M)


def _assert_lightnings_numbers(recording: Path, name: str, program: Any) -> None:
    """Run ``program`` on one thread; every tensor it returns equals Lightning's recorded one, bit for bit."""
    torch.set_num_threads(1)
    recorded = torch.load(recording, weights_only=True)[name]
    ours = program()
    assert ours.keys() == recorded.keys()
    for key, value in recorded.items():
        assert torch.equal(ours[key], value), f"{name}: {key} differs from Lightning's"


@pytest.mark.parametrize("name", sorted(numbers_ports.PROGRAMS))
def test_programs_end_with_lightnings_weights_bit_for_bit(name: str) -> None:
    """Same seed, same program, same final weights as Lightning 2.6.6 on the CPU: random draws (shuffling,
    augmentation, dropout, validation's draws), hook order and validation schedule are Lightning's.

    The weights were recorded by ``tests/data/lightning/record_ports.py`` (re-run it against Lightning
    after changing a program)."""
    _assert_lightnings_numbers(LIGHTNING_WEIGHTS, name, numbers_ports.PROGRAMS[name])


@pytest.mark.parametrize("name", sorted(pl_programs.PROGRAMS))
def test_import_as_pl_programs_run_and_end_with_lightnings_numbers(name: str) -> None:
    """Five programs of the kinds Lightning's examples teach, in ``import ... as pl`` style (fine-tuning with
    ``BaseFinetuning``, a PPO agent with manual optimisation on an ``IterableDataset``, test and predict from
    ``ckpt_path="best"``, a callback owning an optimizer and its state, an ``optimizer_step`` override): they run
    with their import block changed only, and end with Lightning 2.6.6's weights (and scores, predictions,
    the callback's saved state) bit for bit. Recorded by ``tests/data/lightning/record_ports.py``."""
    _assert_lightnings_numbers(LIGHTNING_PROGRAMS, name, pl_programs.PROGRAMS[name])
