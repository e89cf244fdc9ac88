"""Eviction policies as specs: one `Policy` entry per policy, in one registry.

A policy is what differs between VaSE and its baselines (README, Policies): which queries it
observes, how it turns what it observed into a per-slot importance, and three flags of
the shared eviction op (sampled or top-k, value protection on by default, scores kept
across evictions). Everything else — the static cache, sinks, the recent window, the
fused select-and-compact kernel — is shared. The cache reads these fields and never
names a policy.

Adding a policy is one `register_policy(Policy(...))` call (or one entry below) whose
importance function maps `(config, EvictionInputs)` to a `[B, Hkv, N]` float32 tensor.
Slot `s` of row `b` is a *candidate* when `s < lengths[b] - window`; only candidates are
ranked (sinks and the recent window are kept by the op), so importance elsewhere is 0.
"""

from __future__ import annotations

import dataclasses
import math
import types
from typing import TYPE_CHECKING, Callable, Optional, Union

import torch

from vase_triton.cache_tensors import CacheTensors, slot_mask
from vase_triton.seeding import PROJECTION_STREAM, stream_key

if TYPE_CHECKING:
    from vase_triton.config import VaSEConfig

# What a policy observes, i.e. which queries' attention `EvictionInputs.attention` holds.
OBSERVE_WINDOW = "window"  # the last `window` queries before the eviction
OBSERVE_LAST_QUERY = "last-query"  # the last query only
OBSERVE_ALL_QUERIES = "all-queries"  # every query since the token entered the cache, prompt included
OBSERVE_NOTHING = "nothing"  # no attention (importance from the cache contents alone)
OBSERVATIONS = (OBSERVE_WINDOW, OBSERVE_LAST_QUERY, OBSERVE_ALL_QUERIES, OBSERVE_NOTHING)
# `VaSEConfig` fields that only the policies whose importance reads them use (`Policy.reads`).
SETTINGS_A_POLICY_MAY_READ = ("pool_kernel", "rkv_lambda", "dkv_rank", "value_stat")


@dataclasses.dataclass(frozen=True)
class EvictionInputs:
    """What a policy's importance function may read about one layer at one eviction.

    cache: the layer's buffers (`N` slots per row; see `CacheTensors`).
    attention: `[B, Hkv, N]` float32 mean attention probability each slot received from
        the policy's observation queries (averaged over those queries and the query heads
        of the KV group; for `all-queries`, summed over both instead), or None for
        policies that observe nothing. Only candidate slots are meaningful.
    window: recent-window size; candidates are slots `< lengths[b] - window`.
    layer: layer index; eviction_index: evictions this layer has done before this one.
    seed: the configuration's seed (see `vase_triton.seeding`).
    kv_head_offset: the model's index of the cache's first KV head (non-zero on the other
        ranks of a tensor-parallel model); keys the random draws with `seed` and `layer`.
    eviction_counter: `[1]` int64 on the cache's device holding `eviction_index`, or None.
        Draws keyed by it instead of `eviction_index` stay on the device, which lets the
        eviction be captured in a CUDA graph and replayed (`dkv_projection` does).
    """

    cache: CacheTensors
    attention: Optional[torch.Tensor]
    window: int
    layer: int
    eviction_index: int
    seed: int
    eviction_counter: Optional[torch.Tensor] = None
    kv_head_offset: int = 0

    @property
    def candidates(self) -> torch.Tensor:
        """`[B, 1, N]` bool candidate mask."""
        return slot_mask(self.cache.lengths, self.cache.num_slots, self.window)


