"""The ``geartrain`` command: its room.

| file | what it does |
|---|---|
| :mod:`~trainer.cli.app` | the Hydra app: builds everything from ``conf/`` and runs a task |
| :mod:`~trainer.cli.checks` | config mistakes seen before anything is built or started |
| :mod:`~trainer.cli.config` | dataclass schemas behind the config groups (Hydra's ConfigStore) |
| :mod:`~trainer.cli.errors` | a user's mistake as a short message, exit code 1, nothing left behind |
| :mod:`~trainer.cli.run_dir_guard` | the run folder locked before Hydra writes; clean-up of only what a run created |
| :mod:`~trainer.cli.run_dirs` | one run directory per run, locked while it runs |
| :mod:`~trainer.cli.sweep_summary` | a study goes on past failed trials and says how many failed and why |
| :mod:`~trainer.cli.tuning` | ``task=lr_find``, ``task=scale_batch_size``, the optimised metric of a sweep |
"""

from __future__ import annotations

from trainer.cli.command import main

__all__ = ["main"]
