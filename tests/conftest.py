"""Test-wide environment: offline hubs, CPU DeepSpeed, Triton's interpreter without a GPU, the `gpu`
marker, and the `process` marker that `make test-fast` leaves out."""

import inspect
import os
import re
import signal
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    # A suite started in the background by a non-interactive shell (`make test &`, nohup) inherits an
    # ignored SIGINT, and so would every process a test starts (Python keeps an ignored SIGINT
    # ignored): the tests of Ctrl-C would wait forever. They are about a terminal's Ctrl-C.
    signal.signal(signal.SIGINT, signal.default_int_handler)

if not torch.cuda.is_available():
    # Triton kernels run in Triton's CPU interpreter here; it is chosen when triton is imported, so
    # before any test module imports it (importing torch does not).
    os.environ.setdefault("TRITON_INTERPRET", "1")


TESTS = Path(__file__).resolve().parent
STARTS_A_PROCESS = re.compile(r"\bsubprocess\b|\bPopen\b|\bmultiprocessing\b|sys\.executable|ProcessPoolExecutor|\bmp\.spawn\b")
"""What a test (or a helper of the tests it calls) writes to start another process."""


def _names_a_process(function: object, depth: int = 3) -> bool:
    """Whether ``function``'s source, or that of a function of the test tree it calls (``depth``
    levels down), starts another process (:data:`STARTS_A_PROCESS`)."""
    try:
        source = inspect.getsource(function)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return False
    if STARTS_A_PROCESS.search(source):
        return True
    module = inspect.getmodule(function)
    code = getattr(function, "__code__", None)
    if depth == 0 or module is None or code is None:
        return False
    for name in code.co_names:
        helper = inspect.unwrap(getattr(module, name, None))  # through functools.lru_cache and the like
        path = inspect.getsourcefile(helper) if inspect.isfunction(helper) else None
        if path and Path(path).resolve().is_relative_to(TESTS) and helper is not function:
            if _names_a_process(helper, depth - 1):
                return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``process`` the tests that start another process (read from their source, or marked by
    hand where the process starts inside kerple); skip tests marked ``gpu`` when no CUDA device is present."""
    for item in items:
        function = getattr(item, "function", None)
        if function is not None and "process" not in item.keywords and _names_a_process(function):
            item.add_marker(pytest.mark.process)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def one_thread():
    """Run the test on one torch thread, then restore the setting. For tests of tiny models: on a
    shared 2-core machine torch's thread hand-offs cost more than they save (10x measured)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
