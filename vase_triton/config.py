"""`VaSEConfig`: every knob of the eviction cache, validated once at construction.

Defaults follow the VaSE paper (see DESIGN.md §2): a recent window of 64 tokens
that is also the observation window and the eviction interval, 4 attention
sinks, and `budget // 4` value-protected tokens for the `vase` policy.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

POLICIES = ("vase", "vase-dkv", "rkv", "snapkv", "h2o", "tova", "streaming", "random", "full")
VALUE_STATS = ("range", "absmax", "l2", "var")

# Policies whose selection is sampled (Gumbel-top-k) rather than deterministic top-k.
STOCHASTIC_POLICIES = ("vase", "random")
# Policies that always keep the `n_protect` largest-magnitude value vectors.
VALUE_PROTECTING_POLICIES = ("vase",)
# Policies whose importance is the decode attention accumulated in the cache's score buffer.
ATTENTION_SCORED_POLICIES = ("vase", "rkv", "snapkv", "h2o", "tova")


@dataclasses.dataclass(frozen=True)
class VaSEConfig:
    """Configuration of a VaSE (or baseline) eviction cache.

    Attributes:
        policy: eviction policy, one of `POLICIES`.
        budget: tokens kept per (sequence, KV head) right after an eviction. The cache's
            static capacity is `budget + window`.
        window: recent window size; also the observation window and the eviction interval.
        n_sink: first tokens of the sequence that are never evicted.
        n_protect: candidates with the largest value magnitude that are never evicted
            (policy `vase` only). `None` means `budget // 4`, clipped to what fits.
        value_stat: value magnitude statistic: `range` (max - min), `absmax`, `l2` or `var`.
        temperature: Gumbel sampling temperature; 0 makes sampling policies deterministic top-k.
        pool_kernel: width of the average pool that smooths attention importance (odd).
        rkv_lambda: R-KV weight `λ` in `λ·importance − (1−λ)·redundancy`.
        dkv_rank: width of the Gaussian projection of `vase-dkv`.
        seed: seed of the philox stream used for Gumbel noise and `vase-dkv` projections.
    """

    policy: str = "vase"
    budget: int = 2048
    window: int = 64
    n_sink: int = 4
    n_protect: Optional[int] = None
    value_stat: str = "range"
    temperature: float = 1.0
    pool_kernel: int = 5
    rkv_lambda: float = 0.1
    dkv_rank: int = 20
    seed: int = 0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy: expected one of {', '.join(POLICIES)}; got {self.policy!r}")
        if self.value_stat not in VALUE_STATS:
            raise ValueError(
                f"value_stat: expected one of {', '.join(VALUE_STATS)}; got {self.value_stat!r}"
            )
        for name in ("budget", "window", "n_sink", "pool_kernel", "dkv_rank", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name}: expected an int; got {type(value).__name__} {value!r}")
        if self.window < 1:
            raise ValueError(f"window: expected >= 1; got {self.window}")
        if self.n_sink < 0:
            raise ValueError(f"n_sink: expected >= 0; got {self.n_sink}")
        if self.budget <= self.window:
            raise ValueError(
                f"budget: expected budget > window (each eviction keeps budget - window older "
                f"tokens next to the window); got budget={self.budget}, window={self.window}"
            )
        if self.pool_kernel < 1 or self.pool_kernel % 2 == 0:
            raise ValueError(f"pool_kernel: expected an odd width >= 1; got {self.pool_kernel}")
        if self.dkv_rank < 1:
            raise ValueError(f"dkv_rank: expected >= 1; got {self.dkv_rank}")
        if not 0.0 <= float(self.rkv_lambda) <= 1.0:
            raise ValueError(f"rkv_lambda: expected a value in [0, 1]; got {self.rkv_lambda}")
        if not float(self.temperature) >= 0.0:
            raise ValueError(f"temperature: expected >= 0 (0 = deterministic); got {self.temperature}")
        if self.seed < 0 or self.seed >= 2**31:
            raise ValueError(f"seed: expected 0 <= seed < 2**31; got {self.seed}")
        kept_candidates = self.budget - self.window
        if self.n_protect is not None:
            if not isinstance(self.n_protect, int) or isinstance(self.n_protect, bool):
                raise TypeError(f"n_protect: expected an int or None; got {self.n_protect!r}")
            if self.n_protect < 0:
                raise ValueError(f"n_protect: expected >= 0; got {self.n_protect}")
        if self.n_sink + self.resolved_n_protect > kept_candidates:
            raise ValueError(
                f"n_protect + n_sink: expected at most budget - window = {kept_candidates} "
                f"(the protected tokens must fit among the kept candidates); got "
                f"n_protect={self.resolved_n_protect}, n_sink={self.n_sink}"
            )

    @property
    def capacity(self) -> int:
        """Static number of slots per (sequence, KV head): `budget + window`."""
        return self.budget + self.window

    @property
    def evicts(self) -> bool:
        """False only for the `full` reference policy."""
        return self.policy != "full"

    @property
    def stochastic(self) -> bool:
        """True when candidates are sampled with Gumbel noise (`temperature > 0`)."""
        return self.policy in STOCHASTIC_POLICIES and self.temperature > 0

    @property
    def protects_values(self) -> bool:
        return self.policy in VALUE_PROTECTING_POLICIES

    @property
    def resolved_n_protect(self) -> int:
        """Number of value-protected candidates actually used by this policy."""
        if not self.protects_values:
            return 0
        if self.n_protect is not None:
            return self.n_protect
        return max(0, min(self.budget // 4, self.budget - self.window - self.n_sink))

    def replace(self, **overrides) -> "VaSEConfig":
        """A copy with some fields changed, validated again."""
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            valid = ", ".join(f.name for f in dataclasses.fields(self))
            raise TypeError(f"unknown VaSEConfig field(s) {sorted(unknown)}; valid fields: {valid}")
        return dataclasses.replace(self, **overrides)
