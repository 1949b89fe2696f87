"""Logged values: from ``self.log`` to ``callback_metrics``, the progress bar, the loggers and checkpoints.

| file | what it does |
|---|---|
| :mod:`~trainer.metrics.store` | what ``self.log`` records: per-step values and per-epoch aggregates |
| :mod:`~trainer.metrics.routing` | where the values go: ``callback_metrics``, the progress bar, the loggers |
| :mod:`~trainer.metrics.sync` | epoch values on several processes: the same collectives in the same order |
| :mod:`~trainer.metrics.state` | the checkpoint state of what has accumulated (exact mid-epoch resume) |
| :mod:`~trainer.metrics.results` | the table ``validate``/``test`` print with ``verbose=True`` |
"""
