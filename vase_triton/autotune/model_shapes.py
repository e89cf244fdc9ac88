"""The launches a model makes, read from its config: what `vase-triton autotune` tunes.

Only the attention layout is read (query heads, KV heads, head dim; no weights). For each
dtype, batch size, budget (capacity `C = budget + window`) and prompt length `T`, a
cache of the tuned policy (`vase` by default; 4 sinks, `budget // 4` protected) launches:

- every decode step: an append of one token, decode attention over `C` slots (emitting
  scores when the policy's decode does: window policies with `score_mode="emitted"`,
  `h2o`, `tova`);
- every `window` steps, an eviction of `C` slots, after the policy's importance: for window
  policies with `recompute` scores the window's attention over the candidates (a forward
  without values and a scores pass), for `vase-dkv` the projected energy, for `rkv` also
  the key similarity;
- at prefill, for each chunk the cache cuts the prompt into (`chunk_bounds`, at most
  `prefill_chunk` tokens): its causal attention over the cache (`C` slots, or `C + chunk`
  in the scratch of a chunk that overflows the cache) and its append, with the scores the
  policy observes there (`chunk_observation`); a chunk that overflows is compressed at
  once, with the same importance and an eviction over `C + chunk` slots.

Decode-time launches come first, so an interrupted run has tuned what matters most.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Iterable, Mapping, Optional

from vase_triton.autotune.shapes import (
    AppendShape,
    DecodeShape,
    EnergyShape,
    EvictShape,
    PrefillShape,
    ScoresShape,
    SimilarityShape,
)
from vase_triton.autotune.spaces import SPACES
from vase_triton.cache import chunk_bounds, chunk_observation
from vase_triton.config import VaSEConfig
from vase_triton.kernels.eviction import uses_tiled_selection
from vase_triton.policies import Policy, get_policy
from vase_triton.validation import SUPPORTED_HEAD_DIMS

# Order of the decode-time launches: the split-K stage before the combine stage tuned with it.
DECODE_ORDER = (
    "decode", "decode_combine", "append", "projected_energy", "key_similarity", "evict_select",
    "evict_select_tiled", "evict_compact", "prefill_forward", "prefill_scores",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class AttentionLayout:
    """Attention shapes of a model: query heads, KV heads and head dim, and where they were read."""

    q_heads: int
    kv_heads: int
    head_dim: int
    source: str


def layout_from_config(config: Mapping, source: str) -> AttentionLayout:
    """The attention layout of a transformers config (its `text_config` for multimodal models).

    Raises ValueError naming the field when one is missing or unusable.
    """
    text = config.get("text_config") or config
    if not isinstance(text, Mapping):
        raise ValueError(f"{source}: expected text_config to be an object; got {text!r}")
    heads = text.get("num_attention_heads")
    if type(heads) is not int or heads < 1:
        raise ValueError(f"{source}: expected a positive int num_attention_heads; got {heads!r}")
    kv_heads = text.get("num_key_value_heads")
    kv_heads = heads if kv_heads is None else kv_heads  # absent or null: no grouped-query attention
    if type(kv_heads) is not int or kv_heads < 1 or heads % kv_heads:
        raise ValueError(
            f"{source}: expected num_key_value_heads dividing num_attention_heads = {heads}; got {kv_heads!r}"
        )
    head_dim = text.get("head_dim")
    if head_dim is None:
        hidden = text.get("hidden_size")
        if type(hidden) is not int:
            raise ValueError(f"{source}: expected head_dim or an int hidden_size; got neither")
        head_dim = hidden // heads
    if type(head_dim) is not int or head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"{source}: expected head_dim in {SUPPORTED_HEAD_DIMS}; got {head_dim!r}")
    return AttentionLayout(heads, kv_heads, head_dim, source)


def read_layout(
    model: Optional[str] = None, config_path: Optional[str] = None, *, local_files_only: bool = False
) -> AttentionLayout:
    """The layout of a model: `config_path` (a config.json), a local model directory, or a hub id
    (from the local cache only with `local_files_only`).

    Raises ValueError with a one-line reason when the config cannot be read.
    """
    if config_path is not None:
        path = Path(config_path)
        source = f"--config {config_path}"
    elif model is not None and Path(model).is_dir():
        path = Path(model) / "config.json"
        source = f"--model {model}"
    elif model is not None:
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(model, local_files_only=local_files_only).to_dict()
        except Exception as error:  # transformers raises many types for a missing or invalid model
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ValueError(f"--model: cannot load the config of {model!r}: {first_line}") from None
        return layout_from_config(config, f"--model {model}")
    else:
        raise ValueError("expected --model PATH_OR_ID or --config config.json")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{source}: cannot read {path}: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{source}: expected a JSON object in {path}")
    return layout_from_config(config, source)


def tuning_launches(
    layout: AttentionLayout,
    *,
    batches: Iterable[int],
    budgets: Iterable[int],
    prompt_lens: Iterable[int],
    dtypes: Iterable[str],
    window: int,
    score_mode: str,
    policy: str = "vase",
    dkv_rank: int = VaSEConfig.dkv_rank,
    prefill_chunk: int = VaSEConfig.prefill_chunk_size,
) -> list[tuple[str, tuple]]:
    """(kernel, shape) of every distinct key the model's launches need under `policy`, decode-time launches first.

    `prefill_chunk`: the caches' `prefill_chunk_size`, which cuts each prompt into the chunks the prefill launches see.
    """
    hq, hkv, dim = layout.q_heads, layout.kv_heads, layout.head_dim
    chosen = get_policy(policy)
    emits = chosen.decode_emits_scores(score_mode)
    decode, prefill = [], []
    for dtype in dtypes:
        for batch in batches:
            for budget in budgets:
                capacity = budget + window
                cache = _CacheLaunches(batch, layout, budget, window, dtype, chosen, score_mode, dkv_rank)
                decode += [
                    ("decode", DecodeShape(batch, hq, hkv, capacity, dim, dtype, emits)),
                    ("decode_combine", DecodeShape(batch, hq, hkv, capacity, dim, dtype, emits)),
                    ("append", AppendShape(batch, hkv, 1, dim, dtype)),
                    *cache.eviction(capacity),
                ]
                for prompt in prompt_lens:
                    prefill += cache.prefill(prompt, prefill_chunk)
    distinct = {}
    for kernel, shape in sorted(decode, key=lambda item: DECODE_ORDER.index(item[0])) + prefill:
        distinct.setdefault((kernel, SPACES[kernel].key(shape)), (kernel, shape))
    return list(distinct.values())


@dataclasses.dataclass(frozen=True)
class _CacheLaunches:
    """The launches of a cache of `budget` under `policy`: its evictions and its prompt's chunks."""

    batch: int
    layout: AttentionLayout
    budget: int
    window: int
    dtype: str
    policy: Policy
    score_mode: str
    dkv_rank: int

    def eviction(self, slots: int) -> list[tuple[str, tuple]]:
        """The launches of an eviction of `slots` slots down to `budget`."""
        batch, window, dtype = self.batch, self.window, self.dtype
        hq, hkv, dim = self.layout.q_heads, self.layout.kv_heads, self.layout.head_dim
        launches = []
        if self.policy.stores_queries(self.score_mode):
            launches += [
                ("prefill_forward", PrefillShape(batch, hq, hkv, window, slots, dim, dtype, False, False)),
                ("prefill_scores", ScoresShape(batch, hq, hkv, window, slots, dim, dtype, False)),
            ]
        # The policies whose importance has a kernel of its own (window attention aside).
        if self.policy.name == "vase-dkv":
            launches.append(("projected_energy", EnergyShape(batch, hkv, slots, dim, self.dkv_rank, dtype)))
        elif self.policy.name == "rkv":
            launches.append(("key_similarity", SimilarityShape(batch, hkv, slots, dim, dtype)))
        shape = EvictShape(batch, hkv, slots, self.budget, window, dim, dtype)
        select = "evict_select_tiled" if uses_tiled_selection(slots, window) else "evict_select"
        return launches + [(select, shape), ("evict_compact", shape)]

    def prefill(self, prompt: int, chunk: int) -> list[tuple[str, tuple]]:
        """The launches of a prompt of `prompt` tokens entering an empty cache in chunks of at most `chunk`."""
        batch, budget, window, dtype = self.batch, self.budget, self.window, self.dtype
        hq, hkv, dim = self.layout.q_heads, self.layout.kv_heads, self.layout.head_dim
        capacity = budget + window
        launches, length = [], 0
        for start, stop in chunk_bounds(0, prompt, capacity=capacity, window=window, chunk=chunk):
            new_tokens = stop - start
            compress = length + new_tokens > capacity
            slots = capacity + new_tokens if compress else capacity
            launches += [
                ("prefill_forward", PrefillShape(batch, hq, hkv, new_tokens, slots, dim, dtype, True, True)),
                ("append", AppendShape(batch, hkv, new_tokens, dim, dtype)),
            ]
            emits = self.policy.decode_emits_scores(self.score_mode)
            observed, _ = chunk_observation(
                self.policy, emits, budget=budget, window=window, new_tokens=new_tokens, start=length, compress=compress
            )
            if observed:
                launches.append(("prefill_scores", ScoresShape(batch, hq, hkv, observed, slots, dim, dtype, True)))
            if compress:
                launches += self.eviction(slots)
            length = budget if compress else length + new_tokens
        return launches
