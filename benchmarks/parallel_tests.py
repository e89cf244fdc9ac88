"""Run pytest tests in several processes at once: `gpu_check.sh`'s fallback where pytest-xdist is absent.

    python -m benchmarks.parallel_tests --jobs 8 --log-dir OUT/tests [-k EXPRESSION] tests/test_a.py tests/test_b.py

Run it from the tests' rootdir (the repository root): node ids are relative to it.

Collects the tests of the given files once (those `-k` selects, as pytest's `-k`), deals
their node ids out to `--jobs` groups in turn (neighbouring parametrisations, which compile
alike, land in different groups) and runs each group in its own `python -m pytest` process,
all at once. Each group writes
`LOG_DIR/group-<i>.log`; this prints every group's failures and its summary line, and exits
with the first non-zero status of a group (0 when every group passed, or when no test was
collected). SIGINT and SIGTERM are passed on to the groups, which then report the tests they
finished, as pytest does when interrupted.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
from pathlib import Path

# `--verbosity` sets the level outright, after any -q / -v in PYTEST_ADDOPTS: the node ids this
# reads from collection and the summary lines it prints have the layout of -q.
PYTEST_OPTIONS = ("--verbosity=-1", "-p", "no:cacheprovider", "-rfEs")
_EXIT_NO_TESTS = 5  # pytest's status when nothing was collected
# pytest's closing line: "=== 3 passed, 1 skipped in 2.01s ===", "no tests ran in 0.01s" (-q drops the "=").
_FINAL_LINE = re.compile(r"^=*\s*(\d+ \w+.*|no tests ran) in [\d.]+s")


def _child_defaults() -> None:
    """In a group's process, before pytest starts: SIGINT by default. A shell that starts a script in
    the background ignores SIGINT in it, and an ignored SIGINT would stay ignored in the groups,
    which then could not be interrupted."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def collect(files: list[str], keyword: str | None = None) -> list[str]:
    """Node ids of the tests in `files` (those pytest's `-k keyword` selects), in collection order."""
    selection = [] if keyword is None else ["-k", keyword]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "--verbosity=-1", "-p", "no:cacheprovider", *selection,
         *files],
        capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode not in (0, _EXIT_NO_TESTS):
        sys.stdout.write(result.stdout + result.stderr)
        raise SystemExit(result.returncode)
    return [line for line in result.stdout.splitlines() if "::" in line and not line.startswith(" ")]


def deal(node_ids: list[str], jobs: int) -> list[list[str]]:
    """`node_ids` dealt to at most `jobs` non-empty groups in turn."""
    groups = [node_ids[index::jobs] for index in range(max(1, jobs))]
    return [group for group in groups if group]


def summary_lines(log: str) -> list[str]:
    """The short test summary (failures, errors) and the final counts of a pytest log."""
    lines = log.splitlines()
    kept = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
    counts = [line for line in lines if _FINAL_LINE.match(line)]
    return kept + counts[-1:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="test files (or node ids) to run")
    parser.add_argument("--jobs", type=int, default=8, help="pytest processes at once (default 8)")
    parser.add_argument("--log-dir", type=Path, required=True, help="where each group's log goes")
    parser.add_argument("-k", dest="keyword", help="run only the tests this pytest -k expression selects")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs: expected a positive number of processes; got {args.jobs}")

    node_ids = collect(args.files, args.keyword)
    groups = deal(node_ids, args.jobs)
    print(f"{len(node_ids)} tests in {len(groups)} processes")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    logs = [args.log_dir / f"group-{index}.log" for index in range(len(groups))]
    processes = []
    for group, log in zip(groups, logs):
        with log.open("w") as sink:
            command = [sys.executable, "-m", "pytest", *PYTEST_OPTIONS, *group]
            processes.append(
                subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, preexec_fn=_child_defaults)
            )

    def forward(signum, frame) -> None:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    statuses = [process.wait() for process in processes]
    for index, (log, status) in enumerate(zip(logs, statuses)):
        print(f"-- group {index} (exit {status}, {log})")
        for line in summary_lines(log.read_text(errors="replace")):
            print(line)
    return next((status for status in statuses if status != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
