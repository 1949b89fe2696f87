"""Helpers shared by the test files (fixtures stay in ``tests/conftest.py``).

- :mod:`tests.helpers.trainers`: :func:`~tests.helpers.trainers.quiet_trainer`, the one quiet CPU trainer.
- :mod:`tests.helpers.regression`: the tiny regressor and data of the parity tests; ``Small``.
- :mod:`tests.helpers.tiny_mlp`: a small classifier on fixed in-memory batches (training-step tests).
- :mod:`tests.helpers.callback_tools`: a module with a scripted metric, fake other ranks, a metric recorder.
- :mod:`tests.helpers.jobs`, :mod:`tests.helpers.distributed`: multi-process jobs and ``spawn``.
- :mod:`tests.helpers.cli`: the ``geartrain`` command in a subprocess.
- ``ddp_script.py``, ``resume_job.py``: whole programs the tests run as subprocesses.
"""

from __future__ import annotations

from pathlib import Path

#: The checkout under test; subprocesses get it as PYTHONPATH so they import this code, not an install.
REPO_ROOT = Path(__file__).resolve().parents[2]
