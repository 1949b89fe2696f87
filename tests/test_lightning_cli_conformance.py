"""LightningCLI details as Lightning's: the printed config's header, the ``--ckpt_path`` failure message,
builder functions, and the ``hparams.yaml`` a CLI run writes (docs/lightning.md, "LightningCLI")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.lightning_cli_program import Composed, Data, Net
from trainer import Trainer
from trainer.lightning import __version__ as lightning_version
from trainer.lightning.cli import LightningCLI


@pytest.fixture(autouse=True)
def _no_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["program.py"])


def _quiet(root: Path) -> list[str]:
    return [
        f"--trainer.default_root_dir={root}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.num_sanity_val_steps=0",
        "--seed_everything=1",
    ]


def test_the_printed_config_starts_with_lightnings_header(capsys: Any) -> None:
    with pytest.raises(SystemExit):
        LightningCLI(Net, Data, args=["fit", "--print_config"])
    text = capsys.readouterr().out
    assert text.startswith(f"# lightning.pytorch=={lightning_version}\n# geartrain==")


def test_a_checkpoint_whose_hyperparameters_do_not_parse_says_so_as_lightning(tmp_path: Path, capsys: Any) -> None:
    class Other(Net):
        def __init__(self, depth: int = 1) -> None:  # takes none of Net's saved hyperparameters
            super().__init__()

    cli = LightningCLI(Net, Data, args=["fit", "--trainer.max_steps=1", "--trainer.logger=false", *_quiet(tmp_path)])
    ckpt = tmp_path / "net.ckpt"
    cli.trainer.save_checkpoint(ckpt)
    with pytest.raises(SystemExit):
        LightningCLI(Other, Data, args=["predict", f"--ckpt_path={ckpt}", *_quiet(tmp_path)])
    assert "Parsing of ckpt_path hyperparameters failed" in capsys.readouterr().err


def _trainer_builder(max_steps: int = 1, default_root_dir: str = ".") -> Trainer:
    return Trainer(max_steps=max_steps, default_root_dir=default_root_dir, logger=False, enable_progress_bar=False)


def test_a_trainer_builder_function_gets_one_class_even_where_the_cli_module_answers_any_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A module-level __getattr__ (an alias package's) must not make the builder's class look taken.
    import trainer.lightning.cli as cli_module

    monkeypatch.setattr(cli_module, "__getattr__", lambda name: object(), raising=False)
    args = ["fit", f"--trainer.default_root_dir={tmp_path}", "--seed_everything=1"]
    cli = LightningCLI(Net, Data, trainer_class=_trainer_builder, save_config_callback=None, args=args)
    assert cli.trainer.global_step == 1


def test_a_cli_runs_hparams_yaml_is_nested_and_without_the_class_path(tmp_path: Path) -> None:
    encoder = ["--model.encoder=torch.nn.Linear", "--model.encoder.in_features=4", "--model.encoder.out_features=3"]
    args = ["fit", "--model=tests.helpers.lightning_cli_program.Composed", *encoder, "--trainer.max_steps=1"]
    cli = LightningCLI(Composed, Data, subclass_mode_model=True, args=[*args, *_quiet(tmp_path)])
    assert cli.model.hparams["_class_path"] == "tests.helpers.lightning_cli_program.Composed"
    saved = yaml.safe_load((Path(cli.trainer.log_dir) / "hparams.yaml").read_text())
    assert saved["encoder"]["class_path"] == "torch.nn.Linear" and saved["encoder"]["init_args"]["out_features"] == 3
    assert "_class_path" not in saved and saved["lr"] == 0.1


def test_lightnings_jsonargparse_flag_is_there_and_true_where_the_cli_imports() -> None:
    # Lightning's programs and tests branch on it (lazy_instance is None without it).
    from trainer.lightning.cli import _JSONARGPARSE_SIGNATURES_AVAILABLE

    assert bool(_JSONARGPARSE_SIGNATURES_AVAILABLE)


def test_short_class_names_reach_lightnings_demo_model_and_reduce_lr_on_plateau(tmp_path: Path) -> None:
    from torch.optim.lr_scheduler import ReduceLROnPlateau
    from trainer.lightning.demos import BoringModel

    args = ["--model=BoringModel", "--optimizer=Adam", "--lr_scheduler=ReduceLROnPlateau", "--lr_scheduler.monitor=x"]
    cli = LightningCLI(run=False, args=[*args, f"--trainer.default_root_dir={tmp_path}", "--seed_everything=1"])
    assert type(cli.model) is BoringModel
    scheduler = cli.model.configure_optimizers()["lr_scheduler"]
    assert isinstance(scheduler["scheduler"], ReduceLROnPlateau) and scheduler["monitor"] == "x"


def test_pytorch_profilers_record_shapes_is_an_argument_of_the_class_as_in_lightning(tmp_path: Path) -> None:
    from trainer.profilers import PyTorchProfiler

    args = ["--trainer.profiler=PyTorchProfiler", "--trainer.profiler.group_by_input_shapes=true"]
    args += ["--trainer.profiler.dict_kwargs.record_shapes=true", "--trainer.profiler.dict_kwargs.profile_memory=true"]
    cli = LightningCLI(Net, Data, run=False, args=[*args, *_quiet(tmp_path)])
    profiler = cli.trainer.profiler
    assert isinstance(profiler, PyTorchProfiler) and profiler.group_by_input_shapes is True
    # jsonargparse finds ``record_shapes`` in the class's __init__ (Lightning's) and moves it to init_args;
    # ``profile_memory`` goes on to torch's profiler unresolved.
    assert cli.config.trainer.profiler.init_args["record_shapes"] is True
    assert cli.config.trainer.profiler.dict_kwargs == {"profile_memory": True}
    assert PyTorchProfiler(group_by_input_shapes=True).group_by_input_shapes is False  # no shapes: no grouping
