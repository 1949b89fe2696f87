"""Benchmarks: geartrain against its hand-written PyTorch twin, measured side by side in one run.

Run ``python -m bench`` (or ``make bench``) for the whole table, ``python -m bench overhead import``
for a subset, ``python -m bench --quick`` for a seconds-long smoke run (what the tests use). Each
geartrain measurement is paired with the hand-written one and the two alternate (A B A B ...), so
machine noise hits both alike; the table reports the median of the per-pair ratios.
"""
