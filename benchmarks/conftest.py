"""Benchmark set-up: the Triton interpreter without CUDA, row collection and the report.

Suites record `reporting.Row`s through the `record_row` fixture; at the end of the
session the rows are printed and, when anything was timed, written as a markdown
record under `benchmarks/results/` (GPU runs only: CPU timings of the interpreter
are not records).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import reporting  # noqa: E402

_ROWS = pytest.StashKey[list]()
_TITLE = "vase_triton benchmarks"


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pytest_configure(config):
    config.stash[_ROWS] = []


@pytest.fixture
def device() -> torch.device:
    return _device()


@pytest.fixture
def record_row(request):
    """Append a `reporting.Row` to this session's report."""
    return request.config.stash[_ROWS].append


def pytest_terminal_summary(terminalreporter, config):
    rows = config.stash.get(_ROWS, [])
    if not rows:
        return
    terminalreporter.section(_TITLE)
    terminalreporter.write(reporting.render_markdown(_TITLE, rows, _device()))
    if torch.cuda.is_available() and any(row.median_s is not None for row in rows):
        path = reporting.write_report(_TITLE, rows, _device())
        terminalreporter.write_line(f"report written to {path}")
