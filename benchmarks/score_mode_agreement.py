"""How often the two legitimate importance modes select the same tokens.

vase_triton *emits* importance: each decode step adds its softmax probabilities over
all cached keys (candidates and recent window alike) into the score buffer. The VaSE
authors' reference stores the last `window` queries and recomputes a softmax over the
candidates only. The two differ only in each query's normaliser, so they weight the
window's queries differently; this script measures how much that changes the
selection (deterministic top-k, pooled, no value protection, sinks excluded).

    python benchmarks/score_mode_agreement.py [--trials 20]

Keys and queries are synthetic (Gaussian, a few heavy-hitter keys that some queries
attend to strongly, and a per-query recency bias), at Qwen3-like sizes: D = 128,
4 query heads per KV head.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F


def pooled(scores: torch.Tensor, width: int) -> torch.Tensor:
    """Average pool of width `width` along the last dim, zero-padded. `[G, N] -> [G, N]`."""
    return F.avg_pool1d(scores.unsqueeze(1), width, stride=1, padding=width // 2, count_include_pad=True).squeeze(1)


def selection_agreement(
    *, recency: float, capacity: int, window: int, budget: int, group: int, head_dim: int, pool: int, generator: torch.Generator
) -> float:
    """Fraction of the kept candidates that both modes keep, for one synthetic row."""
    candidates = capacity - window
    keys = torch.randn(capacity, head_dim, generator=generator, dtype=torch.float64)
    heavy = torch.randint(0, capacity - window, (8,), generator=generator)
    keys[heavy] *= 3.0
    queries = torch.randn(window, group, head_dim, generator=generator, dtype=torch.float64)
    focus = heavy[torch.randint(0, 8, (window, group), generator=generator)]
    queries += 0.5 * keys[focus]
    logits = torch.einsum("wgd,nd->wgn", queries, keys) / head_dim**0.5  # [W, G, C]
    # Recency: each query attends strongly to the tokens just before it, by an amount that
    # varies per query and head, so the share of mass on the recent window varies too.
    query_pos = torch.arange(candidates, capacity, dtype=torch.float64).view(window, 1, 1)
    distance = (query_pos - torch.arange(capacity, dtype=torch.float64).view(1, 1, capacity)).clamp_min(0)
    strength = recency * torch.rand(window, group, 1, generator=generator, dtype=torch.float64)
    logits = logits + strength * torch.exp(-distance / 16.0)

    emitted = torch.softmax(logits, dim=-1)[..., :candidates].sum(dim=(0, 1))
    recomputed = torch.softmax(logits[..., :candidates], dim=-1).mean(dim=(0, 1))
    keep = budget - window
    chosen_emitted = set(pooled(emitted.unsqueeze(0), pool)[0].topk(keep).indices.tolist())
    chosen_recomputed = set(pooled(recomputed.unsqueeze(0), pool)[0].topk(keep).indices.tolist())
    return len(chosen_emitted & chosen_recomputed) / keep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(args.seed)
    print("| recency bias | budget | window | mean agreement | min agreement |")
    print("|---:|---:|---:|---:|---:|")
    window = 64
    for recency, budget in [(r, b) for r in (6.0, 30.0) for b in (256, 1024, 2048)]:
        agreements = torch.tensor(
            [
                selection_agreement(
                    recency=recency, capacity=budget + window, window=window, budget=budget, group=4, head_dim=128, pool=5,
                    generator=generator,
                )
                for _ in range(args.trials)
            ]
        )
        print(f"| {recency:g} | {budget} | {window} | {agreements.mean():.3f} | {agreements.min():.3f} |")


if __name__ == "__main__":
    main()
