"""A second, independent implementation of every eviction policy (README, Policies), for one sequence.

Written from the spec, loop by loop, in float64, without vase_triton's cache, kernels, ops or
policy functions: the twin that the integration tests compare `patch_qwen3` against. It
keeps, per layer and KV head, the stored tokens in temporal order, and per query the
attention mass it gave to each token *by position*, so the observation windows come out of
the definition ("the last `window` queries before the eviction") rather than out of the
library's bookkeeping. Only the random draws are shared with the library
(`reference.eviction_uniforms`, `policies.dkv_projection`, `seeding.stream_key`), so
that stochastic policies see the same noise on both sides.

It runs inside an unpatched Hugging Face model through an attention function registered
as `vase_twin`, one forward call per token after the prompt (no transformers cache).
"""

from __future__ import annotations

import collections
import contextlib
import math
from typing import Optional

import torch

from vase_triton import reference
from vase_triton.config import VaSEConfig
from vase_triton.policies import dkv_projection
from vase_triton.seeding import stream_key

ATTENTION_NAME = "vase_twin"
_ACTIVE: list["TwinDecoder"] = []


class TwinLayer:
    """One layer of one sequence: per KV head, keys/values `[n, D]` float64 and token positions."""

    def __init__(self, config: VaSEConfig, layer: int, kv_heads: int, group: int, head_dim: int, scale: float):
        self.config, self.layer, self.kv_heads, self.group, self.scale = config, layer, kv_heads, group, scale
        self.keys = [torch.zeros(0, head_dim, dtype=torch.float64) for _ in range(kv_heads)]
        self.values = [torch.zeros(0, head_dim, dtype=torch.float64) for _ in range(kv_heads)]
        self.positions: list[list[int]] = [[] for _ in range(kv_heads)]
        self.next_position = 0
        self.n_evictions = 0
        window = config.window
        # Per query: {kv head: {position: attention mass summed over the group's query heads}}.
        self.recent_masses: collections.deque = collections.deque(maxlen=window)
        self.recent_queries: collections.deque = collections.deque(maxlen=window)  # [Hq, D] each
        self.total_masses = [collections.defaultdict(float) for _ in range(kv_heads)]

    @property
    def length(self) -> int:
        return len(self.positions[0])

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """`query [Hq, T, D]`, `key`/`value [Hkv, T, D]` of new tokens; returns `[Hq, T, D]` float64."""
        config = self.config
        new_tokens = key.shape[1]
        if self.length > 0 and self.length == config.capacity and config.evicts:
            self.evict(num_slots=config.capacity)
        out = torch.zeros(query.shape, dtype=torch.float64)
        for t in range(new_tokens):
            for h in range(self.kv_heads):
                self.keys[h] = torch.cat([self.keys[h], key[h, t : t + 1].double()])
                self.values[h] = torch.cat([self.values[h], value[h, t : t + 1].double()])
                self.positions[h].append(self.next_position)
            self.next_position += 1
            # Query t sees every stored token up to itself.
            masses = {}
            for h in range(self.kv_heads):
                mass = collections.defaultdict(float)
                for head in range(h * self.group, (h + 1) * self.group):
                    probs = torch.softmax(self.keys[h] @ query[head, t].double() * self.scale, dim=0)
                    out[head, t] = probs @ self.values[h]
                    for position, p in zip(self.positions[h], probs.tolist()):
                        mass[position] += p
                masses[h] = mass
                for position, p in mass.items():
                    self.total_masses[h][position] += p
            self.recent_masses.append(masses)
            self.recent_queries.append(query[:, t].double())
        if self.length > config.capacity:  # a chunk that overflows: compress now
            # The library stages it in C + T slots; the uniforms are drawn for that many.
            self.evict(num_slots=config.capacity + new_tokens)
        return out

    # ------------------------------------------------------------------ importance, by the definitions

    def _window_attention(self, h: int, n_cand: int) -> list[float]:
        config, positions = self.config, self.positions[h]
        attention = [0.0] * n_cand
        if config.score_mode == "emitted":
            for masses in self.recent_masses:
                for i in range(n_cand):
                    attention[i] += masses[h].get(positions[i], 0.0)
        else:
            for query in self.recent_queries:
                for head in range(h * self.group, (h + 1) * self.group):
                    probs = torch.softmax(self.keys[h][:n_cand] @ query[head] * self.scale, dim=0)
                    for i in range(n_cand):
                        attention[i] += float(probs[i])
        attention = [a / (config.window * self.group) for a in attention]
        half = config.pool_kernel // 2
        return [
            sum(attention[j] for j in range(i - half, i + half + 1) if 0 <= j < n_cand) / config.pool_kernel
            for i in range(n_cand)
        ]

    def _redundancy(self, h: int, n_cand: int) -> list[float]:
        keys = self.keys[h][:n_cand]
        unit = keys / keys.norm(dim=-1, keepdim=True)
        mean_similarity = []
        for i in range(n_cand):
            others = [float(unit[i] @ unit[j]) for j in range(n_cand) if j != i]
            mean_similarity.append(sum(others) / max(1, len(others)))
        top = max(mean_similarity)
        exps = [math.exp(m - top) for m in mean_similarity]
        return [e / sum(exps) for e in exps]

    def importance(self, h: int, n_cand: int) -> list[float]:
        config, positions = self.config, self.positions[h]
        policy = config.policy
        if policy in ("vase", "snapkv"):
            return self._window_attention(h, n_cand)
        if policy == "rkv":
            lam = config.rkv_lambda
            attention, redundancy = self._window_attention(h, n_cand), self._redundancy(h, n_cand)
            return [lam * a - (1 - lam) * r for a, r in zip(attention, redundancy)]
        if policy == "h2o":
            return [self.total_masses[h][positions[i]] for i in range(n_cand)]
        if policy == "tova":
            last = self.recent_masses[-1][h]
            return [last.get(positions[i], 0.0) / self.group for i in range(n_cand)]
        if policy == "streaming":
            return [positions[i] + 1.0 for i in range(n_cand)]
        if policy == "random":
            return [1.0] * n_cand
        if policy == "vase-dkv":
            g = dkv_projection(config, (1, self.kv_heads), self.keys[h].shape[1], layer=self.layer,
                               eviction_index=self.n_evictions, device="cpu")[0, h].double()
            energy = [
                float((self.keys[h][i] @ g).square().sum() * (self.values[h][i] @ g).square().sum())
                for i in range(n_cand)
            ]
            return [e / sum(energy) for e in energy]
        raise ValueError(f"the twin does not implement policy {policy!r}")

    # ------------------------------------------------------------------ eviction

    def evict(self, num_slots: int) -> None:
        """Shrink every head to `budget` tokens; uniforms indexed as the library's `[1, Hkv, num_slots]` draw."""
        config = self.config
        n, window, n_sink = self.length, config.window, config.n_sink
        n_cand = n - window
        n_large = max(0, config.resolved_n_protect - n_sink)
        uniforms = None
        if config.stochastic:
            uniforms = reference.eviction_uniforms(
                (1, self.kv_heads, num_slots), torch.device("cpu"), seed=stream_key(config.seed, self.layer),
                eviction_index=self.n_evictions,
            )[0]
        for h in range(self.kv_heads):
            weights = self.importance(h, n_cand)
            values = self.values[h]
            magnitude = [float(values[i].max() - values[i].min()) for i in range(n_cand)]
            sinks = list(range(n_sink))
            others = list(range(n_sink, n_cand))
            protected = sorted(others, key=lambda i: (-magnitude[i], i))[:n_large]
            rest = [i for i in others if i not in protected]
            if uniforms is not None:
                keys = {}
                for i in rest:
                    u = min(max(float(uniforms[h, i]), reference.GUMBEL_UNIFORM_MIN), reference.GUMBEL_UNIFORM_MAX)
                    gumbel = -math.log(-math.log(u))
                    keys[i] = math.log(weights[i]) / config.temperature + gumbel if weights[i] > 0 else -math.inf
            else:
                keys = {i: weights[i] for i in rest}
            sampled = sorted(rest, key=lambda i: (-keys[i], i))[: config.budget - window - n_sink - n_large]
            kept = sorted(sinks + protected + sampled) + list(range(n_cand, n))
            self.keys[h] = self.keys[h][kept]
            self.values[h] = self.values[h][kept]
            self.positions[h] = [self.positions[h][i] for i in kept]
        self.n_evictions += 1


