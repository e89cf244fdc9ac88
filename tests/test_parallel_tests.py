"""`benchmarks.parallel_tests`: tests dealt to several pytest processes, their failures reported."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.parallel_tests import deal, summary_lines

REPO = Path(__file__).resolve().parents[1]


def test_deal_spreads_neighbours_over_groups_and_drops_empty_ones() -> None:
    ids = [f"t.py::test[{index}]" for index in range(5)]
    assert deal(ids, 2) == [ids[0::2], ids[1::2]]
    assert deal(ids, 8) == [[node] for node in ids]
    assert deal([], 3) == []


def test_summary_keeps_failures_errors_and_the_final_counts() -> None:
    log = "....F\n=== short test summary info ===\nFAILED t.py::test_b - assert 0\nERROR t.py::c\n1 failed, 4 passed in 0.1s\n"
    assert summary_lines(log) == ["FAILED t.py::test_b - assert 0", "ERROR t.py::c", "1 failed, 4 passed in 0.1s"]
    # Whatever the counts say, including none: skips alone, an interrupted group, the layout of -v.
    for final in ("2 skipped in 0.01s", "no tests ran in 0.02s", "=== 1 passed, 1 error in 0.3s ==="):
        assert summary_lines("ss\n" + final + "\n") == [final]


def _run(tmp_path: Path, *files: str, **env: str) -> subprocess.CompletedProcess:
    """The runner, started in the suite's folder (its rootdir) as `gpu_check.sh` starts it in the repository's."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.parallel_tests", "--jobs", "2", "--log-dir", str(tmp_path / "logs"), *files],
        cwd=tmp_path / "suite", env={**os.environ, "PYTHONPATH": str(REPO), **env}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "test_good.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('n', range(3))\ndef test_even(n):\n    assert (2 * n) % 2 == 0\n"
    )
    (folder / "test_bad.py").write_text("def test_one_is_two():\n    assert 1 == 2\n")
    return folder


def test_a_failing_test_in_any_group_fails_the_run_and_is_named(suite: Path, tmp_path: Path) -> None:
    result = _run(tmp_path, "test_good.py", "test_bad.py")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "4 tests in 2 processes" in result.stdout
    assert "FAILED" in result.stdout and "test_one_is_two" in result.stdout
    logs = sorted((tmp_path / "logs").glob("group-*.log"))
    assert len(logs) == 2
    passed = sum(int(line.split(" passed")[0].split()[-1]) for log in logs for line in summary_lines(log.read_text())
                 if " passed" in line)  # fmt: skip
    assert passed == 3


def test_all_passing_groups_exit_zero(suite: Path, tmp_path: Path) -> None:
    result = _run(tmp_path, "test_good.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 tests in 2 processes" in result.stdout


def test_a_keyword_expression_runs_only_the_tests_it_selects(suite: Path, tmp_path: Path) -> None:
    # As gpu_check.sh leaves the reference's CPU tests out of the CUDA run.
    result = _run(tmp_path, "-k", "not test_one_ and not test_even[1]", "test_good.py", "test_bad.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 tests in 2 processes" in result.stdout and "FAILED" not in result.stdout


@pytest.mark.parametrize("options", ["-q", "-qq", "-v"])
def test_verbosity_options_in_the_environment_change_nothing(suite: Path, tmp_path: Path, options: str) -> None:
    result = _run(tmp_path, "test_good.py", "test_bad.py", PYTEST_ADDOPTS=options)
    assert result.returncode == 1 and "4 tests in 2 processes" in result.stdout, result.stdout + result.stderr
    assert "FAILED test_bad.py::test_one_is_two" in result.stdout


def test_a_run_started_with_sigint_ignored_still_stops_its_groups(tmp_path: Path) -> None:
    """A shell script's background job ignores SIGINT: the groups must not inherit that."""
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "test_slow.py").write_text("import time\n\ndef test_a():\n    time.sleep(60)\n\n"
                                         "def test_b():\n    time.sleep(60)\n")  # fmt: skip
    started = time.monotonic()
    runner = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.parallel_tests", "--jobs", "2", "--log-dir", str(tmp_path / "logs"),
         "test_slow.py"],
        cwd=folder, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    logs = tmp_path / "logs"
    while not all((logs / f"group-{index}.log").exists() for index in range(2)) and time.monotonic() - started < 60:
        time.sleep(0.2)
    time.sleep(3)  # the groups' pytest has started its test
    runner.send_signal(signal.SIGTERM)
    output, _ = runner.communicate(timeout=50)
    assert runner.returncode != 0, output
    assert time.monotonic() - started < 55
