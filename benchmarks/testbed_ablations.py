"""Ablations on the testbed: one switch at a time, the same problems, budgets and seeds.

    python benchmarks/testbed_ablations.py [--seeds 5] [--out DIR]

Each ablation runs one policy with `vase-triton eval`'s testbed defaults (64 held-out
problems, greedy, window 16, budgets at 2x, 4x and 8x compression) as shipped and with
one switch turned, once per run seed (which fixes every eviction's draws), and sums the
answers right and the whole traces exact over the seeds:

- value protection (`protect_values`): off for `vase`, on for `snapkv`;
- survivor order (`vase`, `snapkv`, `rkv`), a deviation from the VaSE authors' code: ours
  keeps survivors in temporal order; theirs writes [sinks and protected by decreasing value
  magnitude, sampled in draw order, recent window], and their SnapKV and R-KV baselines
  write the kept candidates by decreasing score (the switch keeps our sinks first), so
  after the first eviction an average pool smooths over permuted neighbours;
- the precision of `vase`'s importance, a deviation: ours computes the window attention
  in float32; theirs takes the logits of a bfloat16 matmul, casts the float32 softmax's
  probabilities back to bfloat16 and averages them in bfloat16;
- the precision of `vase`'s value range, a deviation: ours takes `amax - amin` in
  float32; theirs in the cache's dtype. Both precision ablations run the testbed in
  bfloat16 (`--dtype bfloat16`), where the two differ;
- `vase-dkv`'s projections, a deviation too: ours draws one per layer, row and KV head;
  theirs draws one per row and shares it across the KV heads;
- `vase-dkv`'s projection precision, a deviation: ours projects the cache against a float32
  `G`; theirs casts `G` to the model's dtype and computes the projections, their squared
  norms, the product and its normalisation in it. Both variants run the testbed in
  bfloat16 (`--dtype bfloat16`), where the two differ;
- the eviction trigger (`vase`), a deviation: ours evicts when a row reaches
  `budget + window` tokens and drops `window`; theirs evicts after any decode step that
  leaves more than `budget` tokens at a multiple of `window`, down to `budget`. The two
  differ when `budget` is not a multiple of `window`, as at every testbed budget (135, 68
  and 34 at window 16);
- prompt compression (`vase`), a deviation: ours compresses a prompt longer than
  `C = budget + window` at prefill, with its last `window` queries; the authors' cache
  holds the whole prompt and evicts it while decoding, at their trigger. The testbed's
  66-token prompt is longer than `C` at 8x (budget 34). Both variants run under the
  authors' trigger, so that they differ only in the prompt's compression. The same
  switch at budget 50, where the prompt fills `C` exactly ("prompt of C tokens"): ours
  evicts at the first decode step with the prompt's last queries, theirs 14 steps later;
- sinks in the baselines `snapkv` and `rkv`, a deviation: ours keeps the first `n_sink`
  tokens under every evicting policy, the authors' SnapKV and R-KV modes keep none;
- R-KV's `λ` (`rkv`): ours defaults to 0.1, R-KV's value; the authors' scripts pass 0.5;
- the authors' baselines whole ("authors' baselines"): `snapkv` without sinks and with
  survivors by decreasing score, `rkv` the same and at `λ = 0.5`, the baselines the paper
  compares `vase` against.

Runs on the CPU with the PyTorch reference, which the switches patch: about 10 s a run.
`--only NAME` runs the ablations of that name alone (repeatable).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, ContextManager, Iterator, NamedTuple, Optional
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vase_triton import VaSEConfig, cli, policies, reference  # noqa: E402
from vase_triton.cache import VaSECacheLayer  # noqa: E402
from vase_triton.cache_tensors import slot_mask  # noqa: E402
from vase_triton.commands.common import positive_int  # noqa: E402
from vase_triton.eval.runner import RESULTS_FILE, Run, read_results  # noqa: E402
from vase_triton.ops import projected_energy as projected_energy_op  # noqa: E402
from vase_triton.testbed.harness import COMPRESSIONS, SEQUENCE_TOKENS, TESTBED_WINDOW, compression_budget  # noqa: E402
from vase_triton.testbed.task import PROMPT_TOKENS  # noqa: E402

# Slots a testbed prompt takes: its words between `<bos>` and `<think>`.
PROMPT_SLOTS = 1 + PROMPT_TOKENS + 1


def authors_survivor_slots(survivors: reference.Survivors, budget: int) -> torch.Tensor:
    """`reference.survivor_slots` in the authors' order: sinks, then the protected by decreasing
    magnitude, then the sampled by decreasing sampling key (draw order), then the recent window."""
    slot = torch.arange(survivors.sinks.shape[-1], device=survivors.sinks.device).expand_as(survivors.sinks)
    # Order inside each kind: decreasing magnitude, decreasing sampling key, else slot.
    within = torch.where(survivors.sampled, -survivors.sampling_keys, slot.float())
    within = torch.where(survivors.protected, -survivors.magnitudes, within)
    kind = torch.full_like(slot, 4)  # not kept
    for rank, members in enumerate((survivors.sinks, survivors.protected, survivors.sampled, survivors.recent)):
        kind = torch.where(members, rank, kind)
    by_value = torch.sort(within, dim=-1, stable=True).indices
    by_kind = torch.sort(kind.gather(-1, by_value), dim=-1, stable=True).indices
    return by_value.gather(-1, by_kind)[..., :budget]


def shared_projection(draw: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`policies.dkv_projection` with KV head 0's projection used by every KV head of a row."""

    def projection(*args, **kwargs) -> torch.Tensor:
        drawn = draw(*args, **kwargs)  # [B, Hkv, D, rank]
        return drawn[:, :1].expand_as(drawn).contiguous()

    return projection


