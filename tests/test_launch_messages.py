"""What a Ctrl-C is said as: two quick ones are not the grace period's end; one before training saved nothing."""

from __future__ import annotations

import signal
from pathlib import Path

from strategies.launch_signals import SignalForwarder
from tests.helpers.cli import run_geartrain


def test_two_quick_ctrl_cs_are_said_as_the_second_one_not_as_the_grace_period(tmp_path: Path) -> None:
    forwarder = SignalForwarder(str(tmp_path), grace_period=30)
    try:
        forwarder._on_signal(signal.SIGINT, None)
        forwarder._on_signal(signal.SIGINT, None)  # the user pressed Ctrl-C again, long before 30 s
    finally:
        forwarder.restore()
    assert forwarder.killed
    said = forwarder.explain()
    assert "grace period" not in said, said
    assert "received SIGINT twice; the second one stopped the workers before they had saved" in said, said


def test_a_grace_period_that_ran_out_is_said_as_such(tmp_path: Path) -> None:
    forwarder = SignalForwarder(str(tmp_path), grace_period=0)
    forwarder._on_signal(signal.SIGTERM, None)
    forwarder._timer.join()  # type: ignore[union-attr]
    forwarder.restore()
    assert forwarder.killed and "within the grace period (0 s" in forwarder.explain()


def test_a_ctrl_c_before_training_started_says_nothing_was_saved_not_the_last_checkpoint(tmp_path: Path) -> None:
    # The model's constructor is where the Ctrl-C lands: no fit has started, so no checkpoint can exist.
    (tmp_path / "stops.py").write_text("def Stops(**kwargs):\n    raise KeyboardInterrupt\n")
    result = run_geartrain("model._target_=stops.Stops", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 130, result.stderr[-3000:]
    assert "geartrain: interrupted (Ctrl-C) before training started; nothing was saved" in result.stderr
    assert "after the last checkpoint" not in result.stderr
