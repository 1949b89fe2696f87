"""``trainer.lightning.cli.LightningCLI`` runs a Lightning CLI program unchanged (docs/lightning.md, "LightningCLI").

The program is ``tests/helpers/lightning_cli_program.py``: ``LightningCLI(Net, Data)``. Its runs are
compared with the same job written by hand against the ``Trainer``, and its DDP run with one process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests.helpers import REPO_ROOT
from tests.helpers.distributed import run_python
from tests.helpers.lightning_cli_program import Composed, Data, Net, main
from trainer import Trainer
from trainer.lightning.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from trainer.utils import seed_everything

PROGRAM = str(REPO_ROOT / "tests" / "helpers" / "lightning_cli_program.py")


@pytest.fixture(autouse=True)
def _no_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The program parses ``args=``; pytest's own command line is not its (LightningCLI warns about both)."""
    monkeypatch.setattr("sys.argv", ["lightning_cli_program.py"])


def _quiet(root: Path) -> list[str]:
    return [
        f"--trainer.default_root_dir={root}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.num_sanity_val_steps=0",
    ]


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _checkpoint(root: Path) -> Path:
    (path,) = root.rglob("epoch=*.ckpt")
    return path


def test_print_config_then_fit_from_that_file_equals_the_same_job_written_by_hand(tmp_path: Path, capsys: Any) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--print_config", "--model.hidden=6", "--trainer.max_epochs=2", *_quiet(tmp_path)])
    assert stop.value.code == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert set(config) == {
        "seed_everything",
        "trainer",
        "model",
        "data",
        "optimizer",
        "lr_scheduler",
        "ckpt_path",
        "weights_only",
    }
    assert config["model"] == {"hidden": 6, "lr": 0.1} and config["data"] == {"batch_size": 4, "n": 16}
    assert config["seed_everything"] is True and config["trainer"]["max_epochs"] == 2

    # The printed file, edited as a user would: a seed, class paths for callbacks, optimizer and scheduler.
    config["seed_everything"] = 7
    config["trainer"]["callbacks"] = [
        {"class_path": "EarlyStopping", "init_args": {"monitor": "val_loss", "patience": 5}},
        # A config file written for Lightning names Lightning's path: read as trainer.lightning's.
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"monitor": "val_loss"}},
    ]
    config["optimizer"] = {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.01}}
    config["lr_scheduler"] = {"class_path": "StepLR", "init_args": {"step_size": 1, "gamma": 0.5}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.warns(UserWarning, match="configure_optimizers` will be overridden"):
        cli = main(["fit", "--config", str(path), f"--trainer.default_root_dir={tmp_path / 'cli'}"])
    assert cli.subcommand == "fit" and cli.trainer.current_epoch == 2
    names = [type(cb).__name__ for cb in cli.trainer.callbacks]
    assert {"EarlyStopping", "ModelCheckpoint", "SaveConfigCallback"} <= set(names)

    # By hand: the same seed, module, optimizer, scheduler and Trainer arguments.
    class ByHand(Net):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
            return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]

    seed_everything(7, workers=True)
    model = ByHand(hidden=6)
    Trainer(
        max_epochs=2,
        default_root_dir=tmp_path / "hand",
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    ).fit(model, Data())
    assert all(torch.equal(a, b) for a, b in zip(_weights(cli.model).values(), _weights(model).values(), strict=True))

    # SaveConfigCallback wrote what was parsed, seed included, to the log directory: it parses back to the same run.
    saved = yaml.safe_load((Path(cli.trainer.log_dir) / "config.yaml").read_text())
    assert saved["seed_everything"] == 7 and saved["model"] == {"hidden": 6, "lr": 0.1}
    assert saved["optimizer"]["class_path"] == "torch.optim.Adam"
    assert [cb["class_path"].rsplit(".", 1)[1] for cb in saved["trainer"]["callbacks"]] == [
        "EarlyStopping",
        "ModelCheckpoint",
    ]

    # test --ckpt_path: the model is built from the hyperparameters saved in the checkpoint (hidden=6).
    ckpt = _checkpoint(tmp_path / "cli")
    tested = main(["test", f"--ckpt_path={ckpt}", "--trainer.logger=false", *_quiet(tmp_path / "test")])
    assert tested.model.hparams.hidden == 6
    x, y = _all_data()
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(cli.model.layer(x), y)
    assert torch.allclose(tested.trainer.callback_metrics["test_loss"], loss, atol=1e-6)


def _all_data() -> tuple[torch.Tensor, torch.Tensor]:
    data = Data()
    data.setup("test")
    return data.dataset.tensors  # type: ignore[return-value]


class Recording(LightningCLI):
    """Records the order of the overridable steps Lightning's LightningCLI calls."""

    calls: list[str]

    def before_instantiate_classes(self) -> None:
        self.calls = ["before_instantiate_classes"]

    def after_instantiate_classes(self) -> None:
        self.calls.append("after_instantiate_classes")

    def before_validate(self) -> None:
        self.calls.append("before_validate")

    def after_validate(self) -> None:
        self.calls.append(f"after_validate:{self.trainer.state.fn.value}")

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.batch_size", "model.hidden")  # a link: the value comes from the data group