def authors_bfloat16_energy(
    keys: torch.Tensor, values: torch.Tensor, projection: torch.Tensor, lengths: torch.Tensor, *, window: int
) -> torch.Tensor:
    """`ops.projected_energy` as the authors compute it in a bfloat16 model: `G` cast to
    bfloat16, then `||k G||²`, `||v G||²`, their product and its normalisation over each row's
    candidates, all in bfloat16 (0 past the candidates). Returns `[B, Hkv, N]` float32."""
    projection = projection.to(torch.bfloat16)
    key_energy = ((keys.to(torch.bfloat16) @ projection) ** 2).sum(dim=-1)
    value_energy = ((values.to(torch.bfloat16) @ projection) ** 2).sum(dim=-1)
    candidates = slot_mask(lengths, keys.shape[2], window)  # [B, 1, N]
    energy = torch.where(candidates, key_energy * value_energy, 0.0)
    return (energy / energy.sum(dim=-1, keepdim=True)).float().nan_to_num(0.0)


def authors_bfloat16_window_attention(
    q: torch.Tensor, k: torch.Tensor, candidate_lens: torch.Tensor, *, scale: float,
    q_valid: Optional[torch.Tensor] = None,
) -> torch.Tensor:  # fmt: skip
    """`reference.candidate_attention` as the authors compute it in a bfloat16 model: the logits
    of a bfloat16 matmul divided by `sqrt(D)` in bfloat16, a float32 softmax over the
    candidates whose probabilities are cast back to bfloat16, then their means over the
    window and over the group's query heads in bfloat16. Queries outside `q_valid` add 0.

    Args: as `reference.candidate_attention` (`q` `[B, Hq, W, D]`, `k` `[B, Hkv, N, D]`).
    Returns: `[B, Hkv, N]` float32 holding bfloat16 values, 0 past each row's candidates.
    """
    batch, q_heads, window, head_dim = q.shape
    kv_heads, num_slots = k.shape[1], k.shape[2]
    if window == 0:
        return torch.zeros((batch, kv_heads, num_slots), dtype=torch.float32, device=q.device)
    group = q_heads // kv_heads
    queries = q.to(torch.bfloat16).view(batch, kv_heads, group, window, head_dim)
    logits = (queries @ k.to(torch.bfloat16).unsqueeze(2).transpose(-1, -2)) / (1.0 / scale)  # [B, Hkv, G, W, N]
    hidden = torch.arange(num_slots, device=q.device) >= candidate_lens.to(q.device).view(batch, 1, 1, 1, 1)
    probabilities = torch.softmax(logits.masked_fill(hidden, float("-inf")), dim=-1, dtype=torch.float32)
    probabilities = probabilities.nan_to_num(0.0).to(torch.bfloat16)  # a row with no candidate: 0
    if q_valid is not None:
        probabilities = torch.where(q_valid.view(batch, 1, 1, window, 1), probabilities, 0.0)
    return probabilities.mean(dim=-2).mean(dim=2).float()


