"""Data on the trainer's side: which loaders a stage uses, resumable training loaders, micro-batches.

| file | what it does |
|---|---|
| :mod:`~trainer.data.loaders` | which dataloaders a stage uses, prepared for the strategy, combined |
| :mod:`~trainer.data.resumable` | training loaders that resume mid-epoch exactly without replaying batches |
| :mod:`~trainer.data.microbatch` | one training batch as several smaller forward/backward passes |
"""
