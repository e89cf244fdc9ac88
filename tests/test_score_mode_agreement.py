"""`benchmarks/score_mode_agreement.py`: its summary statistics and its argument errors."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.score_mode_agreement import summarise

REPO = Path(__file__).resolve().parents[1]


def test_summary_is_mean_tail_quantile_and_extreme_or_a_dash_without_values() -> None:
    values = [0.5, 1.0, 0.75, 0.25, 1.0]
    low = statistics.quantiles(values, n=10, method="inclusive")[0]  # the 10th percentile, linear
    assert summarise(values, 0.1) == f"{statistics.mean(values):.3f} / {low:.3f} / {min(values):.3f}"
    assert summarise(values, 0.9).endswith(f" / {max(values):.3f}")
    assert summarise([], 0.1) == "—"  # a budget the sequences never filled: no eviction to compare


@pytest.mark.parametrize(
    "argv, message",
    [(["--sequences", "0"], "argument --sequences: expected a positive integer; got 0"),
     (["--budget", "16", "--window", "32"], "--budget: 16 with --window 32: budget: expected budget > window"),
     (["--model", "no/such/dir"], "--model: expected 'testbed', 'tiny' or a local checkpoint directory")],
)  # fmt: skip
def test_bad_arguments_are_one_line_errors(argv, message) -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/score_mode_agreement.py", *argv], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "VASE_BACKEND": "torch"}, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2 and message in result.stderr.strip().splitlines()[-1], result.stderr