ImportanceFunction = Callable[["VaSEConfig", EvictionInputs], torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Policy:
    """One eviction policy.

    name: the `VaSEConfig.policy` value.
    importance: `(config, EvictionInputs) -> [B, Hkv, N]` float32, finite (a NaN ranks as
        the least important), or None for a policy that never evicts (`full`).
    observation: which queries' attention the policy reads (`OBSERVATIONS`).
    stochastic: keep candidates by Gumbel-top-k sampling (∝ importance) instead of top-k. The
        sampling draws by log-importance, so a stochastic policy's importance must be > 0 on
        the candidates it may keep: one at 0 or below is never drawn while others are.
    protect_values: default of `VaSEConfig.protect_values` (keep the largest value vectors).
    summary: one line describing the policy, shown by the command line's `--policy` help.
    needs_noise: the importance alone cannot rank (e.g. uniform), so the policy is refused
        with a temperature that would make its selection deterministic.
    reads: the `VaSEConfig` settings of `SETTINGS_A_POLICY_MAY_READ` that its importance
        reads (`value_stat` through `cache.magnitudes`, when value protection is off); the
        command line refuses the others' options for it, as they would be ignored.
    """

    name: str
    importance: Optional[ImportanceFunction]
    observation: str
    stochastic: bool
    protect_values: bool
    summary: str
    needs_noise: bool = False
    reads: tuple[str, ...] = ()

    # A registered policy is one object that caches compare by identity (a replaced policy is
    # refused): a deep copy of a cache, or of anything holding a policy, keeps the same one.
    def __deepcopy__(self, memo: dict) -> "Policy":
        return self

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name: expected a non-empty string; got {self.name!r}")
        if self.observation not in OBSERVATIONS:
            raise ValueError(f"observation: expected one of {', '.join(OBSERVATIONS)}; got {self.observation!r}")
        if self.importance is not None and not callable(self.importance):
            raise TypeError(f"importance: expected a callable or None; got {type(self.importance).__name__}")
        for flag in ("stochastic", "protect_values", "needs_noise"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag}: expected True or False; got {getattr(self, flag)!r}")
        if not isinstance(self.summary, str):
            raise TypeError(f"summary: expected a string; got {self.summary!r}")
        if not isinstance(self.reads, tuple) or not set(self.reads) <= set(SETTINGS_A_POLICY_MAY_READ):
            raise ValueError(f"reads: expected a tuple of names in {', '.join(SETTINGS_A_POLICY_MAY_READ)}; "
                             f"got {self.reads!r}")
        if self.needs_noise and not self.stochastic:
            raise ValueError(f"needs_noise: only a stochastic policy can need noise; {self.name!r} is not stochastic")
        if self.importance is None:
            for flag in ("stochastic", "protect_values"):
                if getattr(self, flag):
                    raise ValueError(f"{flag}: a policy that never evicts neither samples nor protects values; "
                                     f"{self.name!r} sets it")
        if self.importance is None and self.observation != OBSERVE_NOTHING:
            raise ValueError(f"observation: a policy that never evicts observes nothing; got {self.observation!r}")

    @property
    def evicts(self) -> bool:
        return self.importance is not None

    @property
    def keeps_scores(self) -> bool:
        """Scores move with their tokens at eviction instead of being reset (`all-queries`)."""
        return self.observation == OBSERVE_ALL_QUERIES

    @property
    def resets_scores_every_step(self) -> bool:
        """Each decode step clears the scores before adding its own (`last-query`)."""
        return self.observation == OBSERVE_LAST_QUERY

    def decode_emits_scores(self, score_mode: str) -> bool:
        """Whether decode attention adds each step's probabilities into the score buffer."""
        if self.observation == OBSERVE_WINDOW:
            return score_mode == "emitted"
        return self.observation in (OBSERVE_LAST_QUERY, OBSERVE_ALL_QUERIES)

    def stores_queries(self, score_mode: str) -> bool:
        """Whether the cache keeps a ring of the last `window` queries (`recompute` mode)."""
        return self.observation == OBSERVE_WINDOW and score_mode == "recompute"


# ------------------------------------------------------------------------- importance functions


def pooled_candidate_attention(config: "VaSEConfig", inputs: EvictionInputs) -> torch.Tensor:
    """Observation attention over the candidates, smoothed by an average pool of width `pool_kernel`.

    The pool runs over candidate slots only: slots outside `[0, lengths[b] - window)` count as
    0 and the divisor is always `pool_kernel` (zero padding, `count_include_pad`), so the
    recent window's large attention never bleeds into the last candidates
    (`vase_triton.ops.candidate_pool.pooled_candidates`).

    Returns:
        `[B, Hkv, N]` float32, 0 outside the candidates.
    """
    from vase_triton.ops.candidate_pool import pooled_candidates

    return pooled_candidates(
        inputs.attention.to(torch.float32), inputs.cache.lengths, window=inputs.window, width=config.pool_kernel
    )


def _observed_attention(config: "VaSEConfig", inputs: EvictionInputs) -> torch.Tensor:
    return inputs.attention.to(torch.float32) * inputs.candidates


def key_redundancy(keys: torch.Tensor, lengths: torch.Tensor, window: int) -> torch.Tensor:
    """R-KV redundancy: softmax over the candidates of each key's mean cosine similarity to the others.

    Args:
        keys: `[B, Hkv, N, D]`; lengths: `[B]` int32 (values above `N` act as `N`); candidates
            are slots `< lengths[b] - window`.

    Returns:
        `[B, Hkv, N]` float32 summing to 1 over each row's candidates, 0 elsewhere.
    """
    # Imported here: the ops import the configuration, which imports this module.
    from vase_triton.ops.key_similarity import mean_key_similarity

    candidates = slot_mask(lengths, keys.shape[2], window)  # [B, 1, N]
    similarity = mean_key_similarity(keys, lengths, window=window)
    return torch.softmax(similarity.masked_fill(~candidates, -1e30), dim=-1) * candidates


def _redundancy_aware_attention(config: "VaSEConfig", inputs: EvictionInputs) -> torch.Tensor:
    candidates = inputs.candidates
    attention = pooled_candidate_attention(config, inputs)
    redundancy = key_redundancy(inputs.cache.keys, inputs.cache.lengths, inputs.window)
    lam = float(config.rkv_lambda)
    return (lam * attention - (1.0 - lam) * redundancy) * candidates


def dkv_projection(
    config: "VaSEConfig",
    shape: tuple[int, int],
    head_dim: int,
    *,
    layer: int,
    eviction_index: Union[int, torch.Tensor],
    device,
    kv_head_offset: int = 0,
) -> torch.Tensor:
    """The Gaussian projections `G` of one eviction: `[B, Hkv, D, dkv_rank]`, scaled by `1/sqrt(dkv_rank)`.

    One independent `G` per row and KV head, drawn on `device` from the layer's projection
    stream of `config.seed` (and `kv_head_offset`, see `vase_triton.seeding.stream_key`) at `eviction_index` (an int, or the `[1]` int64 device counter,
    read on the device: see `vase_triton.ops.gaussian`). The same draw on every run with the
    same backend; the Triton kernel and the PyTorch reference draw different values.
    """
    # Imported here: the ops import the configuration, which imports this module.
    from vase_triton.ops.gaussian import standard_normal_

    if not isinstance(eviction_index, torch.Tensor):
        eviction_index = torch.tensor([eviction_index], dtype=torch.int64, device=device)
    projection = torch.empty((*shape, head_dim, config.dkv_rank), dtype=torch.float32, device=device)
    key = stream_key(config.seed, layer, PROJECTION_STREAM, kv_head_offset)
    standard_normal_(projection, seed=key, eviction_index=eviction_index)
    return projection / math.sqrt(config.dkv_rank)


def _projected_energy(config: "VaSEConfig", inputs: EvictionInputs) -> torch.Tensor:
    cache = inputs.cache
    batch, kv_heads, _, head_dim = cache.keys.shape
    index = inputs.eviction_index if inputs.eviction_counter is None else inputs.eviction_counter
    projection = dkv_projection(
        config, (batch, kv_heads), head_dim, layer=inputs.layer, eviction_index=index, device=cache.keys.device,
        kv_head_offset=inputs.kv_head_offset,
    )
    # Imported here: the ops import the configuration, which imports this module.
    from vase_triton.ops.projected_energy import projected_energy

    energy = projected_energy(cache.keys, cache.values, projection, cache.lengths, window=inputs.window)
    return energy / energy.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)


