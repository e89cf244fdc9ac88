"""Benchmark session set-up: the Triton interpreter without CUDA, the profile, the roofline, records.

Every suite times through `benchmarks.timing` and describes its rows with
`benchmarks.records.Record`; the machine information of the pytest-benchmark JSON gets a
`vase_bench` entry (device, versions, profile, the roofline measured in this session) and
the commit falls back to `VASE_BENCH_COMMIT` when there is no git directory.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from benchmarks import environment, profiles, timing  # noqa: E402

_ROOFLINE = pytest.StashKey[dict]()


def pytest_configure(config):
    try:
        profile = profiles.active()
    except ValueError as error:  # a usage error, not a crash: one line, no traceback
        raise pytest.UsageError(str(error)) from None
    if profile in ("smoke", "cpu"):
        # One thread: tiny tensors gain nothing from a second one, and CPU measurements on a
        # shared machine are steadier on one core.
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="session")
def roofline(request):
    """The measured `timing.Roofline` of this session's GPU (measured once), None on CPU."""
    if not torch.cuda.is_available():
        return None
    measured = timing.measure_roofline(torch.device("cuda"))
    request.config.stash[_ROOFLINE] = measured.as_dict()
    return measured


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["vase_bench"] = environment.describe(profiles.active(), config.stash.get(_ROOFLINE, None))


def pytest_benchmark_update_commit_info(config, commit_info):
    label = environment.commit_label()
    if label is not None and not commit_info.get("id"):
        commit_info["id"] = label
        commit_info.pop("error", None)


def pytest_terminal_summary(terminalreporter, config):
    if profiles.active() == "smoke":
        terminalreporter.write_line(
            "benchmarks ran in the smoke profile: tiny shapes, Triton interpreter on CPU — a check that every "
            "suite runs, not a measurement"
        )
