"""How much the two importance modes change which tokens are evicted, on real attention.

vase_triton offers two definitions of the window attention that `vase`, `snapkv` and
`rkv` rank candidates by (README, Policies):

- `emitted`: decode attention adds each query's softmax over *all* cached slots (window
  included) into a score buffer; nothing is stored or recomputed;
- `recompute` (the paper's): a ring of the last `window` queries attends over the
  *candidates only* at eviction.

Their normalisers differ (each query's candidate mass is scaled by one minus its window
mass). What that changes is which `window` candidates each eviction drops, so this script
measures, at every eviction of every layer and KV head:

- top-k agreement: the fraction of evicted candidates both modes evict (`snapkv`: pooled
  attention, deterministic top-k, sinks kept);
- sampling distance: the total-variation distance between the two modes' sampling
  distributions over the candidates `vase` samples from (pooled attention, after sinks
  and value-protected tokens), i.e. the distance between the first draws of the two.

    python benchmarks/score_mode_agreement.py [--model testbed|tiny|PATH] [--tokens 1200] [--budget 128 256] [--turn T]

The model runs once with full attention (greedy), its post-RoPE queries, keys and values
are captured, and two cache layers (one per mode) replay them token by token, kept in the
same state (both evict what `emitted` chooses) so that every eviction compares the modes
on identical caches. With `--turn T` (fewer than `window` tokens), the `T` tokens that
would fill the cache arrive at once instead, as a new chat turn does, and the evictions
compared are those turns' compressions: the case where `emitted` observes the turn's own
`T` queries only and `recompute` the whole window, decode queries before the turn
included. `testbed` is the trained testbed model on held-out problems (its whole trace),
`tiny` the built-in random model; a local checkpoint directory (a transformers causal LM)
works too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vase_triton.cache import VaSECacheLayer  # noqa: E402
from vase_triton.cache_tensors import CacheTensors  # noqa: E402
from vase_triton.commands.common import non_negative_int, positive_int  # noqa: E402
from vase_triton.config import VaSEConfig  # noqa: E402

CAPTURE_NAME = "vase_capture"


def capture_attention_inputs(model, input_ids: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
    """Post-RoPE `(query [1, Hq, T, D], key [1, Hkv, T, D], value)` of every layer for one causal pass."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    captured: dict[int, tuple[torch.Tensor, ...]] = {}

    def capture(module, query, key, value, attention_mask, **kwargs):
        captured[module.layer_idx] = (query.detach().clone(), key.detach().clone(), value.detach().clone())
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(CAPTURE_NAME, capture)
    previous = model.config._attn_implementation
    model.set_attn_implementation(CAPTURE_NAME)
    try:
        with torch.no_grad():
            model(input_ids=input_ids, use_cache=False)
    finally:
        model.set_attn_implementation(previous)
    return [captured[index] for index in sorted(captured)]


def evicted_candidates(config: VaSEConfig, tensors: CacheTensors, importance: torch.Tensor) -> list[set[int]]:
    """Per (row, KV head), the candidate slots of `tensors` a deterministic top-k eviction would drop."""
    n_cand = int(tensors.lengths[0]) - config.window
    keep = config.budget - config.window - config.n_sink
    dropped = []
    for row in importance[0, :, :n_cand]:
        order = torch.sort(row[config.n_sink :], descending=True, stable=True).indices + config.n_sink
        dropped.append(set(order[keep:].tolist()))
    return dropped