def rounded_to_bfloat16(pool: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`pool` (`reference.pooled_candidates`) with its float32 result rounded to bfloat16, as the
    authors' pooling of bfloat16 scores gives."""

    def pooled(*args, **kwargs) -> torch.Tensor:
        return pool(*args, **kwargs).to(torch.bfloat16).float()

    return pooled


@contextlib.contextmanager
def authors_bfloat16_importance() -> Iterator[None]:
    """The window attention of every eviction at the authors' precision (see
    `authors_bfloat16_window_attention`), pooled in float32, then rounded to bfloat16 (theirs
    pools each query head's bfloat16 mean, then averages the heads: the same sums, in
    another order)."""
    with mock.patch.object(reference, "pooled_candidates", rounded_to_bfloat16(reference.pooled_candidates)):
        with mock.patch.object(reference, "candidate_attention", authors_bfloat16_window_attention):
            yield


def range_in_cache_dtype(magnitude: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`magnitude` (`reference.value_magnitude`) with the `range` statistic taken in the values'
    own dtype, as the authors take `amax - amin` of a bfloat16 cache; other statistics unchanged.
    Returns `[...]` float32 like `magnitude`."""

    def value_magnitude(values: torch.Tensor, stat: str) -> torch.Tensor:
        if stat != "range":
            return magnitude(values, stat)
        return (values.amax(dim=-1) - values.amin(dim=-1)).to(torch.float32)

    return value_magnitude


def authors_eviction_trigger(decode_step: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`VaSECacheLayer.decode_step` followed by the authors' trigger: once the step has stored its
    token, a layer holding more than `budget` tokens at a multiple of `window` evicts down to
    `budget` (dropping `length - budget` tokens), before the capacity `budget + window` would."""

    def decode_step_then_trigger(layer: VaSECacheLayer, *args, **kwargs) -> torch.Tensor:
        output = decode_step(layer, *args, **kwargs)
        length, config = layer.length_bound, layer.config
        if config.evicts and length > config.budget and length % config.window == 0:
            layer.evict()
        return output

    return decode_step_then_trigger


def authors_order() -> ContextManager:
    """Every eviction writes its survivors in the authors' order (`authors_survivor_slots`)."""
    return mock.patch.object(reference, "survivor_slots", authors_survivor_slots)


def authors_trigger() -> ContextManager:
    """Every cache layer evicts with the authors' trigger (`authors_eviction_trigger`)."""
    return mock.patch.object(VaSECacheLayer, "decode_step", authors_eviction_trigger(VaSECacheLayer.decode_step))


def room_for_the_prompt() -> ContextManager:
    """Every cache sized `budget + window + PROMPT_SLOTS` instead of `budget + window`, so that a
    testbed prompt is never compressed at prefill; under the authors' trigger the first
    eviction then comes while decoding, when the length first passes `budget` at a
    multiple of `window`, and drops everything past `budget`, as the authors' does."""
    return mock.patch.object(VaSEConfig, "capacity", property(lambda config: config.budget + config.window + PROMPT_SLOTS))


def configured(**changes) -> ContextManager:
    """Every evaluated cache configured with `changes` (VaSEConfig fields) on top of eval's."""
    configure = Run.config

    def config(self, *args, **kwargs):
        return configure(self, *args, **kwargs).replace(**changes)

    return mock.patch.object(Run, "config", config)


@contextlib.contextmanager
def together(*switches: Callable[[], ContextManager]) -> Iterator[None]:
    """Every switch of `switches` turned at once."""
    with contextlib.ExitStack() as stack:
        for switch in switches:
            stack.enter_context(switch())
        yield


class Ablation(NamedTuple):
    name: str
    policy: str
    default: str
    switched: str
    switch: Callable[[], ContextManager]
    eval_args: tuple[str, ...] = ()  # `vase-triton eval` arguments of both variants
    both: Callable[[], ContextManager] = contextlib.nullcontext  # a switch both variants run under


ABLATIONS = [
    Ablation("value protection", "vase", "on", "off", lambda: configured(protect_values=False)),
    Ablation("value protection", "snapkv", "off", "on", lambda: configured(protect_values=True)),
    Ablation("survivor order", "vase", "temporal", "authors'",
             authors_order),
    Ablation("survivor order", "snapkv", "temporal", "by decreasing score (authors')",
             authors_order),
    Ablation("survivor order", "rkv", "temporal", "by decreasing score (authors')",
             authors_order),
    Ablation("importance precision", "vase", "float32", "bfloat16 (authors')", authors_bfloat16_importance,
             eval_args=("--dtype", "bfloat16")),
    Ablation("value range precision", "vase", "float32", "bfloat16 (authors')",
             lambda: mock.patch.object(reference, "value_magnitude", range_in_cache_dtype(reference.value_magnitude)),
             eval_args=("--dtype", "bfloat16")),
    Ablation("projections", "vase-dkv", "per KV head", "shared by a row's heads (authors')",
             lambda: mock.patch.object(policies, "dkv_projection", shared_projection(policies.dkv_projection))),
    Ablation("projection precision", "vase-dkv", "float32", "bfloat16 (authors')",
             lambda: mock.patch.object(projected_energy_op, "projected_energy", authors_bfloat16_energy),
             eval_args=("--dtype", "bfloat16")),
    Ablation("eviction trigger", "vase", "at budget + window", "past budget at each multiple of window (authors')",
             authors_trigger),
    Ablation("prompt compression", "vase", "at prefill", "at the first eviction while decoding (authors')",
             room_for_the_prompt, both=authors_trigger),
    Ablation("prompt of C tokens", "vase", "at the first decode step", "at the first eviction while decoding (authors')",
             room_for_the_prompt, eval_args=("--budgets", str(PROMPT_SLOTS - TESTBED_WINDOW)), both=authors_trigger),
    Ablation("sinks", "snapkv", "4 kept", "none (authors')", lambda: configured(n_sink=0)),
    Ablation("sinks", "rkv", "4 kept", "none (authors')", lambda: configured(n_sink=0)),
    Ablation("R-KV λ", "rkv", "0.1", "0.5 (authors' scripts)", lambda: configured(rkv_lambda=0.5)),
    Ablation("authors' baselines", "snapkv", "ours", "no sinks, by decreasing score (authors')",
             lambda: together(authors_order, lambda: configured(n_sink=0))),
    Ablation("authors' baselines", "rkv", "ours", "no sinks, by decreasing score, λ 0.5 (authors')",
             lambda: together(authors_order, lambda: configured(n_sink=0, rkv_lambda=0.5))),
]  # fmt: skip


def evaluate(policy: str, seed: int, out: Path, eval_args: tuple[str, ...] = ()) -> list[dict]:
    """The testbed records of `policy` at run seed `seed` (`vase-triton eval` with `eval_args`, output silenced)."""
    with contextlib.redirect_stdout(io.StringIO()):
        status = cli.main(["eval", "--policies", policy, "--seed", str(seed), "--out", str(out),
                           "--device", "cpu", "--no-progress", *eval_args])  # fmt: skip
    if status != 0:
        raise SystemExit(f"vase-triton eval failed for {policy} (seed {seed})")
    return [record for record in read_results(out / RESULTS_FILE) if record["policy"] == policy]


def tally(records: list[dict]) -> dict[int, tuple[int, int]]:
    """Per budget: (answers right, whole traces exact)."""
    counts: dict[int, tuple[int, int]] = {}
    for record in records:
        right, exact = counts.get(record["budget"], (0, 0))
        counts[record["budget"]] = (right + bool(record["correct"]), exact + bool(record["trace_exact"]))
    return counts


def measure(ablation: Ablation, seeds: int, out: Path) -> Iterator[tuple[int, tuple[int, int], tuple[int, int]]]:
    """(budget, default tally, switched tally) at every testbed budget, largest first."""
    default, switched = [], []
    for seed in range(seeds):
        run_dir = out / f"{ablation.name}-{ablation.policy}".replace(" ", "-") / f"seed{seed}"
        with ablation.both():
            default += evaluate(ablation.policy, seed, run_dir / "default", ablation.eval_args)
            with ablation.switch():
                switched += evaluate(ablation.policy, seed, run_dir / "switched", ablation.eval_args)
    default_tally, switched_tally = tally(default), tally(switched)
    for budget in sorted(default_tally, reverse=True):
        yield budget, default_tally[budget], switched_tally[budget]


def compression(budget: int) -> str:
    """`4x` for a testbed budget, else the ratio it holds of a whole sequence and the budget."""
    for ratio in COMPRESSIONS:
        if compression_budget(ratio) == budget:
            return f"{ratio}x"
    return f"{SEQUENCE_TOKENS / budget:.1f}x (budget {budget})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=positive_int, default=5, help="run seeds per variant (default 5)")
    parser.add_argument("--out", type=Path, help="keep the eval outputs here (default: a temporary directory)")
    names = list(dict.fromkeys(ablation.name for ablation in ABLATIONS))
    parser.add_argument("--only", action="append", choices=names, metavar="NAME",
                        help=f"run only the ablations of this name, of {', '.join(names)} (repeatable)")  # fmt: skip
    args = parser.parse_args()
    os.environ["VASE_BACKEND"] = "torch"  # the switches patch the reference
    print(f"Answers right / whole traces exact, summed over {args.seeds} seed(s) of 64 problems:\n")
    print("| ablation | policy | compression | as shipped | switched |")
    print("|---|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as scratch:
        for ablation in ABLATIONS:
            if args.only and ablation.name not in args.only:
                continue
            for budget, default, switched in measure(ablation, args.seeds, args.out or Path(scratch)):
                print(f"| {ablation.name}: {ablation.default} → {ablation.switched} | {ablation.policy} | "
                      f"{compression(budget)} | {default[0]} / {default[1]} | {switched[0]} / {switched[1]} |",
                      flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
