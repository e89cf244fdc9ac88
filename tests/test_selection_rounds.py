"""The replay of the eviction selection's threshold search (`benchmarks/selection_rounds.py`)
against a sort: the slots it keeps, and the rounds it takes."""

import io
from contextlib import redirect_stdout

import pytest
import torch

from benchmarks import selection_rounds
from vase_triton import reference

# Rounds for the whole int32 range cut into PROBES + 1 parts a round, with no early stop.
MAX_ROUNDS = {1: 32, 4: 14, 16: 8}


def most_rounds(size: int, probes: int) -> int:
    """Rounds that cut a range of `size` values to one, each keeping at most `ceil(size / (probes + 1))`."""
    rounds = 0
    while size > 1:
        size = -(-size // (probes + 1))
        rounds += 1
    return rounds


def _kept(ordered: torch.Tensor, eligible: torch.Tensor, count: int, threshold: torch.Tensor) -> torch.Tensor:
    """`[R, N]` bool: what the kernel keeps given a threshold: eligible values above it, then ties in slot order."""
    above = eligible & (ordered > threshold[:, None])
    ties = eligible & (ordered == threshold[:, None])
    room = count - above.sum(dim=1, keepdim=True)
    return above | (ties & (ties.cumsum(dim=1) <= room))


def test_ordered_bits_sort_like_the_floats_and_equate_the_zeros():
    values = torch.tensor([float("-inf"), -3e38, -2.0, -1e-45, -0.0, 0.0, 1e-45, 1.0, 1.0000001, 3e38, float("inf")])
    bits = selection_rounds.ordered_bits(values)
    assert torch.equal(bits[4], bits[5])
    steps = bits[1:] - bits[:-1]
    assert (steps[torch.arange(steps.numel()) != 4] > 0).all()


@pytest.mark.parametrize("probes", sorted(MAX_ROUNDS))
@pytest.mark.parametrize("kind", ["distinct", "ties", "all equal"])
@pytest.mark.parametrize("count", [1, 37, 200])
def test_replay_keeps_the_count_largest_and_stops_within_the_bound(probes, kind, count):
    generator = torch.Generator().manual_seed(probes * 1000 + count)
    rows, slots = 6, 257
    if kind == "distinct":
        values = torch.randn(rows, slots, generator=generator) * 1e3
    elif kind == "ties":
        values = torch.randint(-5, 6, (rows, slots), generator=generator).to(torch.float32) / 4
    else:
        values = torch.full((rows, slots), -0.75)
    eligible = torch.rand(rows, slots, generator=generator) < 0.9
    eligible[:, :count] = True  # every row has at least `count` eligible slots
    ordered = selection_rounds.ordered_bits(values)

    threshold, rounds = selection_rounds.search_threshold(ordered, eligible, count, probes)

    expected = reference._largest_mask(ordered.to(torch.float64), eligible, count)
    assert torch.equal(_kept(ordered, eligible, count, threshold), expected)
    for row in range(rows):
        span = ordered[row][eligible[row]]
        assert 0 <= rounds[row] <= most_rounds(int(span.max() - span.min()) + 1, probes)
    if kind == "all equal":  # the search starts and ends at the one eligible value
        assert (rounds == 0).all()


def test_a_search_over_the_whole_int32_range_takes_at_most_32_14_or_8_rounds():
    assert {probes: most_rounds(2**32, probes) for probes in MAX_ROUNDS} == MAX_ROUNDS


def test_distinct_keys_stop_early_when_a_probe_splits_them_exactly():
    # Two eligible values far apart: the first probe of each search separates them.
    ordered = selection_rounds.ordered_bits(torch.tensor([[-1e30, 1e30]]))
    eligible = torch.ones(1, 2, dtype=torch.bool)
    for probes in MAX_ROUNDS:
        threshold, rounds = selection_rounds.search_threshold(ordered, eligible, 1, probes)
        assert rounds.tolist() == [1]
        assert ordered[0, 0] < threshold[0] <= ordered[0, 1]


def test_the_report_has_a_row_per_case_search_and_probe_count_and_chunked_rows_agree(monkeypatch):
    rows = selection_rounds.random_rows(5, 192, selection_rounds.VaSEConfig(policy="vase", budget=128), 32, seed=3)
    whole = selection_rounds.search_threshold(rows.key_bits, rows.key_eligible, rows.k_sampled, 4)[1]
    monkeypatch.setattr(selection_rounds, "_COMPARISONS_PER_CHUNK", 2 * 4 * 192)  # two rows a chunk
    chunked = selection_rounds.search_rounds(rows.key_bits, rows.key_eligible, rows.k_sampled, 4)
    assert torch.equal(whole, chunked)

    out = io.StringIO()
    with redirect_stdout(out):
        selection_rounds.main(["--budget", "128", "--rows", "4", "--prompt", "256", "--head-dim", "32"])
    table = [line for line in out.getvalue().splitlines() if line.startswith("| decode") or line.startswith("| prompt")]
    assert len(table) == 2 * 2 * len(MAX_ROUNDS)
    for line in table:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        probes, mean, largest = int(cells[4]), float(cells[5]), int(cells[8])
        assert 1 <= mean <= largest <= MAX_ROUNDS[probes]