def sampling_distance(
    config: VaSEConfig, tensors: CacheTensors, importance_a: torch.Tensor, importance_b: torch.Tensor
) -> list[float]:
    """Per KV head, total variation between the normalised weights of the candidates `vase` samples from."""
    n_cand = int(tensors.lengths[0]) - config.window
    n_large = max(0, config.budget // 4 - config.n_sink)
    distances = []
    for h in range(importance_a.shape[1]):
        magnitude = tensors.magnitudes[0, h, config.n_sink : n_cand]
        protected = set((torch.sort(magnitude, descending=True, stable=True).indices[:n_large] + config.n_sink).tolist())
        eligible = torch.tensor([s for s in range(config.n_sink, n_cand) if s not in protected])
        p = importance_a[0, h, eligible].double()
        q = importance_b[0, h, eligible].double()
        distances.append(0.5 * float((p / p.sum() - q / q.sum()).abs().sum()))
    return distances


class _TurnCompression:
    """Captures the importance a layer's `extend` computes to compress a turn, and makes the
    layer evict by `substitute` instead when one is given (so that both modes stay in one state)."""

    def __init__(self, layer: VaSECacheLayer, substitute: "_TurnCompression | None" = None):
        self.layer, self.substitute = layer, substitute
        self.tensors: CacheTensors | None = None
        self.importance: torch.Tensor | None = None
        layer.importance = self  # `_evict_on_device` asks the instance for it

    def __call__(self, tensors: CacheTensors, *, window_queries=None) -> torch.Tensor:
        self.tensors = CacheTensors(*(buffer.clone() for buffer in tensors))  # the eviction compacts them
        self.importance = VaSECacheLayer.importance(self.layer, tensors, window_queries=window_queries)
        return self.importance if self.substitute is None else self.substitute.importance


def compare(config: VaSEConfig, tensors: CacheTensors, emitted: torch.Tensor, recomputed: torch.Tensor,
            agreements: list[float], distances: list[float]) -> None:
    """Append one eviction's per-head top-k agreement and sampling distance."""
    for a, b in zip(evicted_candidates(config, tensors, emitted), evicted_candidates(config, tensors, recomputed)):
        agreements.append(len(a & b) / len(a))
    distances.extend(sampling_distance(config, tensors, emitted, recomputed))


def replay(captured, prompt_len: int, budget: int, window: int, turn: int = 0) -> tuple[list[float], list[float]]:
    """Top-k agreements and sampling distances over every eviction of every layer and head.

    turn: 0 decodes every token; else the `turn` tokens that would overflow the cache come
    as one `extend` call, and only these calls' compressions are compared (a trace that ends
    with fewer tokens than a turn decodes them, and an eviction they trigger is not compared).
    """
    agreements, distances = [], []
    for layer_idx, (query, key, value) in enumerate(captured):
        kv_heads, head_dim = key.shape[1], key.shape[-1]
        layers = [
            VaSECacheLayer(
                VaSEConfig(policy="snapkv", budget=budget, window=window, score_mode=mode), batch_size=1,
                num_kv_heads=kv_heads, head_dim=head_dim, dtype=torch.float32, device="cpu", layer_idx=layer_idx,
            )
            for mode in ("emitted", "recompute")
        ]
        scale = head_dim**-0.5
        q, k, v = (t.float() for t in (query, key, value))
        for layer in layers:
            layer.prefill(q[:, :, :prompt_len], k[:, :, :prompt_len], v[:, :, :prompt_len], scale=scale)
        config, t = layers[0].config, prompt_len
        while t < q.shape[2]:
            if turn and layers[0].length_bound + turn > layers[0].capacity and t + turn <= q.shape[2]:
                emitted = _TurnCompression(layers[0])
                recomputed = _TurnCompression(layers[1], substitute=emitted)
                for layer in layers:
                    layer.extend(q[:, :, t : t + turn], k[:, :, t : t + turn], v[:, :, t : t + turn], scale=scale)
                    del layer.importance
                compare(config, emitted.tensors, emitted.importance, recomputed.importance, agreements, distances)
                t += turn
                continue
            if layers[0].length_bound == layers[0].capacity:
                emitted, recomputed = (layer.importance() for layer in layers)
                if not turn:
                    compare(config, layers[0].tensors, emitted, recomputed, agreements, distances)
                for layer in layers:
                    layer.evict(importance=emitted)
            for layer in layers:
                layer.decode(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], scale=scale)
            t += 1
    return agreements, distances


