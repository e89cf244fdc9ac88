"""What one kernel launch looks like (a shape) and the coarse key it is tuned under.

A launcher describes each launch with one of the shapes below (plain named tuples, cheap
to build and hash on every call). A shape's `key()` is the string a tuned configuration
is stored under: lengths and the batch rounded to the nearest power of two (in log
space: 4160 slots -> 4096), the head layout `Hq/Hkv`, the head dim, the dtype and the
flags that change the kernel (causal, values, score emission), e.g.
`B=16,C=4096,H=32/8,D=128,dtype=bfloat16,scores=0`. The key never depends on the
candidate list, so adding a candidate leaves every stored entry valid.
"""

from __future__ import annotations

import math
from typing import NamedTuple

# Key fields holding bucketed sizes; every other field must match exactly.
NUMERIC_FIELDS = frozenset({"B", "Tq", "Tk", "W", "C", "T", "N", "budget"})
# Key fields holding flags (0 or 1), and the head layout (`Hq/Hkv`, or `Hkv` alone).
FLAG_FIELDS = frozenset({"causal", "values", "scores"})
HEADS_FIELD = "H"


def bucket(size: int) -> int:
    """The power of two nearest to `size >= 1` in log space (ties round up); 0 stays 0."""
    if size <= 0:
        return 0
    low = 1 << (size.bit_length() - 1)
    return low if size < low * math.sqrt(2.0) else low * 2


def dtype_name(dtype) -> str:
    """`torch.bfloat16` -> `"bfloat16"`."""
    return str(dtype).removeprefix("torch.")


def format_key(fields: dict[str, object]) -> str:
    """`{"B": 16, "causal": True}` -> `"B=16,causal=1"` (booleans as 0/1, order kept)."""
    return ",".join(f"{name}={int(value) if isinstance(value, bool) else value}" for name, value in fields.items())


def parse_key(key: str) -> dict[str, str]:
    """Inverse of `format_key`, values as strings; raises ValueError on a malformed key."""
    fields = {}
    for part in key.split(","):
        name, sep, value = part.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"key: expected comma-separated name=value fields; got {key!r}")
        fields[name] = value
    return fields


def _is_count(text: str) -> bool:
    return text.isascii() and text.isdigit()


def check_key(key: str, fields: tuple[str, ...]) -> None:
    """Raise ValueError unless `key` has exactly `fields`, in order, with integer sizes and 0/1 flags."""
    parsed = parse_key(key)
    if tuple(parsed) != fields or format_key(parsed) != key:
        raise ValueError(f"key: expected the fields {','.join(fields)}; got {key!r}")
    for name, value in parsed.items():
        if name == "dtype":
            continue
        if name in FLAG_FIELDS:
            valid, expected = value in ("0", "1"), "0 or 1"
        elif name == HEADS_FIELD:
            valid, expected = all(_is_count(part) for part in value.split("/", 1)), "Hq/Hkv or Hkv in integers"
        else:
            valid, expected = _is_count(value), "a non-negative integer"
        if not valid:
            raise ValueError(f"key: expected {name} to be {expected}; got {name}={value} in {key!r}")


def key_distance(wanted: dict[str, str], stored: dict[str, str]) -> float:
    """Octaves between two parsed keys (sum over sizes of |log2 ratio|); inf when another field differs."""
    if wanted.keys() != stored.keys():
        return math.inf
    distance = 0.0
    for name, value in wanted.items():
        if name in NUMERIC_FIELDS:
            a, b = int(value), int(stored[name])
            if a <= 0 or b <= 0:
                if a != b:
                    return math.inf
                continue
            distance += abs(math.log2(a) - math.log2(b))
        elif value != stored[name]:
            return math.inf
    return distance


