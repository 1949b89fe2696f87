"""The ``geartrain`` command: its room.

| file | what it does |
|---|---|
| :mod:`~trainer.cli.app` | the Hydra app: builds everything from ``conf/`` and runs a task |
| :mod:`~trainer.cli.config` | dataclass schemas behind the config groups (Hydra's ConfigStore) |
| :mod:`~trainer.cli.errors` | a user's mistake as a short message, exit code 1, nothing left behind |
| :mod:`~trainer.cli.run_dirs` | one run directory per run, and ``ckpt_path=last`` within a run |
| :mod:`~trainer.cli.tuning` | ``task=lr_find``, ``task=scale_batch_size``, the optimised metric of a sweep |
"""

from __future__ import annotations

from trainer.cli.app import main

__all__ = ["main"]
