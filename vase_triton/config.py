"""`VaSEConfig`: every knob of the eviction cache, validated once at construction.

Defaults follow the VaSE paper (README, Policies): a recent window of 64 tokens that is
also the observation window and the eviction interval, 4 attention sinks, and
`budget // 4` value-protected tokens (sinks included) for the `vase` policy. What each
policy observes and whether it samples lives in its `vase_triton.policies.Policy` entry.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from vase_triton.policies import POLICIES, Policy, get_policy

VALUE_STATS = ("range", "absmax", "l2", "var")
SCORE_MODES = ("emitted", "recompute")
# Eviction temperatures below this are treated as exactly 0 (deterministic top-k) by every
# implementation: far below it, `log(w) / temperature` overflows float32.
MIN_TEMPERATURE = 1e-30
# Widest `vase-dkv` projection: four times the widest head dim the kernels take (256).
MAX_DKV_RANK = 1024


@dataclasses.dataclass(frozen=True)
class VaSEConfig:
    """Configuration of a VaSE (or baseline) eviction cache.

    Attributes:
        policy: eviction policy, a name in `vase_triton.policies.POLICIES`.
        budget: tokens kept per (sequence, KV head) right after an eviction. The cache's
            static capacity is `budget + window`.
        window: recent window size; also the observation window and the eviction interval.
        n_sink: first tokens of the sequence that are never evicted.
        n_protect: tokens kept for their value magnitude, sinks included (the sinks count
            as the largest: up to `n_sink` protects none beyond them). `None` means
            `budget // 4`, clipped to `budget - window`. Only used when value protection is on.
        protect_values: keep the `n_protect` largest-magnitude value vectors; `None` means
            the policy's default (on for `vase` only). Only for policies that evict.
        value_stat: value magnitude statistic: `range` (max - min), `absmax`, `l2` or `var`.
        temperature: Gumbel sampling temperature of stochastic policies: candidates are
            sampled ∝ `importance ** (1 / temperature)`; below `MIN_TEMPERATURE` (0
            included) selection is deterministic top-k.
        score_mode: how window-observing policies (`vase`, `snapkv`, `rkv`) get the
            attention of the last `window` queries: `recompute` (default, the paper's
            definition: a ring of the last `window` queries attends over the candidates
            only, at eviction) or `emitted` (decode attention accumulates each query's
            softmax over all slots; no stored queries, nothing recomputed).
        pool_kernel: width of the average pool that smooths attention importance (odd).
        rkv_lambda: R-KV weight `λ` in `λ·importance − (1−λ)·redundancy`.
        dkv_rank: width of the Gaussian projection of `vase-dkv` (at most `MAX_DKV_RANK`).
        seed: seed of every eviction draw (Gumbel noise, `vase-dkv` projections), combined
            with the layer and the eviction counter.
        prefill_chunk_size: multi-token inputs (prompts, new chat turns) are processed in
            chunks of at most this many tokens, the cache compressed between chunks, so
            prefill holds at most `capacity + prefill_chunk_size` slots per row and layer. At least
            `window` for a policy that evicts (a chunk that compresses is its observation window).
    """

    policy: str = "vase"
    budget: int = 2048
    window: int = 64
    n_sink: int = 4
    n_protect: Optional[int] = None
    protect_values: Optional[bool] = None
    value_stat: str = "range"
    temperature: float = 1.0
    score_mode: str = "recompute"
    pool_kernel: int = 5
    rkv_lambda: float = 0.1
    dkv_rank: int = 20
    seed: int = 0
    prefill_chunk_size: int = 4096

    def __post_init__(self) -> None:
        policy = get_policy(self.policy) if isinstance(self.policy, str) else None
        if policy is None:
            raise ValueError(f"policy: expected one of {', '.join(POLICIES)}; got {self.policy!r}")
        for name, choices in (("value_stat", VALUE_STATS), ("score_mode", SCORE_MODES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name}: expected one of {', '.join(choices)}; got {getattr(self, name)!r}")
        for name in ("budget", "window", "n_sink", "pool_kernel", "dkv_rank", "seed", "prefill_chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name}: expected an int; got {type(value).__name__} {value!r}")
        if self.protect_values is not None and not isinstance(self.protect_values, bool):
            raise TypeError(f"protect_values: expected True, False or None; got {self.protect_values!r}")
        if self.window < 1:
            raise ValueError(f"window: expected >= 1; got {self.window}")
        if self.budget <= self.window:
            raise ValueError(
                f"budget: expected budget > window (each eviction keeps budget - window older "
                f"tokens next to the window); got budget={self.budget}, window={self.window}"
            )
        kept_candidates = self.budget - self.window
        if not 0 <= self.n_sink <= kept_candidates:
            raise ValueError(f"n_sink: expected 0 <= n_sink <= budget - window = {kept_candidates}; got {self.n_sink}")
        if policy.evicts and self.prefill_chunk_size < self.window:
            raise ValueError(
                f"prefill_chunk_size: expected >= window = {self.window} (a chunk that triggers an eviction "
                f"is its observation window); got {self.prefill_chunk_size}"
            )
        if self.pool_kernel < 1 or self.pool_kernel % 2 == 0:
            raise ValueError(f"pool_kernel: expected an odd width >= 1; got {self.pool_kernel}")
        if self.capacity >= 2**31:
            raise ValueError(
                f"budget: expected budget + window < 2**31 (slots and positions are int32); "
                f"got budget={self.budget}, window={self.window}"
            )
        if not 1 <= self.dkv_rank <= MAX_DKV_RANK:
            raise ValueError(
                f"dkv_rank: expected 1 <= dkv_rank <= {MAX_DKV_RANK} (the projection is [head_dim, dkv_rank] per "
                f"row and eviction); got {self.dkv_rank}"
            )
        if isinstance(self.rkv_lambda, bool) or not isinstance(self.rkv_lambda, (int, float)):
            raise TypeError(f"rkv_lambda: expected a float; got {type(self.rkv_lambda).__name__} {self.rkv_lambda!r}")
        if not 0.0 <= self.rkv_lambda <= 1.0:
            raise ValueError(f"rkv_lambda: expected a number in [0, 1]; got {self.rkv_lambda!r}")
        self._check_temperature(policy)
        if self.seed < 0 or self.seed >= 2**31:
            raise ValueError(f"seed: expected 0 <= seed < 2**31; got {self.seed}")
        if self.n_protect is not None:
            if not isinstance(self.n_protect, int) or isinstance(self.n_protect, bool):
                raise TypeError(f"n_protect: expected an int or None; got {self.n_protect!r}")
            if not 0 <= self.n_protect <= kept_candidates:
                raise ValueError(
                    f"n_protect: expected 0 <= n_protect <= budget - window = {kept_candidates} (sinks "
                    f"included; the protected tokens must fit among the kept candidates); got {self.n_protect}"
                )
            if not self.evicts:
                raise ValueError(
                    f"n_protect: policy {self.policy!r} never evicts, so n_protect would be ignored; drop n_protect"
                )
            if not self.protects_values:
                raise ValueError(
                    f"n_protect: value protection is off for policy {self.policy!r}, so n_protect would be "
                    f"ignored; pass protect_values=True to protect {self.n_protect} tokens, or drop n_protect"
                )
        if self.protect_values and not self.evicts:
            raise ValueError(
                f"protect_values: policy {self.policy!r} never evicts, so value protection would be ignored; "
                "drop protect_values"
            )

    def _check_temperature(self, policy: Policy) -> None:
        temperature = self.temperature
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise TypeError(f"temperature: expected a float; got {type(temperature).__name__} {temperature!r}")
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"temperature: expected a finite value >= 0 (0 = deterministic); got {temperature}")
        if policy.needs_noise and temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"temperature: policy {policy.name!r} samples and has no deterministic form; expected "
                f"temperature >= {MIN_TEMPERATURE}; got {temperature}"
            )

    @property
    def policy_spec(self) -> Policy:
        """The registered `Policy` named by `policy`."""
        return get_policy(self.policy)

    @property
    def capacity(self) -> int:
        """Static number of slots per (sequence, KV head): `budget + window`."""
        return self.budget + self.window

    @property
    def evicts(self) -> bool:
        """False only for policies that never evict (`full`)."""
        return self.policy_spec.evicts

    @property
    def stochastic(self) -> bool:
        """True when candidates are sampled with Gumbel noise (a stochastic policy, temperature >= floor)."""
        return self.policy_spec.stochastic and self.temperature >= MIN_TEMPERATURE

    @property
    def eviction_temperature(self) -> float:
        """The temperature handed to the eviction op: `temperature`, or 0 for deterministic selection."""
        return float(self.temperature) if self.stochastic else 0.0

    @property
    def protects_values(self) -> bool:
        """Whether the `n_protect` largest value vectors are kept (`protect_values` or the policy's default)."""
        if self.protect_values is not None:
            return self.protect_values and self.evicts
        return self.policy_spec.protect_values

    @property
    def resolved_n_protect(self) -> int:
        """Tokens kept for their value magnitude, sinks included (0 without value protection)."""
        if not self.protects_values:
            return 0
        if self.n_protect is not None:
            return self.n_protect
        return min(self.budget // 4, self.budget - self.window)

    def __reduce__(self):
        """Pickle through the constructor, so an unpickled config is validated again."""
        return (type(self), tuple(getattr(self, field.name) for field in dataclasses.fields(self)))

    def replace(self, **overrides) -> "VaSEConfig":
        """A copy with some fields changed, validated again."""
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            valid = ", ".join(f.name for f in dataclasses.fields(self))
            raise TypeError(f"unknown VaSEConfig field(s) {sorted(unknown)}; valid fields: {valid}")
        return dataclasses.replace(self, **overrides)
