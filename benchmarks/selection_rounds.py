"""How many rounds the eviction selection's threshold search takes, per number of probes.

The selection (`vase_triton/kernels/eviction.py`) finds the `count`-th largest of a row's
keys by a search over their order-preserving int32 images. It starts from the range
between the row's least and largest eligible key; each round counts the keys at or above
`PROBES` thresholds that cut the remaining range into `PROBES + 1` near-equal parts, keeps
the part that holds the answer, and stops early once a threshold has exactly `count` keys
at or above it. One probe bisects (at most 32 rounds); 4 probes take at most 14 rounds and
16 at most 8, each round counting 4 or 16 times as much. This script
replays that search, with the kernel's integer arithmetic, on random rows and counts its
rounds (it times nothing):

- the value protection: the `n_protect - n_sink` largest value ranges (`max(v) - min(v)`)
  of bfloat16 value vectors, which tie often since bf16 differences take few values;
- the sampling: the Gumbel keys `log(w) + g` of the candidates left after the sinks and
  the protected, of which the `budget - window - n_protect` largest are kept.

    python benchmarks/selection_rounds.py [--budget 4096] [--rows 256] [--prompt 32768] [--seed 0]

A decode-time eviction selects among `budget` candidates; a prompt of `--prompt` tokens
compressed at prefill selects among `prompt - window` (the tiled kernel's case, whose
search is the same). A kernel program that holds several rows runs until its slowest row
has finished, so the table also gives each kind's maximum. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vase_triton import reference  # noqa: E402
from vase_triton.config import VaSEConfig  # noqa: E402

PROBE_COUNTS = (1, 4, 16)
# Rows searched at once: bounds the `[rows, PROBES, N]` comparison tensor of a round.
_COMPARISONS_PER_CHUNK = 1 << 26


def ordered_bits(values: torch.Tensor) -> torch.Tensor:
    """`[..., N]` int64: the int32 image of float32 `values` whose order is the float order (-0 == +0)."""
    bits = (values.to(torch.float32) + 0.0).view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def search_threshold(ordered: torch.Tensor, eligible: torch.Tensor, count: int, probes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Replay the selection's search for the threshold of the `count` largest `ordered` values among `eligible`.

    Args:
        ordered: `[R, N]` int64 order-preserving images (`ordered_bits`).
        eligible: `[R, N]` bool; every row has at least `count` eligible values.
        count: how many values the threshold keeps at or above it (`>= 1`).
        probes: thresholds counted per round.

    Returns:
        `([R] int64 threshold, [R] int64 rounds)`: a `t` with exactly `count` eligible values
        `>= t` where the search met one, else the `count`-th largest eligible value (ties at
        it are then kept in slot order); and the rounds the row took.
    """
    lo = torch.where(eligible, ordered, 2**31 - 1).amin(dim=1)
    hi = torch.maximum(torch.where(eligible, ordered, -(2**31)).amax(dim=1), lo)
    rounds = torch.zeros(ordered.shape[0], dtype=torch.int64)
    j = torch.arange(1, probes + 1, dtype=torch.int64)
    while bool((hi > lo).any()):
        active = hi > lo
        size = hi - lo + 1
        points = lo[:, None] + (size[:, None] * j[None, :]) // (probes + 1)  # [R, P]
        hits = eligible[:, None, :] & (ordered[:, None, :] >= points[:, :, None])  # [R, P, N]
        n_at_least = hits.sum(dim=2)  # [R, P]
        part = (n_at_least >= count).sum(dim=1)  # [R], in [0, P]
        new_lo = lo + (size * part) // (probes + 1)
        new_hi = lo + (size * (part + 1)) // (probes + 1) - 1
        n_at_new_lo = n_at_least.gather(1, (part - 1).clamp_min(0)[:, None]).squeeze(1)
        exact = (part > 0) & (n_at_new_lo == count)
        rounds += active.to(torch.int64)
        lo = torch.where(active, new_lo, lo)
        hi = torch.where(active, torch.where(exact, new_lo, new_hi), hi)
    return lo, rounds


