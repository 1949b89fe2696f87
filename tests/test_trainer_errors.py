"""Bad input fails early with a message that says what was wrong and what is accepted."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.helpers.regression import Regressor, make_loader, sgd
from tests.helpers.trainers import quiet_trainer
from trainer import TrainModule
from trainer.common.errors import MisconfigurationException


def test_module_without_training_step(make_trainer: Any) -> None:
    class NoStep(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def configure_optimizers(self) -> Any:
            return sgd(self)

    with pytest.raises(NotImplementedError, match=r"NoStep does not define training_step\(self, batch, batch_idx\)"):
        make_trainer(max_epochs=1).fit(NoStep(), make_loader())


def test_fit_needs_a_train_module(make_trainer: Any) -> None:
    with pytest.raises(TypeError, match=r"Trainer\.fit needs a TrainModule, got Linear"):
        make_trainer().fit(nn.Linear(4, 1), make_loader())


def test_missing_evaluation_step_is_named(make_trainer: Any) -> None:
    class TrainOnly(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.layer(batch[0]).sum()

    with pytest.raises(NotImplementedError, match=r"does not define test_step\(self, batch, batch_idx\)"):
        make_trainer().test(TrainOnly(), make_loader())


@pytest.mark.parametrize(
    ("returned", "pattern"),
    [
        (lambda m: "adam", r"got str$"),
        (lambda m: [sgd(m), 3], r"got list of \[SGD, int\]"),
        (lambda m: {"lr": 0.1}, r"got a dict with keys \['lr'\] \(expected 'optimizer'"),
        (lambda m: {"optimizer": m.parameters()}, r"'optimizer' is a generator"),
        (lambda m: {"optimizer": sgd(m), "lr_scheduler": "cosine"}, r"must be a learning-rate scheduler.*got str"),
    ],
)
def test_unusable_configure_optimizers(make_trainer: Any, returned: Any, pattern: str) -> None:
    accepted = r"must return an optimizer, a list/tuple of optimizers, .*(dict|such dicts)"
    with pytest.raises((TypeError, ValueError)) as info:
        make_trainer(max_epochs=1).fit(Regressor(returned), make_loader())
    message = str(info.value)
    assert re.search(pattern, message), message
    if "scheduler" not in pattern:
        assert re.search(accepted, message), message


def test_two_optimizers_need_manual_optimisation(make_trainer: Any) -> None:
    with pytest.raises(RuntimeError, match=r"only supported with manual optimization.*returned 2 optimizers"):
        make_trainer(max_epochs=1).fit(Regressor(lambda m: [sgd(m), sgd(m)]), make_loader())


def _with_scheduler(**config: Any) -> Any:
    def optim(m: nn.Module) -> Any:
        opt = sgd(m)
        sched = config.pop("make", lambda o: torch.optim.lr_scheduler.StepLR(o, 1))(opt)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, **config}}

    return optim


def test_scheduler_with_unknown_interval(make_trainer: Any) -> None:
    pattern = r'The "interval" key in lr scheduler dict must be "step" or "epoch" but is "batch" \(scheduler StepLR\)'
    with pytest.raises(MisconfigurationException, match=pattern):
        make_trainer(max_epochs=1).fit(Regressor(_with_scheduler(interval="batch")), make_loader())


def test_scheduler_with_bad_frequency(make_trainer: Any) -> None:
    with pytest.raises(ValueError, match="'frequency' must be a positive int, got 0"):
        make_trainer(max_epochs=1).fit(Regressor(_with_scheduler(frequency=0)), make_loader())


def test_plateau_scheduler_without_monitor(make_trainer: Any) -> None:
    plateau = _with_scheduler(make=torch.optim.lr_scheduler.ReduceLROnPlateau)
    pattern = r"must include a monitor when a `ReduceLROnPlateau`.*steps on a metric.*'monitor': 'val/loss'"
    with pytest.raises(MisconfigurationException, match=pattern):
        make_trainer(max_epochs=1).fit(Regressor(plateau), make_loader())


def test_monitor_of_a_metric_never_logged_lists_the_logged_ones(make_trainer: Any) -> None:
    plateau = _with_scheduler(make=torch.optim.lr_scheduler.ReduceLROnPlateau, monitor="val_acc")
    with pytest.raises(
        KeyError,
        match=r"metric val_acc which is not available\. Available metrics are: val_loss\..*"
        r"monitors 'val_acc', which was not logged",
    ):
        make_trainer(max_epochs=1).fit(Regressor(plateau), make_loader(), make_loader())


def test_optimizer_configs_lightning_warns_about_or_refuses(make_trainer: Any) -> None:
    """As Lightning: unsupported keys are said (RuntimeWarning) and left out, a scheduler built on an optimizer
    that was not returned is refused, and a missing plateau metric under ``strict=False`` is said."""
    with pytest.warns(RuntimeWarning, match=r"unsupported keys in the optimizer configuration: \{'foo'\}"):
        make_trainer(max_epochs=1).fit(Regressor(lambda m: {"optimizer": sgd(m), "foo": 1}), make_loader())
    with pytest.warns(RuntimeWarning, match=r"unsupported keys in the lr scheduler dict: \{'bar'\}"):
        make_trainer(max_epochs=1).fit(Regressor(_with_scheduler(bar=2)), make_loader())

    def stray(m: nn.Module) -> Any:
        return [sgd(m)], [torch.optim.lr_scheduler.StepLR(sgd(m), 1)]

    with pytest.raises(MisconfigurationException, match="attached with an optimizer that wasn't returned"):
        make_trainer(max_epochs=1).fit(Regressor(stray), make_loader())
    plateau = _with_scheduler(make=torch.optim.lr_scheduler.ReduceLROnPlateau, monitor="val_acc", strict=False)
    trainer = make_trainer(max_epochs=1)
    with pytest.warns(RuntimeWarning, match="val_acc which is not available but strict is set to `False`"):
        trainer.fit(Regressor(plateau), make_loader(), make_loader())
    assert trainer.lr_scheduler_configs[0].reduce_on_plateau


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"accumulate_grad_batches": 0}, ValueError, "accumulate_grad_batches must be a positive int, got 0"),
        ({"log_every_n_steps": -1}, ValueError, "`log_every_n_steps` should be an int >= 0, got -1"),
        ({"check_val_every_n_epoch": 1.5}, ValueError, "check_val_every_n_epoch must be a positive int, got 1.5"),
        ({"gradient_clip_algorithm": "l2"}, ValueError, "must be 'norm' or 'value', got 'l2'"),
        (
            {"gradient_clip_val": -1.0},
            ValueError,
            r"gradient_clip_val must be >= 0 or None \(0: no clipping, as None\), got -1.0",
        ),
        (
            {"limit_train_batches": 1.5},
            MisconfigurationException,
            r"passed invalid value 1.5 for limit_train_batches, it has to be in \[0.0, 1.0\]",
        ),
        ({"limit_val_batches": -2}, ValueError, "You have passed invalid value -2 for limit_val_batches"),
        ({"limit_test_batches": "all"}, TypeError, "limit_test_batches must be an int .* got 'all'"),
        ({"val_check_interval": 1.5}, ValueError, "You have passed invalid value 1.5 for val_check_interval"),
        ({"overfit_batches": -0.1}, MisconfigurationException, "passed invalid value -0.1 for overfit_batches"),
        ({"val_check_interval": 0}, ValueError, "val_check_interval as a batch count must be >= 1, got 0"),
        (
            {"max_epochs": -2},
            MisconfigurationException,
            r"`max_epochs` must be a non-negative integer or -1. You passed in -2",
        ),
        (
            {"max_steps": -3},
            ValueError,
            r"`max_steps` must be a non-negative integer or -1 \(infinite steps\), you passed in -3",
        ),
        (
            {"fast_dev_run": -1},
            MisconfigurationException,
            "fast_dev_run=-1 is not a valid configuration. It should be >= 0",
        ),
        (
            {"strategy": "nope"},
            ValueError,
            "Unknown strategy 'nope'; valid names: auto, amp, ddp, dp, fsdp, model_parallel, single",
        ),
        ({"strategy": 3}, TypeError, "strategy must be a name or a Strategy instance, got int"),
        (
            {"strategy": "single", "precision": "8"},
            ValueError,
            "Precision '8' is invalid. Allowed precision values: 32-true",
        ),
        ({"strategy": "single", "devices": 2}, ValueError, "strategy='single' runs on one device; got devices=2"),
    ],
)
def test_bad_trainer_arguments(kwargs: dict[str, Any], error: type[Exception], pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        quiet_trainer(**{"strategy": "auto", "num_sanity_val_steps": 2, **kwargs})


def test_epoch_and_step_limits_follow_lightning(make_trainer: Any) -> None:
    assert make_trainer().max_epochs is None  # neither given: unset until fit takes 1000, as in Lightning
    assert make_trainer(max_steps=10).max_epochs is None  # steps given: no epoch limit (fit makes it -1)
    trainer = make_trainer(max_epochs=-1, max_steps=5)  # -1: no epoch limit, stop on steps
    trainer.fit(Regressor(), make_loader(4, 2))
    assert (trainer.global_step, trainer.current_epoch) == (5, 3)  # finished epochs, as Lightning counts


@pytest.mark.parametrize(
    ("returned", "error", "pattern"),
    [
        (
            {"loss_value": 1.0},
            KeyError,
            r"^In automatic_optimization, when `training_step` returns a dict, the 'loss' key needs to be present: "
            r"training_step returned a dict without a 'loss' entry \(keys: \['loss_value'\]\)",
        ),
        (
            "loss",
            TypeError,
            r"^In automatic optimization, `training_step` must return a Tensor, a dict, or None \(where the step "
            "will be skipped\\): training_step must return a loss tensor, a dict with 'loss', or None; got str",
        ),
    ],
)
def test_bad_training_step_output(make_trainer: Any, returned: Any, error: type[Exception], pattern: str) -> None:
    """Lightning's type and words first (a ``MisconfigurationException``), the old type kept."""

    class Bad(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return returned

    with pytest.raises(error, match=pattern) as caught:
        make_trainer(max_epochs=1).fit(Bad(), make_loader())
    assert isinstance(caught.value, MisconfigurationException)


def test_module_outside_a_trainer() -> None:
    module = Regressor()
    with pytest.raises(RuntimeError, match="Regressor is not attached to a `Trainer`"):
        module.trainer  # noqa: B018
    module.log("ignored", 1.0)  # a plain nn.Module outside a trainer: logging does nothing
    assert (module.global_step, module.current_epoch) == (0, 0)


@pytest.mark.parametrize("blocked", ["a file on the path", "a read-only folder"])
def test_a_checkpoint_folder_that_cannot_be_written_is_named_before_training(
    make_trainer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blocked: str
) -> None:
    """It ended the run at the first save, after an epoch of training, with a long traceback."""
    import errno
    import os
    import tempfile

    from callbacks import Callback, ModelCheckpoint
    from trainer.common.errors import UserError

    if blocked == "a file on the path":
        (tmp_path / "a_file").write_text("")
        folder, said = tmp_path / "a_file" / "ckpt", f"{tmp_path / 'a_file'} is a file, not a folder"
    else:
        (tmp_path / "ro").mkdir()
        folder, said = tmp_path / "ro" / "ckpt", f"Read-only file system ({tmp_path / 'ro'})"
        real = tempfile.TemporaryFile

        def read_only(*args: Any, dir: Any = None, **kwargs: Any) -> Any:  # what a read-only disk says, even to root
            if dir is not None and Path(dir) == tmp_path / "ro":
                raise OSError(errno.EROFS, os.strerror(errno.EROFS))
            return real(*args, dir=dir, **kwargs)

        monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    batches: list[int] = []

    class Count(Callback):
        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
            batches.append(batch_idx)

    trainer = make_trainer(max_epochs=1, callbacks=[ModelCheckpoint(dirpath=folder), Count()])
    with pytest.raises(UserError) as refused:
        trainer.fit(Regressor(), make_loader())
    assert str(refused.value) == (
        f"ModelCheckpoint cannot write checkpoints to {folder}: {said}; give dirpath= a folder you can write"
    )
    assert batches == [] and not folder.exists()


@pytest.mark.slow  # two spawned processes
@pytest.mark.timeout(120)
def test_under_ddp_every_rank_stops_at_a_checkpoint_folder_that_cannot_be_written(
    make_trainer: Any, tmp_path: Path, clean_distributed_env: None
) -> None:
    from callbacks import ModelCheckpoint
    from strategies.launch import WorkerFailedError
    from tests.helpers.trainers import spawned

    (tmp_path / "a_file").write_text("")
    folder = tmp_path / "a_file" / "ckpt"
    trainer = make_trainer(
        max_epochs=1, strategy=spawned("ddp"), devices=2, accelerator="cpu", callbacks=[ModelCheckpoint(dirpath=folder)]
    )
    with pytest.raises(WorkerFailedError) as failed:
        trainer.fit(Regressor(), make_loader())
    assert f"UserError: ModelCheckpoint cannot write checkpoints to {folder}" in failed.value.cause


def test_trainer_arguments_refused_with_lightnings_words(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Lightning's exception types and words (ours after them); ``~`` in default_root_dir is the home folder."""
    from trainer import Trainer

    with pytest.raises(TypeError, match=r"`gradient_clip_val` should be an int or a float\. Got \(1, 2\)"):
        Trainer(gradient_clip_val=(1, 2))  # type: ignore[arg-type]
    with pytest.raises(MisconfigurationException, match=r"`gradient_clip_algorithm` norm2 is invalid"):
        Trainer(gradient_clip_algorithm="norm2")
    with pytest.raises(MisconfigurationException, match=r"`check_val_every_n_epoch` should be an integer"):
        Trainer(check_val_every_n_epoch=1.2)  # type: ignore[arg-type]
    for stage in ("validate", "test", "predict"):
        with pytest.raises(TypeError, match=rf"must be a `LightningModule`.*got `Linear`: Trainer\.{stage} needs"):
            getattr(Trainer(logger=False), stage)(nn.Linear(2, 2))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert Trainer(default_root_dir="~/runs", logger=False).default_root_dir == str(tmp_path / "runs")


def test_missing_steps_are_lightnings_misconfiguration(make_trainer: Any) -> None:
    """A step or hook an entry point needs, missing or set to None: Lightning's exception type and words;
    validation half defined (data without a step, or the reverse) is warned about, as in Lightning."""
    from trainer.common.errors import PossibleUserWarning

    no_opt = Regressor()
    no_opt.configure_optimizers = None  # type: ignore[assignment,method-assign]
    with pytest.raises(MisconfigurationException, match=r"No `configure_optimizers\(\)` method defined"):
        make_trainer(max_epochs=1).fit(no_opt, make_loader())
    no_val = Regressor()
    no_val.validation_step = None  # type: ignore[assignment,method-assign]
    with pytest.raises(MisconfigurationException, match=r"No `validation_step\(\)` method defined to run"):
        make_trainer().validate(no_val, make_loader())

    class ForwardOnly(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 1)

    unforwarded = ForwardOnly()
    unforwarded.forward = None  # type: ignore[assignment,method-assign]
    with pytest.raises(MisconfigurationException, match=r"`Trainer.predict` requires `forward` method to run"):
        make_trainer().predict(unforwarded, make_loader())
    with pytest.warns(UserWarning, match=r"You passed in a `val_dataloader` but have no `validation_step`"):
        make_trainer(max_epochs=1).fit(no_val, make_loader(), make_loader())
    with pytest.warns(PossibleUserWarning, match=r"You defined a `validation_step` but have no `val_dataloader`"):
        make_trainer(max_epochs=1).fit(Regressor(), make_loader())


def test_a_keyboard_interrupt_in_a_run_ends_it_as_lightning_does(capsys: pytest.CaptureFixture[str]) -> None:
    """Lightning 2.6: the run is torn down, ``on_exception`` runs (callbacks, then the strategy), ``sys.exit(1)``."""
    from callbacks import Callback
    from strategies import SingleDeviceStrategy

    seen: list[str] = []

    class Stop(Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx == 1:
                raise KeyboardInterrupt

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            seen.append(f"callback {type(exception).__name__}")

        def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
            seen.append("teardown " + stage)  # a TrainerFn, as in Lightning: its value

    class Noting(SingleDeviceStrategy):
        def on_exception(self, exception: BaseException) -> None:
            seen.append(f"strategy {type(exception).__name__}")

    trainer = quiet_trainer(callbacks=[Stop()], max_epochs=1, strategy=Noting(device="cpu"))
    with pytest.raises(SystemExit) as ended:
        trainer.fit(Regressor(), make_loader(12, 4))
    assert ended.value.code == 1 and isinstance(ended.value.__context__, KeyboardInterrupt)
    assert seen == ["callback KeyboardInterrupt", "strategy KeyboardInterrupt", "teardown fit"]
    assert trainer.interrupted and trainer.global_step == 1
    assert "Detected KeyboardInterrupt, attempting graceful shutdown" in capsys.readouterr().err


def test_an_integral_float_limit_above_one_is_a_batch_count(tmp_path: Path) -> None:
    """As Lightning: ``limit_test_batches=1e50`` means that many batches (all of them), not a bad fraction."""
    trainer = quiet_trainer(tmp_path, limit_test_batches=1e50, limit_val_batches=2.0)
    trainer.test(Regressor(), make_loader(12, 4), verbose=False)
    assert trainer.num_test_batches == [3]
    trainer.validate(Regressor(), make_loader(12, 4), verbose=False)
    assert trainer.num_val_batches == [2]


@pytest.mark.parametrize(("given", "read"), [(True, True), (1, True), (3, 3), (False, False), (0, False)])
def test_fast_dev_run_reads_as_lightnings(tmp_path: Path, given: Any, read: Any) -> None:
    """As Lightning: ``fast_dev_run=1`` reads ``True``, other counts as given, off as ``False``."""
    value = quiet_trainer(tmp_path, fast_dev_run=given).fast_dev_run
    assert value == read and type(value) is type(read)
