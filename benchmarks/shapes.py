"""The named shapes every suite draws from: real Qwen3 head layouts and the sizes they run at.

A report row names its shape by `name` (e.g. `Qwen3-8B B16 C4160`), so every number says
which model layout it stands for. Layouts are the published Qwen3 configurations; the
end-to-end suites build randomly initialised models from them (`ModelLayout.qwen3_config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

PROMPT_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)
GENERATED_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)
BATCH_SIZES = (1, 4, 16, 64)
BUDGETS = (1024, 2048, 4096, 8192)
WINDOW = 64


@dataclass(frozen=True)
class ModelLayout:
    """The attention and MLP geometry of one model (all Qwen3 models use head dim 128, RoPE after q/k-norm)."""

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    experts: int = 0  # routed experts of a mixture-of-experts layout (0: dense); only its head layout is benchmarked

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.q_heads // self.kv_heads

    def qwen3_config(self, num_layers: Optional[int] = None):
        """A `transformers.Qwen3Config` of this layout, optionally with fewer layers (dense models only)."""
        from transformers import Qwen3Config

        if self.experts:
            raise ValueError(f"{self.name}: a mixture-of-experts layout has no dense Qwen3Config; use its head layout only")
        return Qwen3Config(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=num_layers or self.num_layers,
            num_attention_heads=self.q_heads,
            num_key_value_heads=self.kv_heads,
            head_dim=self.head_dim,
            max_position_embeddings=40960,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=self.tie_word_embeddings,
            pad_token_id=0,
            bos_token_id=None,
            eos_token_id=None,
        )


QWEN3 = {
    layout.name: layout
    for layout in (
        ModelLayout("Qwen3-4B", 36, 2560, 9728, 32, 8, 128, 151936, True),
        ModelLayout("Qwen3-8B", 36, 4096, 12288, 32, 8, 128, 151936, False),
        ModelLayout("Qwen3-14B", 40, 5120, 17408, 40, 8, 128, 151936, False),
        ModelLayout("Qwen3-32B", 64, 5120, 25600, 64, 8, 128, 151936, False),
        ModelLayout("Qwen3-30B-A3B", 48, 2048, 6144, 32, 4, 128, 151936, False, experts=128),
    )
}  # fmt: skip

# The built-in demo model's layout (`vase_triton.demo_model.tiny_qwen3`): CPU smoke runs only.
TINY = ModelLayout("tiny-qwen3", 2, 128, 256, 4, 2, 64, 259, True)
# A small Qwen3 with the real head dim, for the CPU end-to-end measurement.
SMALL = ModelLayout("small-qwen3", 4, 256, 768, 8, 2, 128, 4096, True)


@dataclass(frozen=True)
class PrefillShape:
    """A causal prefill: `batch` prompts of `tokens` tokens, `[B, Hq, T, D]` queries."""

    layout: ModelLayout
    batch: int
    tokens: int

    @property
    def name(self) -> str:
        return f"{self.layout.name} B{self.batch} T{self.tokens}"

    def causal_flops(self) -> float:
        """QK^T and PV over the causal half: 2 matmuls x 2 flops x T^2/2 pairs x D, per query head."""
        return 2.0 * self.batch * self.layout.q_heads * self.tokens * self.tokens * self.layout.head_dim


@dataclass(frozen=True)
class CacheShape:
    """One layer's static cache: `batch` sequences of `budget + window` slots, `[B, Hkv, C, D]`."""

    layout: ModelLayout
    batch: int
    budget: int
    window: int = WINDOW

    @property
    def capacity(self) -> int:
        return self.budget + self.window

    @property
    def name(self) -> str:
        return f"{self.layout.name} B{self.batch} C{self.capacity}"

    def decode_bytes(self, element_bytes: int = 2, *, emit_scores: bool = False) -> float:
        """Nominal traffic of one decode step of one layer over a full cache.

        Keys and values of every slot read once, the query read and the output written;
        with score emission, `[B, Hq, C]` fp32 logits written and read back and the
        `[B, Hkv, C]` fp32 scores read and written.
        """
        layout = self.layout
        cache = 2.0 * self.batch * layout.kv_heads * self.capacity * layout.head_dim * element_bytes
        query_out = 2.0 * self.batch * layout.q_heads * layout.head_dim * element_bytes
        scores = 0.0
        if emit_scores:
            scores = 2.0 * 4 * self.batch * self.capacity * (layout.q_heads + layout.kv_heads)
        return cache + query_out + scores

    def recompute_flops(self) -> float:
        """Nominal matmul work of one `recompute` importance: the `window` ring queries of every query
        head against the `budget` candidate keys, twice (log-sum-exp, then probabilities)."""
        layout = self.layout
        return 2 * 2.0 * self.batch * layout.q_heads * self.window * self.budget * layout.head_dim

    def projected_energy_bytes(self, rank: int, element_bytes: int = 2) -> float:
        """Nominal traffic of `vase-dkv`'s importance at projection width `rank`: the keys and
        values of the `budget` candidates read once, the fp32 `[D, rank]` projections drawn and
        read, and the fp32 energies written and normalised (read, written)."""
        rows = self.batch * self.layout.kv_heads
        kv = 2 * self.budget * self.layout.head_dim * element_bytes
        projection = 2 * 4 * self.layout.head_dim * rank
        energies = 3 * 4 * self.capacity
        return float(rows * (kv + projection + energies))

    def eviction_bytes(self, moved: float, element_bytes: int = 2) -> float:
        """Select-and-compact traffic of one eviction in which `moved` survivors (over all
        `B * Hkv` rows) change slot; the others stay where they are and are not copied.

        Keys, values, magnitudes and positions of the moved survivors read and written, fp32
        importance and magnitudes of every slot read by the selection, scores zeroed and
        freed positions cleared. The policy's importance computation is not counted (it
        differs per policy).
        """
        rows = self.batch * self.layout.kv_heads
        kv = 2 * 2 * moved * self.layout.head_dim * element_bytes
        per_token = 2 * 2 * 4 * moved
        selection = rows * 2 * 4 * self.capacity
        cleared = rows * (4 * self.capacity + 4 * self.window)
        return float(kv + per_token + selection + cleared)