class PrefillShape(NamedTuple):
    """A prefill forward launch: `[B, Hq, Tq, D]` queries over `[B, Hkv, Tk, D]` keys (`values`: output written)."""

    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    k_len: int
    head_dim: int
    dtype: str
    causal: bool
    values: bool

    def rows(self) -> int:
        """Query rows a program column covers: the group's `group * Tq` when non-causal (GQA-packed), else `Tq`."""
        return self.q_len if self.causal else self.q_len * (self.q_heads // self.kv_heads)

    def key(self) -> str:
        return format_key({
            "B": bucket(self.batch), "Tq": bucket(self.q_len), "Tk": bucket(self.k_len),
            "H": f"{self.q_heads}/{self.kv_heads}", "D": self.head_dim, "dtype": self.dtype,
            "causal": self.causal, "values": self.values,
        })  # fmt: skip


class ScoresShape(NamedTuple):
    """A window-scores launch: the last `window` queries of `[B, Hq, *, D]` over `[B, Hkv, Tk, D]` keys."""

    batch: int
    q_heads: int
    kv_heads: int
    window: int
    k_len: int
    head_dim: int
    dtype: str
    causal: bool

    def key(self) -> str:
        return format_key({
            "B": bucket(self.batch), "W": bucket(self.window), "Tk": bucket(self.k_len),
            "H": f"{self.q_heads}/{self.kv_heads}", "D": self.head_dim, "dtype": self.dtype, "causal": self.causal,
        })  # fmt: skip


class DecodeShape(NamedTuple):
    """A decode step: `[B, Hq, 1, D]` queries over a `[B, Hkv, C, D]` cache (`scores`: probabilities emitted)."""

    batch: int
    q_heads: int
    kv_heads: int
    capacity: int
    head_dim: int
    dtype: str
    scores: bool

    def key(self) -> str:
        return format_key({
            "B": bucket(self.batch), "C": bucket(self.capacity), "H": f"{self.q_heads}/{self.kv_heads}",
            "D": self.head_dim, "dtype": self.dtype, "scores": self.scores,
        })  # fmt: skip


class AppendShape(NamedTuple):
    """A cache append of `[B, Hkv, T_new, D]` new tokens."""

    batch: int
    kv_heads: int
    new_len: int
    head_dim: int
    dtype: str

    def key(self) -> str:
        return format_key({
            "B": bucket(self.batch), "T": bucket(self.new_len), "H": self.kv_heads, "D": self.head_dim,
            "dtype": self.dtype,
        })  # fmt: skip


class EvictShape(NamedTuple):
    """An eviction of `[B, Hkv, N, D]` cache rows down to `budget` slots, `window` of them recent."""

    batch: int
    kv_heads: int
    num_slots: int
    budget: int
    window: int
    head_dim: int
    dtype: str

    def select_key(self) -> str:
        """Key of the selection kernels, which read only float32 `[B, Hkv, N]` buffers."""
        return format_key({"B": bucket(self.batch), "N": bucket(self.num_slots), "H": self.kv_heads})

    def key(self) -> str:
        """Key of the compaction kernel, which moves `budget` slots of keys and values."""
        return format_key({
            "B": bucket(self.batch), "N": bucket(self.num_slots), "budget": bucket(self.budget),
            "H": self.kv_heads, "D": self.head_dim, "dtype": self.dtype,
        })  # fmt: skip


class EnergyShape(NamedTuple):
    """`vase-dkv`'s projected energy of `[B, Hkv, N, D]` keys and values through a `[D, rank]` projection."""

    batch: int
    kv_heads: int
    num_slots: int
    head_dim: int
    rank: int
    dtype: str

    def key(self) -> str:
        return format_key({
            "B": bucket(self.batch), "N": bucket(self.num_slots), "H": self.kv_heads, "D": self.head_dim,
            "R": self.rank, "dtype": self.dtype,
        })  # fmt: skip


class SimilarityShape(NamedTuple):
    """`rkv`'s mean key similarity over `[B, Hkv, N, D]` keys."""

    batch: int
    kv_heads: int
    num_slots: int
    head_dim: int
    dtype: str

    def key(self) -> str:
        return format_key({
            "B": bucket(self.batch), "N": bucket(self.num_slots), "H": self.kv_heads, "D": self.head_dim,
            "dtype": self.dtype,
        })  # fmt: skip
