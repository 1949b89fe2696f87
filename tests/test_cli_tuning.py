"""``geartrain task=lr_find`` / ``task=scale_batch_size`` and the Hydra hyperparameter search (optimized_metric)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.helpers.cli import run_dirs, run_geartrain, run_geartrain_watched

QUICK = ["trainer.max_epochs=1", "trainer.enable_progress_bar=false"]


def _events(folder: Path) -> object:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return acc


@pytest.mark.slow
def test_lr_find_task_prints_the_suggestion_and_draws_the_curve(tmp_path: Path) -> None:
    result = run_geartrain("task=lr_find", "tuner.lr_find.num_training=30", *QUICK, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    found = re.search(r"lr_find: suggested lr (\S+?);", result.stdout)
    assert found, result.stdout
    assert f"geartrain optim.lr={found.group(1)}" in result.stdout
    (run,) = run_dirs(tmp_path)
    acc = _events(run / "tensorboard")
    assert len(acc.Images("lr_find")) == 1  # type: ignore[attr-defined]
    assert not list(run.glob("checkpoints/*.ckpt"))  # tuning trains nothing to keep


@pytest.mark.slow
def test_scale_batch_size_task_prints_the_size_and_the_override(tmp_path: Path) -> None:
    args = ["task=scale_batch_size", "tuner.scale_batch_size.max_val=64", "tuner.scale_batch_size.steps_per_trial=1"]
    result = run_geartrain(*args, *QUICK, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # On CPU nothing runs out of memory: doubling from 2 stops at max_val.
    assert "the largest batch size that fits is 64" in result.stdout
    assert "geartrain data.batch_size=64" in result.stdout


@pytest.mark.slow
def test_scale_batch_size_task_says_it_once_and_never_more_than_the_training_set(tmp_path: Path) -> None:
    from trainer.examples.digits import DigitsData

    data = DigitsData()
    data.setup("fit")
    held = len(data.train_dataloader().dataset)  # type: ignore[arg-type]
    assert 1024 < held < 2048  # doubling from 2 reaches 2048, a batch larger than the training set
    args = ["task=scale_batch_size", "tuner.scale_batch_size.steps_per_trial=1"]
    result = run_geartrain(*args, *QUICK, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert f"geartrain data.batch_size={held}" in result.stdout
    # The search's own log (Lightning's lines) says it tried 2048; the suggestion never exceeds the training set.
    assert "data.batch_size=2048" not in output and "is 2048" not in output
    assert len(re.findall(r"scale_batch_size: ", output)) == 1, output


@pytest.mark.slow
def test_optuna_study_returns_each_trials_metric_and_logs_hparams(tmp_path: Path) -> None:
    result = run_geartrain(
        "-m", "hparams_search=digits_optuna", "hydra.sweeper.n_trials=3", "trainer.limit_train_batches=5", *QUICK,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    trials = run_dirs(tmp_path, "multirun/*/*/*")
    assert len(trials) == 3
    values = []
    for trial in trials:
        acc = _events(trial / "tensorboard")
        (metric,) = acc.Scalars("hparams/val/acc")  # type: ignore[attr-defined]
        assert metric.value == pytest.approx(acc.Scalars("val/acc")[-1].value)  # type: ignore[attr-defined]
        from tensorboard.plugins.hparams import plugin_data_pb2

        content = acc.PluginTagToContent("hparams")  # type: ignore[attr-defined]
        start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
        overrides = yaml.safe_load((trial / ".hydra" / "overrides.yaml").read_text())
        swept = dict(
            o.split("=", 1) for o in overrides if o.split("=")[0] in ("optim.lr", "model.hidden", "data.batch_size")
        )
        assert len(swept) == 3
        hparams = start.session_start_info.hparams
        assert hparams["optim/lr"].number_value == pytest.approx(float(swept["optim.lr"]))
        assert hparams["model/hidden"].number_value == int(swept["model.hidden"])
        values.append(metric.value)
    best = yaml.safe_load(next(tmp_path.glob("multirun/*/*/optimization_results.yaml")).read_text())
    assert best["best_value"] == pytest.approx(max(values))  # each trial returned its metric to the study
    assert "Best parameters" in result.stdout + result.stderr
    assert "setup plugin" not in result.stdout + result.stderr  # alembic's chatter, imported by the sweeper


#: Each trial's ranks write ``rank-R`` into the trial's folder, holding the learning rate they trained with.
RANK_MARK = "+callbacks.rank_mark._target_=tests.helpers.rank_marks.RankMark"


def _swept_lr(trial: Path) -> str:
    overrides = yaml.safe_load((trial / ".hydra" / "overrides.yaml").read_text())
    (lr,) = (o.split("=", 1)[1] for o in overrides if o.startswith("optim.lr="))
    return f"{float(lr):g}"


@pytest.mark.slow
@pytest.mark.timeout(200)  # on a defect the study hangs: the command's own limit below ends it first
def test_optuna_study_under_ddp_spawn_returns_each_trials_metric(tmp_path: Path) -> None:
    # strategy=ddp (each trial's other rank re-running the command as that one trial) is the study below.
    result = run_geartrain_watched(
        "-m", "hparams_search=digits_optuna", "hydra.sweeper.n_trials=2", "strategy=ddp_spawn", "trainer.devices=2",
        "trainer.limit_train_batches=4", RANK_MARK, *QUICK, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.leftovers == []
    trials = run_dirs(tmp_path, "multirun/*/*/*")
    assert len(trials) == 2
    assert len(list(tmp_path.glob("multirun/*/*"))) == 1 and not (tmp_path / "outputs").exists()  # no stray runs
    values = []
    said = [line for line in result.stdout.splitlines() if line.startswith("strategy=ddp_spawn: 2 processes")]
    assert len(said) == 2, result.stdout[-3000:]
    for trial in trials:
        # The trial said what it trained with, the swept values among it.
        (line,) = [line for line in said if f"; trial {trial.name}: optim.lr=" in line]
        assert float(line.split("optim.lr=")[1].split()[0]) == pytest.approx(float(_swept_lr(trial)), rel=1e-3)
        assert "model.hidden=" in line and "data.batch_size=" in line, line
        # Both ranks trained this trial, with its values, in its one folder.
        assert {p.name: p.read_text() for p in trial.glob("rank-*")} == dict.fromkeys(
            ["rank-0", "rank-1"], _swept_lr(trial)
        )
        acc = _events(trial / "tensorboard")
        (metric,) = acc.Scalars("hparams/val/acc")  # type: ignore[attr-defined]
        assert metric.value == pytest.approx(acc.Scalars("val/acc")[-1].value)  # type: ignore[attr-defined]
        values.append(metric.value)
    best = yaml.safe_load(next(tmp_path.glob("multirun/*/*/optimization_results.yaml")).read_text())
    assert best["best_value"] == pytest.approx(max(values))  # each DDP trial returned rank 0's metric
    assert "Best parameters" in result.stdout + result.stderr


def test_an_optimized_metric_the_run_never_logs_is_refused(tmp_path: Path) -> None:
    wrong = run_geartrain(
        "optimized_metric=val/accuracy", "task=fit", "trainer.limit_train_batches=2", *QUICK, cwd=tmp_path
    )
    assert wrong.returncode != 0
    assert "optimized_metric=val/accuracy" in wrong.stderr and "val/acc" in wrong.stderr


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_optuna_study_under_ddp_goes_on_past_failed_trials_and_leaves_no_rank_behind(tmp_path: Path) -> None:
    # Trial 0 raises on both ranks, trial 1 on rank 1 only (rank 0 waits in the step's all-reduce), trial 2 on
    # rank 0 only (rank 1 waits); trial 3 trains. Each trial's other rank runs the command again, as that one
    # trial (its overrides and folder pinned), though the search config sets hydra.mode: MULTIRUN (a re-run
    # rank used to start a study of its own and hang).
    fail = ["+callbacks.fail._target_=tests.helpers.rank_marks.FailIn", '+callbacks.fail.at=["0:0","0:1","1:1","2:0"]']
    result = run_geartrain_watched(
        "-m", "hparams_search=digits_optuna", "hydra.sweeper.n_trials=4", "strategy=ddp", "trainer.devices=2",
        "trainer.limit_train_batches=4", RANK_MARK, *fail, *QUICK, cwd=tmp_path, timeout=150,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert result.leftovers == []  # every rank of every trial, failed or not, has ended
    assert "study: 3 of 4 trials failed:" in output, output[-3000:]
    for trial, rank in ((0, 1), (1, 1), (2, 0)):  # rank 0 names the other rank's failure, else its own
        assert re.search(rf"trial {trial} \(.*\): .*RuntimeError: planned failure in job:rank {trial}:{rank}\n", output)
    trials = sorted(p for p in tmp_path.glob("multirun/*/*/*") if p.is_dir())
    assert [p.name for p in trials] == ["0", "1", "2", "3"]
    assert len(list(tmp_path.glob("multirun/*/*"))) == 1 and not (tmp_path / "outputs").exists()  # no stray runs
    for trial in trials:  # each trial's two ranks started in its folder, with its values
        assert {p.name: p.read_text() for p in trial.glob("rank-*")} == dict.fromkeys(
            ["rank-0", "rank-1"], _swept_lr(trial)
        )
    acc = _events(trials[3] / "tensorboard")
    (metric,) = acc.Scalars("hparams/val/acc")  # type: ignore[attr-defined]
    assert metric.value == pytest.approx(acc.Scalars("val/acc")[-1].value)  # type: ignore[attr-defined]
    best = yaml.safe_load(next(tmp_path.glob("multirun/*/*/optimization_results.yaml")).read_text())
    assert best["best_value"] == pytest.approx(metric.value)  # the one trial that trained
    assert "Best parameters" in output