def test_subcommands_hooks_links_run_false_and_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An earlier test in this process may have seeded (both variables) or run as another rank.
    from trainer.common.env import SEED
    from trainer.common.rank_zero import rank_zero_only

    for name in (SEED, "PL_GLOBAL_SEED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    with pytest.warns(UserWarning, match="No seed found, seed set to 0"):  # --seed_everything=true, as Lightning
        cli = Recording(
            Net, Data, args=["validate", "--data.batch_size=3", "--trainer.logger=false", *_quiet(tmp_path)]
        )
    assert cli.calls == [
        "before_instantiate_classes",
        "after_instantiate_classes",
        "before_validate",
        "after_validate:validate",
    ]
    assert cli.model.hparams.hidden == 3 and "val_loss" in cli.trainer.callback_metrics
    assert (tmp_path / "config.yaml").is_file()

    # A second run into the same directory does not overwrite the first one's config.
    with pytest.raises(RuntimeError, match="to NOT exist"):
        Recording(Net, Data, args=["validate", "--seed_everything=false", "--trainer.logger=false", *_quiet(tmp_path)])

    # predict; run=False builds everything and runs nothing, with the arguments at the top level.
    predicted = LightningCLI(Net, Data, save_config_callback=None, args=["predict", *_quiet(tmp_path)])
    assert predicted.subcommand == "predict" and predicted.trainer.state.fn == "predict"
    built = LightningCLI(Net, Data, run=False, args=["--model.hidden=5", "--trainer.max_epochs=1", *_quiet(tmp_path)])
    assert built.subcommand is None and built.model.hparams.hidden == 5 and built.trainer.max_epochs == 1
    assert built.trainer.current_epoch == 0

    # Only Lightning's kinds of classes make argument groups; save_to_log_dir=False needs a save_config of one's own.
    with pytest.raises(Exception, match="Trainer, LightningModule, LightningDataModule, or Callback"):
        LightningArgumentParser().add_lightning_class_args(torch.nn.Linear, "layer")
    with pytest.raises(ValueError, match="save_to_log_dir=False"):
        SaveConfigCallback(LightningArgumentParser(), built.config, save_to_log_dir=False)


def test_a_module_built_from_class_paths_saves_its_config_and_loads_back(tmp_path: Path) -> None:
    encoder = ["--model.encoder.class_path=torch.nn.Linear", "--model.encoder.init_args.in_features=4"]
    args = ["fit", *encoder, "--model.encoder.init_args.out_features=3", "--trainer.max_epochs=1"]
    cli = LightningCLI(Composed, Data, args=[*args, "--trainer.logger=false", *_quiet(tmp_path)])
    ckpt = _checkpoint(tmp_path)
    # What Lightning's LightningCLI saves: the parsed config, and the function that rebuilds the module from it.
    linear = {"in_features": 4, "out_features": 3, "bias": True, "device": None, "dtype": None}
    assert torch.load(ckpt, weights_only=True)["hyper_parameters"] == {
        "encoder": {"class_path": "torch.nn.Linear", "init_args": linear},
        "lr": 0.1,
        "_instantiator": "lightning.pytorch.cli.instantiate_module",
    }
    loaded = Composed.load_from_checkpoint(ckpt)
    assert all(
        torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), _weights(cli.model).values(), strict=True)
    )
    assert isinstance(loaded.encoder, torch.nn.Linear) and loaded.encoder.out_features == 3

    # Only LightningCLI's instantiate_module is called: a checkpoint cannot name a function to run.
    state = torch.load(ckpt, weights_only=True)
    state["hyper_parameters"]["_instantiator"] = "os.system"
    torch.save(state, tmp_path / "named.ckpt")
    with pytest.raises(ValueError, match="never a function a file names"):
        Composed.load_from_checkpoint(tmp_path / "named.ckpt")


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_program_under_ddp_on_two_processes_equals_one_process(tmp_path: Path) -> None:
    common = ["--seed_everything=3", "--trainer.max_epochs=2", "--trainer.logger=false"]
    ddp = tmp_path / "ddp"
    args = ["--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=cpu", "--data.batch_size=2"]
    result = run_python([PROGRAM, "fit", *common, *args, *_quiet(ddp)], timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.leftovers == []
    assert "FutureWarning" not in result.stderr, result.stderr[-3000:]  # the ranks' exit stays quiet
    one = main(["fit", *common, "--data.batch_size=4", *_quiet(tmp_path / "one")])

    # N ranks with batch B/N take the steps one process takes with batch B (docs/strategies.md).
    ddp_weights = torch.load(_checkpoint(ddp), weights_only=True)["state_dict"]
    for name, value in _weights(one.model).items():
        torch.testing.assert_close(ddp_weights[name], value, rtol=0, atol=1e-6)
    saved = yaml.safe_load((ddp / "config.yaml").read_text())  # written once, by rank 0
    assert saved["trainer"]["strategy"] == "ddp" and saved["data"]["batch_size"] == 2


def test_the_cli_docs_example_trains_as_a_hand_written_loop(tmp_path: Path) -> None:
    # Lightning's CLI documentation: `LightningCLI(DemoModel, BoringDataModule)` from `lightning.pytorch.demos`.
    from trainer.lightning.demos.boring_classes import BoringDataModule, DemoModel

    args = ["fit", "--seed_everything=1", "--trainer.max_epochs=1", "--trainer.limit_train_batches=8"]
    cli = LightningCLI(DemoModel, BoringDataModule, args=[*args, "--trainer.limit_val_batches=0", *_quiet(tmp_path)])

    seed_everything(1)
    model = DemoModel()  # the CLI builds the model, then the data module
    data = BoringDataModule()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    for batch in data.random_full.data[:8].split(1):
        optimizer.zero_grad()
        model(batch).sum().backward()
        optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(_weights(cli.model).values(), _weights(model).values(), strict=True))
