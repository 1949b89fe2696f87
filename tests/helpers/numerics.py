"""The CPU kernels the test suite and its recording scripts compute with, pinned to one code path.

Several tests compare final weights bit for bit with numbers recorded once (Lightning's, in
``tests/data``). Left alone, torch picks its vectorised kernels (AVX2, AVX-512) and MKL its BLAS code
path by the CPU it finds, so the last bits of a matrix product or a reduction differ from one
machine to the next and a recording holds only on the machine that made it. Pinned, ATen runs its
baseline kernels and MKL its conditional-numerical-reproducibility path, which give the same bits on
any x86-64 CPU. :func:`pin` must run before torch is imported (both read the setting once);
``tests/conftest.py`` calls it first, and each recording script calls it (loaded by path, so the
scripts need nothing of geartrain).
"""

from __future__ import annotations

import os
import sys

#: Environment variables read by ATen's dispatcher and by MKL when they start.
PINNED = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}


def pin() -> None:
    """Set :data:`PINNED` in this process's environment (and so in every process it starts)."""
    os.environ.update(PINNED)
    torch = sys.modules.get("torch")
    if torch is not None and torch.backends.cpu.get_cpu_capability() != "DEFAULT":
        raise RuntimeError("pin the CPU kernels before importing torch: torch reads the setting once")