def search_rounds(ordered: torch.Tensor, eligible: torch.Tensor, count: int, probes: int) -> torch.Tensor:
    """`[R]` int64 rounds of `search_threshold`, in chunks of rows that bound its memory."""
    chunk = max(1, _COMPARISONS_PER_CHUNK // (probes * ordered.shape[1]))
    return torch.cat([
        search_threshold(ordered[start:start + chunk], eligible[start:start + chunk], count, probes)[1]
        for start in range(0, ordered.shape[0], chunk)
    ])


class SelectionRows(NamedTuple):
    """The two searches of one eviction of `R` random rows: keys, eligibility and count of each."""

    magnitude_bits: torch.Tensor  # [R, N] int64
    magnitude_eligible: torch.Tensor  # [R, N] bool
    n_large: int
    key_bits: torch.Tensor  # [R, N] int64
    key_eligible: torch.Tensor  # [R, N] bool
    k_sampled: int


def random_rows(num_rows: int, num_slots: int, config: VaSEConfig, head_dim: int, seed: int) -> SelectionRows:
    """One eviction of `num_rows` rows of `num_slots` slots (`num_slots - window` candidates):
    bf16 values drawn N(0, 1), importance a softmax of N(0, 1) logits, Gumbel noise of the
    reference's stream; the protected and sampled sets are the reference's."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(1, num_rows, num_slots, head_dim, generator=generator).to(torch.bfloat16)
    magnitudes = reference.value_magnitude(values, config.value_stat)  # [1, R, N]
    importance = torch.softmax(torch.randn(1, num_rows, num_slots, generator=generator), dim=-1)
    uniforms = reference.eviction_uniforms((1, num_rows, num_slots), torch.device("cpu"), seed=seed, eviction_index=0)
    survivors = reference.select_survivors(
        importance, magnitudes, torch.tensor([num_slots]), budget=config.budget, window=config.window,
        n_sink=config.n_sink, n_protect=config.resolved_n_protect, temperature=config.temperature, uniforms=uniforms,
    )
    slot = torch.arange(num_slots)
    non_sink_candidate = (slot >= config.n_sink) & (slot < num_slots - config.window)  # [N]
    n_large = max(0, config.resolved_n_protect - config.n_sink)
    return SelectionRows(
        magnitude_bits=ordered_bits(magnitudes[0]),
        magnitude_eligible=non_sink_candidate.expand(num_rows, num_slots),
        n_large=n_large,
        key_bits=ordered_bits(survivors.sampling_keys[0]),
        key_eligible=non_sink_candidate & ~survivors.protected[0],
        k_sampled=config.budget - config.window - config.n_sink - n_large,
    )


def _summary(rounds: torch.Tensor) -> str:
    values = rounds.to(torch.float64)
    return (f"{values.mean().item():.1f} | {values.median().item():.0f} | "
            f"{values.quantile(0.9).item():.0f} | {int(values.max().item())}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=4096)
    parser.add_argument("--rows", type=int, default=256, help="random rows per case")
    parser.add_argument("--prompt", type=int, default=32768, help="prompt length of the prefill case; 0 skips it")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = VaSEConfig(policy="vase", budget=args.budget)
    cases = [("decode eviction", config.budget + config.window)]
    if args.prompt:
        cases.append(("prompt compression", args.prompt))

    print(f"## Threshold-search rounds of the eviction selection (policy vase, budget {config.budget}, "
          f"window {config.window}, n_protect {config.resolved_n_protect}, D {args.head_dim}, "
          f"{args.rows} random rows per case, seed {args.seed})\n")
    print("| case | slots | search | kept of eligible | probes | mean | median | p90 | max |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for name, num_slots in cases:
        rows = random_rows(args.rows, num_slots, config, args.head_dim, args.seed)
        searches = (
            ("value ranges (bf16)", rows.magnitude_bits, rows.magnitude_eligible, rows.n_large),
            ("Gumbel keys", rows.key_bits, rows.key_eligible, rows.k_sampled),
        )
        for search, bits, eligible, count in searches:
            eligible_count = int(eligible[0].sum())
            for probes in PROBE_COUNTS:
                rounds = search_rounds(bits, eligible, count, probes)
                print(f"| {name} | {num_slots} | {search} | {count} of {eligible_count} | {probes} | {_summary(rounds)} |")


if __name__ == "__main__":
    main()