def _recency(config: "VaSEConfig", inputs: EvictionInputs) -> torch.Tensor:
    return (inputs.cache.positions.to(torch.float32) + 1.0) * inputs.candidates


def _uniform(config: "VaSEConfig", inputs: EvictionInputs) -> torch.Tensor:
    return inputs.candidates.expand(inputs.cache.scores.shape).to(torch.float32)


# ------------------------------------------------------------------------- the registry

_REGISTRY: dict[str, Policy] = {}
POLICIES = types.MappingProxyType(_REGISTRY)  # name -> Policy, read-only view, in registration order


def register_policy(policy: Policy, *, replace: bool = False) -> Policy:
    """Make `policy` available as `VaSEConfig(policy=policy.name)`; returns it."""
    if not isinstance(policy, Policy):
        raise TypeError(f"policy: expected a vase_triton.policies.Policy; got {type(policy).__name__}")
    if not isinstance(replace, bool):
        raise TypeError(f"replace: expected True or False; got {replace!r}")
    if policy.name in _REGISTRY and not replace:
        raise ValueError(f"policy: a policy named {policy.name!r} is already registered (pass replace=True)")
    _REGISTRY[policy.name] = policy
    return policy


def get_policy(name: str) -> Policy:
    """The registered policy called `name`."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"policy: expected one of {', '.join(_REGISTRY)}; got {name!r} (a policy of your own is "
                         "known once register_policy has run in this process)")
    return _REGISTRY[name]


for _policy in (
    Policy("vase", pooled_candidate_attention, OBSERVE_WINDOW, stochastic=True, protect_values=True,
           summary="window attention, pooled over candidates; value protection; Gumbel sampling",
           reads=("pool_kernel",)),
    Policy("vase-dkv", _projected_energy, OBSERVE_NOTHING, stochastic=False, protect_values=False,
           summary="‖kG‖²·‖vG‖² with a fresh Gaussian G per eviction; top-k", reads=("dkv_rank",)),
    Policy("rkv", _redundancy_aware_attention, OBSERVE_WINDOW, stochastic=False, protect_values=False,
           summary="λ·pooled window attention − (1−λ)·key redundancy; top-k", reads=("pool_kernel", "rkv_lambda")),
    Policy("snapkv", pooled_candidate_attention, OBSERVE_WINDOW, stochastic=False, protect_values=False,
           summary="window attention, pooled over candidates; top-k", reads=("pool_kernel",)),
    Policy("h2o", _observed_attention, OBSERVE_ALL_QUERIES, stochastic=False, protect_values=False,
           summary="attention of every query since the token entered, prompt included; top-k"),
    Policy("tova", _observed_attention, OBSERVE_LAST_QUERY, stochastic=False, protect_values=False,
           summary="attention of the last query; top-k"),
    Policy("streaming", _recency, OBSERVE_NOTHING, stochastic=False, protect_values=False,
           summary="sinks + most recent tokens"),
    Policy("random", _uniform, OBSERVE_NOTHING, stochastic=True, protect_values=False,
           summary="uniform sampling", needs_noise=True),
    Policy("full", None, OBSERVE_NOTHING, stochastic=False, protect_values=False,
           summary="no eviction (reference)"),
):
    register_policy(_policy)


def policy_importance(config: "VaSEConfig", inputs: EvictionInputs) -> torch.Tensor:
    """Importance of every slot under `config.policy`: the input of `vase_triton.ops.evict_`.

    Returns:
        `[B, Hkv, N]` float32, contiguous, 0 outside the candidates. Non-negative for every
        built-in policy but `rkv`, whose `λ·attention − (1−λ)·redundancy` may be negative
        (it selects deterministically).
    """
    policy = config.policy_spec
    if not policy.evicts:
        raise ValueError(f"config.policy: expected a policy that evicts; {policy.name!r} never does")
    needs_attention = policy.observation != OBSERVE_NOTHING
    if needs_attention and inputs.attention is None:
        raise ValueError(f"attention: policy {policy.name!r} observes {policy.observation} and needs attention")
    importance = policy.importance(config, inputs)
    expected = tuple(inputs.cache.scores.shape)
    if not isinstance(importance, torch.Tensor) or tuple(importance.shape) != expected:
        got = tuple(importance.shape) if isinstance(importance, torch.Tensor) else type(importance).__name__
        raise ValueError(f"policy {policy.name!r}: importance must be a [B, Hkv, N] = {list(expected)} tensor; got {got}")
    return importance.to(torch.float32).contiguous()