class TwinDecoder:
    """The twin's state for a whole model: one `TwinLayer` per decoder layer."""

    def __init__(self, model, config: VaSEConfig):
        text = model.config
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        group = text.num_attention_heads // text.num_key_value_heads
        self.layers = [
            TwinLayer(config, index, text.num_key_value_heads, group, head_dim, head_dim**-0.5)
            for index in range(text.num_hidden_layers)
        ]


def _twin_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function: `query [1, Hq, T, D]` → `([1, T, Hq, D], None)` through the twin."""
    layer = _ACTIVE[-1].layers[module.layer_idx]
    out = layer.attend(query[0], key[0], value[0])
    return out.to(query.dtype).unsqueeze(0).transpose(1, 2), None


@contextlib.contextmanager
def _twin_attention_on(model, decoder: TwinDecoder):
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, _twin_attention)
    previous = model.config._attn_implementation
    model.set_attn_implementation(ATTENTION_NAME)
    _ACTIVE.append(decoder)
    try:
        yield
    finally:
        _ACTIVE.pop()
        model.set_attn_implementation(previous)


@torch.no_grad()
def twin_greedy(model, input_ids: torch.Tensor, config: VaSEConfig, max_new_tokens: int,
                prompt_position: Optional[int] = None) -> tuple[list[int], TwinDecoder]:
    """Greedy decoding of one sequence `input_ids [1, T]` with the twin cache; returns new tokens and state."""
    decoder = TwinDecoder(model, config)
    prompt_len = input_ids.shape[1]
    tokens: list[int] = []
    with _twin_attention_on(model, decoder):
        logits = model(input_ids=input_ids, position_ids=torch.arange(prompt_len).view(1, -1), use_cache=False).logits
        for step in range(max_new_tokens):
            token = int(logits[0, -1].argmax())
            tokens.append(token)
            if step + 1 == max_new_tokens:
                break
            logits = model(
                input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[prompt_len + step]]), use_cache=False
            ).logits
    return tokens, decoder