def load(model_name: str, seed: int):
    """(model, token ids of a prompt) for `testbed`, `tiny` or a local checkpoint directory."""
    if model_name == "testbed":
        from vase_triton.eval.prompting import render_prompt
        from vase_triton.testbed.harness import testbed_problems
        from vase_triton.testbed.model import load_testbed

        model, tokenizer = load_testbed()
        problem = testbed_problems(seed + 1)[seed]
        return model, tokenizer(render_prompt(tokenizer, problem), return_tensors="pt")["input_ids"]
    if model_name == "tiny":
        from vase_triton.demo_model import ByteTokenizer, tiny_qwen3

        prompt = "Question: Natalia sold 48 clips in April and half as many in May. How many in total?\nAnswer:"
        return tiny_qwen3(seed=seed), ByteTokenizer()(prompt)["input_ids"]
    from transformers import AutoTokenizer

    from vase_triton.integrations.loading import load_causal_lm

    path = Path(model_name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_causal_lm(path, dtype=torch.float32).eval()
    prompt = "Solve step by step: what is 17 * 23 + 4?"
    return model, tokenizer(prompt, return_tensors="pt")["input_ids"]


def summarise(values: list[float], tail: float) -> str:
    """`mean / quantile(tail) / extreme` of `values` (the minimum for tail < 0.5, else the maximum);
    `—` without values (a budget the sequences never filled)."""
    if not values:
        return "—"
    tensor = torch.tensor(values, dtype=torch.float64)
    extreme = tensor.min() if tail < 0.5 else tensor.max()
    return f"{float(tensor.mean()):.3f} / {float(tensor.quantile(tail)):.3f} / {float(extreme):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="testbed",
                        help="'testbed' (the trained testbed model), 'tiny' (built-in random Qwen3) or a local checkpoint dir")
    parser.add_argument("--tokens", type=positive_int, default=1200, help="total tokens (prompt + greedy continuation)")
    parser.add_argument("--budget", type=positive_int, nargs="+", default=[128, 256])
    parser.add_argument("--window", type=positive_int, default=32)
    parser.add_argument("--seed", type=non_negative_int, default=0,
                        help="random model seed, or the first held-out testbed problem")  # fmt: skip
    parser.add_argument("--sequences", type=positive_int, default=1, help="sequences (seeds seed, seed + 1, ...) pooled")
    parser.add_argument("--turn", type=non_negative_int, default=0,
                        help="tokens of a chat turn that overflows the cache (fewer than --window; 0: decode only)")  # fmt: skip
    args = parser.parse_args()
    if args.turn >= args.window:
        parser.error(f"--turn: expected fewer tokens than --window ({args.window}); got {args.turn}")
    if args.model not in ("testbed", "tiny") and not Path(args.model).is_dir():
        parser.error(f"--model: expected 'testbed', 'tiny' or a local checkpoint directory; got {args.model!r}")
    for budget in args.budget:
        try:
            VaSEConfig(policy="snapkv", budget=budget, window=args.window)
        except ValueError as error:
            parser.error(f"--budget: {budget} with --window {args.window}: {error}")
    runs = []
    for seed in range(args.seed, args.seed + args.sequences):
        model, input_ids = load(args.model, seed)
        with torch.no_grad():
            sequence = model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max(1, args.tokens - input_ids.shape[1]), do_sample=False,
            )
        runs.append((capture_attention_inputs(model, sequence), input_ids.shape[1], sequence.shape[1]))
    lengths = sorted({length for _, _, length in runs})
    turns = f", evictions compared: the compressions of {args.turn}-token turns" if args.turn else ""
    print(f"model {args.model}: {len(runs[0][0])} layers, {len(runs)} sequence(s) of {lengths[0]}-{lengths[-1]} "
          f"tokens, window {args.window}{turns}\n")
    print("| budget | evictions x heads | top-k agreement: mean / p10 / min | TV distance: mean / p90 / max |")
    print("|---:|---:|---|---|")
    for budget in args.budget:
        agreements, distances = [], []
        for captured, prompt_len, _ in runs:
            run_agreements, run_distances = replay(captured, prompt_len, budget, args.window, args.turn)
            agreements += run_agreements
            distances += run_distances
        print(f"| {budget} | {len(agreements)} | {summarise(agreements, 0.1)} | {summarise(distances, 0.9)} |")

if __name__ == "__main__":
    main()
