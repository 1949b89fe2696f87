"""The harness of Lightning's tests as geartrain's runner provides it (replaces tests_pytorch/conftest.py).

It imports torch only where a fixture needs it (the tests import it anyway). Lightning's own ``conftest.py`` imports Lightning's internals (signal connector, launchers) to set
every test up; this one gives the same fixtures from public means. Fixtures that fake hardware by
patching Lightning's internals (``cuda_count_2``, ``tpu_available``, ...) fail the test with
:data:`INTERNALS_FIXTURE`, which the classifier counts as "needs Lightning internals".
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

INTERNALS_FIXTURE = "harness: this fixture fakes hardware by patching Lightning internals"
_RANK_HOLDERS = ("lightning.pytorch.utilities.rank_zero", "lightning_utilities.core.rank_zero")


@pytest.fixture(scope="session")
def datadir() -> Path:
    """Where Lightning's tests keep downloaded data sets (none are downloaded here)."""
    return Path(__file__).parents[2] / "Datasets"


@pytest.fixture(autouse=True)
def preserve_global_rank_variable() -> Iterator[None]:
    """``rank_zero_only.rank`` as it was before the test, in every module imported so far that holds one."""
    holders = [sys.modules[name].rank_zero_only for name in _RANK_HOLDERS if name in sys.modules]
    ranks = [getattr(fn, "rank", None) for fn in holders]
    yield
    for fn, rank in zip(holders, ranks):
        if rank is not None:
            fn.rank = rank


@pytest.fixture(autouse=True)
def restore_env_variables() -> Iterator[None]:
    """The environment as it was before the test."""
    saved = os.environ.copy()
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def restore_signal_handlers() -> Iterator[None]:
    """Signal handlers as they were before the test (for tests that skip the Trainer's tear-down)."""
    valid = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}
    handlers = {signum: signal.getsignal(signum) for signum in valid}
    yield
    for signum, handler in handlers.items():
        if handler is not None:
            with contextlib.suppress(OSError, ValueError):
                signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def teardown_process_group() -> Iterator[None]:
    """No process group outlives its test."""
    yield
    torch = sys.modules.get("torch")  # a test that never imported torch made no process group
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture(autouse=True)
def reset_deterministic_algorithm() -> Iterator[None]:
    """``torch.use_deterministic_algorithms`` off again after a test that set ``deterministic=True``."""
    yield
    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    if "torch" in sys.modules:
        sys.modules["torch"].use_deterministic_algorithms(False)


@pytest.fixture
def cuda_count_0() -> None:
    """The machine has no CUDA device already."""
    import torch

    if torch.cuda.is_available():
        pytest.fail(INTERNALS_FIXTURE)


@pytest.fixture
def mps_count_0() -> None:
    """The machine has no MPS device already."""


def _internals_fixture(name: str) -> Any:
    def fixture() -> None:
        pytest.fail(INTERNALS_FIXTURE)

    fixture.__name__ = name
    return pytest.fixture(fixture, name=name)


def mock_cuda_count(*_: Any, **__: Any) -> None:
    """Lightning's helper that fakes CUDA devices by patching its internals."""
    pytest.fail(INTERNALS_FIXTURE)


mock_mps_count = mock_tpu_available = mock_xla_available = mock_cuda_count

cuda_count_1 = _internals_fixture("cuda_count_1")
cuda_count_2 = _internals_fixture("cuda_count_2")
cuda_count_4 = _internals_fixture("cuda_count_4")
mps_count_1 = _internals_fixture("mps_count_1")
mps_count_4 = _internals_fixture("mps_count_4")
xla_available = _internals_fixture("xla_available")
tpu_available = _internals_fixture("tpu_available")


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """``caplog`` that sees Lightning's and geartrain's loggers even where they do not propagate."""
    names = [n for n in logging.root.manager.loggerDict if n.startswith(("lightning", "trainer", "callbacks"))]
    saved = {name: logging.getLogger(name).propagate for name in names}
    for name in names:
        logging.getLogger(name).propagate = True
    yield caplog
    for name, propagate in saved.items():
        logging.getLogger(name).propagate = propagate


@pytest.fixture
def tmpdir_server(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """An HTTP server over ``tmp_path`` (for tests that load checkpoints from a URL)."""
    handler = partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    with ThreadingHTTPServer(("localhost", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield server.server_address  # type: ignore[misc]
        server.shutdown()


@pytest.fixture
def single_process_pg() -> Iterator[None]:
    """A gloo process group of this process alone, destroyed after the test."""
    import torch.distributed

    saved = os.environ.copy()
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    torch.distributed.init_process_group("gloo")
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(saved)
