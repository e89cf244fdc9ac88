"""`benchmarks/score_mode_agreement.py`: its summary statistics, its argument errors and its chat-turn replay."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.score_mode_agreement import replay, summarise

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
     (["--model", "no/such/dir"], "--model: expected 'testbed', 'tiny' or a local checkpoint directory"),
     (["--turn", "32", "--window", "32"], "--turn: expected fewer tokens than --window (32); got 32")],
)  # fmt: skip
def test_bad_arguments_are_one_line_errors(argv, message) -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/score_mode_agreement.py", *argv], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "VASE_BACKEND": "torch"}, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2 and message in result.stderr.strip().splitlines()[-1], result.stderr


def _captured(queries: torch.Tensor, tokens: int, seed: int) -> list[tuple[torch.Tensor, ...]]:
    """One layer's `(query [1, 4, T, 32], key [1, 2, T, 32], value)` with `queries` as its queries."""
    gen = torch.Generator().manual_seed(seed)
    key, value = (torch.randn(1, 2, tokens, 32, generator=gen) for _ in range(2))
    return [(queries, key, value)]


def test_a_turn_whose_queries_all_agree_evicts_alike_in_both_modes() -> None:
    """With one query vector at every position and head, each query's candidate probabilities
    are one distribution scaled by that query's candidate mass, so `emitted` (the turn's own
    queries, softmax over every slot) and `recompute` (the whole window, softmax over the
    candidates) rank the candidates alike: full agreement, no sampling distance. The count
    follows from the lengths: a 20-token prompt, capacity 32 (budget 24, window 8), turns of 3
    when 3 more tokens would overflow: at tokens 30, 39, 48, 57, 66 and 75 of 80, 2 KV heads each."""
    gen = torch.Generator().manual_seed(0)
    queries = torch.randn(32, generator=gen).expand(1, 4, 80, 32)
    agreements, distances = replay(_captured(queries, 80, seed=1), 20, budget=24, window=8, turn=3)
    assert len(agreements) == len(distances) == 6 * 2
    assert agreements == [1.0] * 12 and max(distances) < 1e-6


def test_a_turn_observes_less_than_the_window_with_emitted_scores() -> None:
    """With queries that differ, the turn's compression is where the modes part: `emitted`
    observes the turn's 3 queries, `recompute` the last 8, so they evict differently, more so
    than when the same tokens are decoded one by one (every eviction then observes 8 queries
    in both modes)."""
    gen = torch.Generator().manual_seed(2)
    captured = _captured(torch.randn(1, 4, 80, 32, generator=gen), 80, seed=3)
    turn_agreements, _ = replay(captured, 20, budget=24, window=8, turn=3)
    decode_agreements, _ = replay(captured, 20, budget=24, window=8)
    assert min(turn_agreements) < 1.0
    assert statistics.mean(turn_agreements) < statistics.mean(decode_agreements)
