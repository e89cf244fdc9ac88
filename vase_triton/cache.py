"""`VaSECacheLayer`: the static KV cache of one decoder layer, with policy-driven eviction.

Every buffer is allocated once, at construction (or, for buffers sized by the query head
count when it is not given, at the first call that stores tokens), with `C = budget + window` slots per
(sequence, KV head). Decode appends one token per step and attends over the valid slots;
when the longest sequence reaches `C`, one eviction shrinks every sequence longer than
`budget` back to `budget` slots (README, Policies). Which sequences are evicted is decided on
device from `lengths`; the host keeps `length_bound`, an upper bound of the longest
sequence that moves with the calls, never with device reads.

Eviction is synchronous across the batch: with ragged (left-padded) prompts the shorter
sequences are compressed at the same step as the longest one, so after each eviction
every sequence holds at most `budget` tokens and `length_bound = budget` is exact again.
A consequence: with an evicting policy a row's output can depend on its batch mates.

The observation of each policy (`vase_triton.policies.Policy.observation`) is kept exact:
window policies see exactly the last `window` queries before every eviction (the first
one included, whose window may reach into the prompt), `tova` the last query, `h2o`
every query since the token entered the cache. The one exception: with `emitted` scores,
a chunk shorter than `window` that overflows a layer holding decode queries observes its
own queries only (the score buffer cannot drop older queries; `chunk_bounds` keeps the
chunks of one input from ending that way).

Multi-token inputs (a prompt, a new chat turn on a filled cache) go through `extend` in
chunks of at most `config.prefill_chunk_size` tokens: each chunk attends to the cached
tokens plus itself causally, is appended, and when the layer would overflow it is
compressed back to `budget` with the last `window` queries as the observation.
A chunk that overflows the layer is staged in a `PrefillScratch` of `C + chunk` slots,
so a prompt of any length never needs more than that.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from vase_triton.cache_tensors import CacheTensors
from vase_triton.config import VaSEConfig
from vase_triton.ops import append_, evict_, prefill_attention
from vase_triton.ops.attention import candidate_attention_op, decode_attention_op, decode_workspace
from vase_triton.ops.cache_append import append_op
from vase_triton.policies import (
    OBSERVE_ALL_QUERIES,
    OBSERVE_LAST_QUERY,
    OBSERVE_NOTHING,
    OBSERVE_WINDOW,
    EvictionInputs,
    Policy,
    policy_importance,
)
from vase_triton.seeding import GUMBEL_STREAM, stream_key
from vase_triton.validation import (
    FLOAT_DTYPES, check_head_dim, check_lengths, check_non_negative_int, check_rank, host_checks_allowed,
)


def _check_count(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name}: expected an int; got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name}: expected >= 1; got {value}")
    return value


class PrefillScratch:
    """Staging buffers for chunks that overflow a layer: `CacheTensors` of `C + T` slots (`T` <= chunk size).

    Layers run one after another, so the layers of one cache share it (one per device and
    shape). It is allocated by the first chunk that needs it, grown only for a longer chunk,
    and released when decoding starts (`release`): it exists only while a prompt or a new
    turn is being stored.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple, CacheTensors] = {}

    def get(self, batch: int, kv_heads: int, slots: int, head_dim: int, dtype: torch.dtype, device) -> CacheTensors:
        """Buffers of at least `slots` slots per row (their first `slots` are what the caller uses)."""
        key = (batch, kv_heads, head_dim, dtype, torch.device(device))
        held = self._buffers.get(key)
        if held is None or held.num_slots < slots:
            held = self._buffers[key] = CacheTensors.empty(batch, kv_heads, slots, head_dim, dtype=dtype, device=device)
        return held.prefix(slots)

    def release(self) -> None:
        self._buffers.clear()

    def buffers(self) -> tuple[torch.Tensor, ...]:
        return tuple(buffer for tensors in self._buffers.values() for buffer in tensors)


def mark_static(tensors) -> None:
    """Tell `torch.compile` that these buffers keep their address (no guard is added).

    Every tensor a compiled decode step mutates must be marked: under CUDA graphs
    (`mode="reduce-overhead"`) inductor replays a step in place only when each mutated
    input is static, and otherwise runs the whole step without CUDA graphs.
    """
    for tensor in tensors:
        torch._dynamo.mark_static_address(tensor, guard=False)  # older releases guarded by default


def chunk_bounds(length_bound: int, new_tokens: int, *, capacity: int, window: int, chunk: int) -> list[tuple[int, int]]:
    """`[start, stop)` of each chunk of `new_tokens` entering a layer that holds up to `length_bound` tokens.

    Chunks of `chunk` tokens, except one case: when the last chunk is shorter than `window`
    and overflows the layer right after a full chunk that did not, the two are cut so that
    the last holds exactly `window` tokens. A compression then observes a whole window of
    the prompt's own queries, which `emitted` scores cannot otherwise do (they cannot drop
    queries they have added). Every chunk still holds at most `chunk` tokens.
    """
    bounds = [(start, min(new_tokens, start + chunk)) for start in range(0, new_tokens, chunk)]
    tail = new_tokens - bounds[-1][0]
    if len(bounds) < 2 or tail >= window:
        return bounds
    length = length_bound
    for start, stop in bounds[:-2]:
        length = capacity - window if length + stop - start > capacity else length + stop - start
    if length + chunk <= capacity < length + chunk + tail:
        cut = new_tokens - window
        bounds[-2:] = [(bounds[-2][0], cut), (cut, new_tokens)]
    return bounds


def chunk_observation(
    policy: Policy, emits_scores: bool, *, budget: int, window: int, new_tokens: int, start: int, compress: bool
) -> tuple[int, bool]:
    """(score window, reset first) of a chunk of `new_tokens` queries entering a layer at length `start`.

    `compress`: whether the chunk overflows the layer; `emits_scores`: whether the policy's
    decode emits scores (`Policy.decode_emits_scores`). The score buffer must hold, at every
    eviction, the attention of the policy's observation queries: emitted window scores
    restart `window` queries before the eviction that reads them (at length `budget`, or at
    a compression: the chunk's last `window` queries, or all of a shorter chunk's, since the
    buffer cannot drop the older queries it holds), `tova` keeps the last query, `h2o` every
    query.
    """
    observation = policy.observation
    if observation == OBSERVE_WINDOW and emits_scores:
        if compress:
            return min(new_tokens, window), True
        return min(new_tokens, max(0, start + new_tokens - budget)), start <= budget
    if observation == OBSERVE_LAST_QUERY:
        return 1, True
    if observation == OBSERVE_ALL_QUERIES:
        return new_tokens, False
    return 0, False


def shared_padding(valid_lengths: Optional[torch.Tensor], total: int) -> int:
    """Leading tokens of a left-padded input of `total` tokens that pad every row (0 when the
    lengths are not given, or may not be read on the host)."""
    if valid_lengths is None or valid_lengths.numel() == 0 or not host_checks_allowed(valid_lengths):
        return 0
    return total - int(valid_lengths.max())


def _chunk_lengths(valid_lengths: Optional[torch.Tensor], total: int, start: int, stop: int) -> Optional[torch.Tensor]:
    """Real tokens of each row inside tokens `[start, stop)` of a left-padded input of `total` tokens."""
    if valid_lengths is None:
        return None
    return (valid_lengths.to(torch.int32) - (total - stop)).clamp(0, stop - start)


class VaSECacheLayer:
    """Static KV cache of one layer: `[B, Hkv, C, D]` keys/values plus eviction state.

    Buffers (`C = capacity`; `tensors` holds the first seven, see `CacheTensors`):
        keys, values: `[B, Hkv, C, D]` in `dtype` (keys after RoPE).
        scores: `[B, Hkv, C]` float32 attention accumulated from the policy's observation queries.
        magnitudes: `[B, Hkv, C]` float32 value magnitude (`config.value_stat`).
        positions: `[B, Hkv, C]` int32 token positions, -1 in empty slots.
        lengths: `[B]` int32 valid slots per sequence.
        next_positions: `[B]` int32 position of each sequence's next token.
        query_ring, query_valid, ring_cursor: `[B, Hq, W, D]`, `[B, W]` bool and `[1]` int64,
            the last `window` queries (only with `score_mode="recompute"` for window policies).
        eviction_counter: `[1]` int64 evictions done so far, on the device: the draw of the
            layer's random streams each eviction takes (`vase_triton.seeding`), advanced by the
            eviction itself, so that an eviction replayed from a CUDA graph draws anew.
        decode workspace: the split-K scratch of decode attention (shared by the layers of a
            `VaSECache` made with `num_query_heads`; otherwise owned by the layer).

    `kv_head_offset`: the model's index of the first KV head this layer holds (a rank's
    first head under tensor parallelism); it keys the eviction draws (`vase_triton.seeding`).

    Host-side state: `length_bound` (upper bound of `max(lengths)`) and `n_evictions` (the
    host's copy of `eviction_counter`). Callers that run `decode_step` themselves (e.g.
    compiled) call `prepare_decode_step()` eagerly before each step; `decode` does both.
    `evict()` is `evict_on_device()` (device work only, capturable in a CUDA graph unless
    the policy's importance reads the device back to the host) then `record_eviction()`.

    Eviction temporaries (beyond the op's, see `vase_triton.ops.evict_`), at the Qwen3-8B
    shape (B 16, Hq 32, Hkv 8, C 2112, D 128): the `[B, Hkv, C]` float32 importance and
    attention (2 x 1.1 MB) and pooling scratch of the same size; `recompute` adds `[B, Hq, W]`
    float32 log-sum-exps (0.13 MB); `rkv` adds `[B, Hkv, C]` float32 similarities (1.1 MB)
    and per-chunk sums of unit keys (0.3 MB; the PyTorch reference builds `[B, Hkv, C, D]`
    float32 unit keys instead, 138 MB); `vase-dkv` adds its projections `[B, Hkv, D, 20]`
    float32 (1.3 MB). Under CUDA graphs these stay reserved in the eviction graph's pool.
    """

    def __init__(
        self,
        config: VaSEConfig,
        *,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device,
        capacity: Optional[int] = None,
        layer_idx: int = 0,
        num_query_heads: Optional[int] = None,
        workspace: Optional[tuple[torch.Tensor, ...]] = None,
        scratch: Optional[PrefillScratch] = None,
        kv_head_offset: int = 0,
    ) -> None:
        if not isinstance(config, VaSEConfig):
            raise TypeError(f"config: expected a VaSEConfig; got {type(config).__name__}")
        for name, value in (("batch_size", batch_size), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            _check_count(name, value)
        check_head_dim("head_dim", head_dim)
        if dtype not in FLOAT_DTYPES:
            names = ", ".join(str(d).replace("torch.", "") for d in FLOAT_DTYPES)
            raise TypeError(f"dtype: expected one of ({names}); got {dtype}")
        check_non_negative_int("layer_idx", layer_idx)
        check_non_negative_int("kv_head_offset", kv_head_offset)
        if config.evicts:
            if capacity is not None and capacity != config.capacity:
                raise ValueError(
                    f"capacity: expected None or config.capacity = budget + window = {config.capacity} "
                    f"for policy {config.policy!r}; got {capacity}"
                )
            capacity = config.capacity
        elif capacity is None or isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(
                f"capacity: expected a positive int for policy {config.policy!r} (it never evicts: size it for "
                f"prompt + new tokens); got {capacity!r}"
            )

        self.config = config
        self.policy = config.policy_spec
        self.capacity = capacity
        self.batch_size = batch_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.layer_idx = layer_idx
        self.kv_head_offset = kv_head_offset
        self.tensors = CacheTensors.empty(batch_size, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.device = self.tensors.keys.device
        self.length_bound = 0
        self.n_evictions = 0
        self.eviction_counter = torch.zeros((1,), dtype=torch.int64, device=self.device)
        self.queries_seen = 0  # queries of the padded timeline, prompt included
        self.scale: Optional[float] = None
        self._emits_scores = self.policy.decode_emits_scores(config.score_mode)
        self._stores_queries = self.policy.stores_queries(config.score_mode)
        self.num_query_heads: Optional[int] = None
        self.query_ring: Optional[torch.Tensor] = None
        self.query_valid: Optional[torch.Tensor] = None
        self.ring_cursor: Optional[torch.Tensor] = None
        self._workspace: tuple[torch.Tensor, ...] = ()
        self._owns_workspace = workspace is None
        if workspace is not None:
            self._workspace = tuple(workspace)
        self._owns_scratch = scratch is None
        self._scratch = PrefillScratch() if scratch is None else scratch
        mark_static(self.tensors + (self.eviction_counter,))
        if num_query_heads is not None:
            self._allocate_query_state(_check_count("num_query_heads", num_query_heads))

    # ----------------------------------------------------------------------------- buffers

    def _allocate_query_state(self, num_query_heads: int) -> None:
        """Allocate (eagerly, once) what is sized by the query head count: ring and own workspace."""
        if num_query_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_query_heads: expected a multiple of the {self.num_kv_heads} KV heads; got {num_query_heads}"
            )
        self.num_query_heads = num_query_heads
        if self._stores_queries:
            window = self.config.window
            self.query_ring = torch.zeros(
                (self.batch_size, num_query_heads, window, self.head_dim), dtype=self.dtype, device=self.device
            )
            self.query_valid = torch.zeros((self.batch_size, window), dtype=torch.bool, device=self.device)
            self.ring_cursor = torch.zeros((1,), dtype=torch.long, device=self.device)
            mark_static((self.query_ring, self.query_valid, self.ring_cursor))
        if self._owns_workspace:
            self._workspace = decode_workspace(num_query_heads, self.keys, self.dtype, emit_scores=self._emits_scores)
            mark_static(self._workspace)

    def use_query_heads(self, num_query_heads: int) -> None:
        """Size the layer's query state (ring, decode workspace) for `num_query_heads` heads, once:
        at the first call that stores tokens, after `check_inputs` and every other check passed."""
        if self.num_query_heads is None:
            self._allocate_query_state(num_query_heads)

    def own_buffers(self) -> tuple[torch.Tensor, ...]:
        """Every buffer this layer owns (a shared decode workspace or prefill scratch excluded)."""
        ring = tuple(t for t in (self.query_ring, self.query_valid, self.ring_cursor) if t is not None)
        workspace = self._workspace if self._owns_workspace else ()
        scratch = self._scratch.buffers() if self._owns_scratch else ()
        return tuple(self.tensors) + (self.eviction_counter,) + ring + workspace + scratch

    def buffers(self) -> tuple[torch.Tensor, ...]:
        """Every buffer the layer uses, a shared decode workspace and prefill scratch included."""
        shared = (() if self._owns_workspace else self._workspace) + (
            () if self._owns_scratch else self._scratch.buffers()
        )
        return self.own_buffers() + shared

    @property
    def memory_bytes(self) -> int:
        """Bytes of the buffers this layer owns (see `own_buffers`)."""
        return sum(buffer.numel() * buffer.element_size() for buffer in self.own_buffers())

    # ----------------------------------------------------------------------------- checks

    def check_inputs(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> int:
        """Validate `query [B, Hq, T, D]`, `key`/`value [B, Hkv, T, D]` against the cache; return T."""
        check_rank("query", query, 4, "[B, Hq, T, D]")
        check_rank("key", key, 4, "[B, Hkv, T, D]")
        check_rank("value", value, 4, "[B, Hkv, T, D]")
        for name, tensor in (("query", query), ("key", key), ("value", value)):
            if tensor.dtype != self.dtype:
                autocast = (
                    " (autocast is on, and computes them in another dtype than the cache's: run without autocast)"
                    if torch.is_autocast_enabled(tensor.device.type) else ""
                )
                raise TypeError(f"{name}: expected dtype {self.dtype} like the cache; got {tensor.dtype}{autocast}")
            if tensor.device != self.device:
                raise ValueError(f"{name}: expected a tensor on {self.device} like the cache; got {tensor.device}")
            if tensor.shape[0] != self.batch_size:
                raise ValueError(
                    f"{name}: expected batch size {self.batch_size} like the cache; got {tensor.shape[0]}"
                )
            if tensor.shape[-1] != self.head_dim:
                raise ValueError(f"{name}: expected head dim {self.head_dim} like the cache; got {tensor.shape[-1]}")
        if key.shape[1] != self.num_kv_heads:
            raise ValueError(f"key: expected {self.num_kv_heads} KV heads like the cache; got {key.shape[1]}")
        if value.shape != key.shape:
            raise ValueError(f"value: expected shape {list(key.shape)} like key; got {list(value.shape)}")
        if query.shape[1] == 0 or query.shape[1] % self.num_kv_heads != 0:
            raise ValueError(
                f"query: expected a positive number of heads divisible by the {self.num_kv_heads} KV heads; "
                f"got Hq={query.shape[1]}"
            )
        if query.shape[2] != key.shape[2]:
            raise ValueError(f"query: expected T = {key.shape[2]} tokens like key; got T={query.shape[2]}")
        if key.shape[2] < 1:
            raise ValueError(f"key: expected at least one token (T >= 1); got T={key.shape[2]}")
        if self.num_query_heads is not None and query.shape[1] != self.num_query_heads:
            raise ValueError(
                f"query: expected {self.num_query_heads} query heads like this layer's buffers; got Hq={query.shape[1]}"
            )
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale: expected a finite positive float; got {scale!r}")
        return key.shape[2]

    # ----------------------------------------------------------------------------- prefill and extend

    def _store_queries(self, query: torch.Tensor, real: torch.Tensor) -> None:
        """Put the last `min(T, window)` queries `[B, Hq, T, D]` in the ring (valid where `real` `[B, T]`)."""
        new_tokens, window = query.shape[2], self.config.window
        kept = min(new_tokens, window)
        timeline = torch.arange(self.queries_seen + new_tokens - kept, self.queries_seen + new_tokens, device=self.device)
        ring_slots = timeline % window
        self.query_ring.index_copy_(2, ring_slots, query[:, :, new_tokens - kept :])
        self.query_valid.index_copy_(1, ring_slots, real[:, new_tokens - kept :])
        self.ring_cursor.fill_((self.queries_seen + new_tokens) % window)

    def prefill(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        scale: float,
        valid_lengths: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """`extend` on an empty layer (see there); refuses a layer that holds tokens."""
        if self.length_bound != 0:
            raise ValueError(
                f"prefill: expected an empty layer (call reset() first, or extend() to add tokens); got one "
                f"holding up to {self.length_bound} tokens"
            )
        return self.extend(query, key, value, scale=scale, valid_lengths=valid_lengths)

    def extend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        scale: float,
        valid_lengths: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Attend `T` new tokens to the cached ones plus themselves causally and store them (eager).

        Processed in chunks of at most `config.prefill_chunk_size` tokens (`chunk_bounds`); a
        chunk that would overflow the layer is compressed with it by the policy's rule (every
        row longer than `budget` shrinks to `budget`, one eviction), with the last `window`
        queries as the observation (SnapKV-style for a long prompt). With `emitted` scores a
        compressing chunk shorter than `window` observes its own queries only.

        Args:
            query: `[B, Hq, T, D]`; key, value: `[B, Hkv, T, D]` (after RoPE).
            scale: softmax scale.
            valid_lengths: `[B]` int, the last `valid_lengths[b]` tokens of row b are real (left
                padding, allowed only while a row is still empty); None means all `T`.

        Returns:
            `[B, Hq, T, D]` attention output (zeros for pad queries of empty rows).
        """
        self.check_extend(query, key, value, scale=scale, valid_lengths=valid_lengths)
        return self.extend_checked(query, key, value, scale=scale, valid_lengths=valid_lengths)

    def check_extend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        scale: float,
        valid_lengths: Optional[torch.Tensor] = None,
    ) -> None:
        """Raise unless `extend` takes these inputs; changes nothing."""
        new_tokens = self.check_inputs(query, key, value, scale)
        if valid_lengths is not None:
            check_lengths("valid_lengths", valid_lengths, self.batch_size, 0, new_tokens)
            if valid_lengths.device != self.device:
                raise ValueError(
                    f"valid_lengths: expected a tensor on {self.device} like the cache; got {valid_lengths.device}"
                )
            # A pad query of a row holding tokens would attend to them and add to their scores.
            if self.length_bound > 0 and bool(((self.tensors.lengths > 0) & (valid_lengths < new_tokens)).any()):
                raise ValueError(
                    f"valid_lengths: expected {new_tokens} (no padding) for every row that holds tokens; got "
                    f"{valid_lengths.tolist()} for rows holding {self.tensors.lengths.tolist()} tokens"
                )
        self.check_room(new_tokens)

    def extend_checked(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        scale: float,
        valid_lengths: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """`extend` of inputs that `check_extend` accepted: from here on the layer changes, so a
        failure (out of memory, an interrupt) may leave it holding part of the new tokens."""
        # Columns that pad every row (an input padded wider than its longest row) are left out, as
        # every pad is: they neither count toward the layer's length nor make it compress early.
        padding = shared_padding(valid_lengths, key.shape[2])
        outputs = [query.new_zeros((*query.shape[:2], padding, query.shape[3]))] if padding else []
        query, key, value = (t[:, :, padding:] for t in (query, key, value))
        new_tokens = key.shape[2]
        if new_tokens == 0:
            return outputs[0]
        self.use_query_heads(query.shape[1])
        self.scale = float(scale)
        for start, stop in self.chunk_bounds(new_tokens):
            part = slice(start, stop)
            outputs.append(self._extend_chunk(
                query[:, :, part], key[:, :, part], value[:, :, part],
                _chunk_lengths(valid_lengths, new_tokens, start, stop), scale,
            ))  # fmt: skip
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)

    def check_room(self, new_tokens: int, name: str = "key") -> None:
        """Raise unless `new_tokens` more tokens fit (only a policy that never evicts runs out of room);
        the error names the argument `name` that brought them."""
        if not self.config.evicts and self.length_bound + new_tokens > self.capacity:
            raise ValueError(
                f"{name}: the {self.config.policy!r} cache holds {self.capacity} tokens per row and never evicts; "
                f"{new_tokens} more do not fit next to the {self.length_bound} it may hold (make it with a larger "
                "max_length)"
            )

    def chunk_bounds(self, new_tokens: int) -> list[tuple[int, int]]:
        """`[start, stop)` of the chunks in which `extend` takes `new_tokens` tokens now (`chunk_bounds`)."""
        config = self.config
        return chunk_bounds(
            self.length_bound, new_tokens, capacity=self.capacity, window=config.window, chunk=config.prefill_chunk_size
        )

    def _extend_chunk(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, valid_lengths: Optional[torch.Tensor],
        scale: float,
    ) -> torch.Tensor:
        batch, kv_heads, new_tokens, head_dim = key.shape
        start = self.length_bound
        compress = start + new_tokens > self.capacity
        if valid_lengths is None:
            new_lengths = torch.full((batch,), new_tokens, dtype=torch.int32, device=self.device)
        else:
            new_lengths = valid_lengths.to(torch.int32)
        token = torch.arange(new_tokens, device=self.device)
        pads = (new_tokens - new_lengths).view(batch, 1)
        real = token.view(1, new_tokens) >= pads  # [B, T], in the padded layout
        # Left-align: new slot j of row b holds token pads_b + j.
        stored = token.view(1, new_tokens) < new_lengths.view(batch, 1)  # [B, T], in the stored layout
        source = (token.view(1, new_tokens) + pads).clamp_max(new_tokens - 1)
        source = source.view(batch, 1, new_tokens, 1).expand(batch, kv_heads, new_tokens, head_dim)
        keep = stored.view(batch, 1, new_tokens, 1)
        zero = torch.zeros((), dtype=key.dtype, device=self.device)
        keys = torch.where(keep, key.gather(2, source), zero)
        values = torch.where(keep, value.gather(2, source), zero)

        if compress:
            target = self._scratch.get(batch, kv_heads, self.capacity + new_tokens, head_dim, self.dtype, self.device)
            target.load_(self.tensors)
        else:
            target = self.tensors
        old_lengths = target.lengths.clone()
        old_next = target.next_positions.clone()
        append_(target, keys, values, value_stat=self.config.value_stat)
        # The append stored T slots in every row; un-store the padding.
        slot = torch.arange(target.num_slots, device=self.device).view(1, 1, -1)
        first_pad = (old_lengths + new_lengths).view(batch, 1, 1)
        pad_slots = (slot >= first_pad) & (slot < (old_lengths + new_tokens).view(batch, 1, 1))
        target.positions.masked_fill_(pad_slots, -1)
        target.magnitudes.masked_fill_(pad_slots, 0.0)
        target.lengths.copy_(old_lengths + new_lengths)
        target.next_positions.copy_(old_next + new_lengths)

        score_window, reset = chunk_observation(
            self.policy, self._emits_scores, budget=self.config.budget, window=self.config.window,
            new_tokens=new_tokens, start=start, compress=compress,
        )  # fmt: skip
        out, _, window_scores = prefill_attention(
            query, target.keys, target.values, scale=scale, causal=True, kv_lens=target.lengths,
            score_window=score_window,
        )
        if reset:
            target.scores.zero_()
        if window_scores is not None:
            target.scores.add_(window_scores)
        if self._stores_queries:
            self._store_queries(query, real)
        self.queries_seen += new_tokens

        if compress:
            self._evict_on_device(
                target, importance=None, trigger_length=self.config.budget + 1,
                window_queries=min(new_tokens, self.config.window),
            )  # fmt: skip
            self.n_evictions += 1
            self.tensors.fill_(target)
            self.length_bound = self.config.budget
        else:
            self.length_bound = start + new_tokens
        return out

    # ----------------------------------------------------------------------------- decode

    def prepare_decode_step(self) -> None:
        """Host-side bookkeeping before one decode step (eager, never inside a compiled graph).

        Evicts when the layer is full, opens the next observation window of emitted window
        scores `window` steps before the eviction that will close it, counts the step, and
        releases the prefill scratch of a layer built alone. Reads nothing back from the device.
        """
        if self._owns_scratch:
            self._scratch.release()
        if self.length_bound >= self.capacity:
            if not self.config.evicts:
                raise ValueError(
                    f"key: cannot append past capacity = {self.capacity} (policy {self.config.policy!r} never "
                    f"evicts); create the cache with a larger capacity"
                )
            self.evict()
        if self._emits_scores and self.policy.observation == OBSERVE_WINDOW and self.length_bound == self.config.budget:
            self.scores.zero_()
        self.length_bound += 1
        self.queries_seen += 1

    def cancel_decode_step(self) -> None:
        """Take back the count of a `prepare_decode_step` whose `decode_step` never ran (the
        forward pass was refused first). An eviction it ran stays: it is the one the next
        decode step would run, on the same tokens, with the same draw."""
        self.length_bound -= 1
        self.queries_seen -= 1

    def decode_step(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, scale: float) -> torch.Tensor:
        """Append one token per sequence and attend over the cache; device-only, trace-safe.

        A sequence already at capacity is not appended to (the kernel skips it). Adds this
        step's attention into `scores` when the policy's decode emits scores, and stores the
        query in the ring with `score_mode="recompute"`. Touches no host state, reads nothing
        back to the host, allocates no cache-sized tensor, and compiles under
        `torch.compile(fullgraph=True)`.

        Args:
            query: `[B, Hq, 1, D]`; key, value: `[B, Hkv, 1, D]` (after RoPE).

        Returns:
            `[B, Hq, 1, D]`.
        """
        # The registered ops themselves: the public wrappers re-check the layer's own buffers each step.
        append_op(*self.tensors, key, value, self.config.value_stat)
        if self._stores_queries:
            self.query_ring.index_copy_(2, self.ring_cursor, query)
            self.query_valid.index_fill_(1, self.ring_cursor, True)
            self.ring_cursor.add_(1).remainder_(self.config.window)
        scores = None
        if self._emits_scores:
            if self.policy.resets_scores_every_step:
                self.scores.zero_()
            scores = self.scores
        # (The public decode wrapper's value checks would also read lengths on the host.)
        return decode_attention_op(
            query, self.keys, self.values, self.lengths, scale, scores, *self._workspace
        )

    def decode(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, scale: float) -> torch.Tensor:
        """Eager decode: validate, `prepare_decode_step`, `decode_step`.

        Args:
            query: `[B, Hq, 1, D]`; key, value: `[B, Hkv, 1, D]` (after RoPE).

        Returns:
            `[B, Hq, 1, D]`.
        """
        new_len = self.check_inputs(query, key, value, scale)
        if new_len != 1:
            raise ValueError(f"key: expected one new token per sequence, shape [B, Hkv, 1, D]; got T={new_len}")
        self.prepare_decode_step()
        self.use_query_heads(query.shape[1])
        self.scale = float(scale)
        return self.decode_step(query, key, value, scale=scale)

    # ----------------------------------------------------------------------------- eviction

    def observed_attention(
        self, tensors: Optional[CacheTensors] = None, *, window_queries: Optional[int] = None
    ) -> Optional[torch.Tensor]:
        """`[B, Hkv, N]` float32 attention of the policy's observation queries (see `EvictionInputs`).

        Window policies: the mean over the last `window` queries and the group's query heads
        (emitted: each query's softmax over all valid slots; recompute: over the candidates
        only). `tova`: the last query's, averaged over the group. `h2o`: summed over queries and
        the group's query heads.
        None for policies that observe nothing.

        Args:
            window_queries: the queries the emitted score buffer holds, when a compressing
                chunk shorter than `window` left fewer than `window`; None means `window`.
        """
        tensors = self.tensors if tensors is None else tensors
        observation = self.policy.observation
        if observation == OBSERVE_NOTHING:
            return None
        if self.num_query_heads is None or self.scale is None:
            raise ValueError("observed_attention: the layer has not seen any query yet (prefill first)")
        group = self.num_query_heads // self.num_kv_heads
        window = self.config.window
        if observation == OBSERVE_WINDOW and self._stores_queries:
            candidate_lens = (tensors.lengths - window).clamp_min(0)
            return candidate_attention_op(
                self.query_ring, tensors.keys, candidate_lens, self.query_valid, self.scale
            )
        if observation == OBSERVE_WINDOW:
            return tensors.scores / ((window if window_queries is None else window_queries) * group)
        if observation == OBSERVE_LAST_QUERY:
            return tensors.scores / group
        return tensors.scores.clone()

    def check_policy(self) -> None:
        """Refuse a layer built for a policy that `register_policy(..., replace=True)` has replaced since:
        its buffers and what it observes were chosen for the policy it was built with."""
        if self.policy is not self.config.policy_spec:
            raise RuntimeError(
                f"cache: built for policy {self.config.policy!r} as registered before register_policy(..., "
                "replace=True) replaced it; make a new cache"
            )

    def importance(self, tensors: Optional[CacheTensors] = None, *, window_queries: Optional[int] = None) -> torch.Tensor:
        """`[B, Hkv, N]` float32 policy importance of the current state (the next eviction's input).

        `window_queries`: as in `observed_attention`.
        """
        self.check_policy()
        tensors = self.tensors if tensors is None else tensors
        inputs = EvictionInputs(
            cache=tensors, attention=self.observed_attention(tensors, window_queries=window_queries),
            window=self.config.window,
            layer=self.layer_idx, eviction_index=self.n_evictions, seed=self.config.seed,
            eviction_counter=self.eviction_counter, kv_head_offset=self.kv_head_offset,
        )
        return policy_importance(self.config, inputs)

    def _evict_on_device(
        self, tensors: CacheTensors, importance: Optional[torch.Tensor], trigger_length: int,
        window_queries: Optional[int] = None,
    ) -> None:
        config = self.config
        if importance is None:
            importance = self.importance(tensors, window_queries=window_queries)
        evict_(
            tensors, importance,
            budget=config.budget, window=config.window, n_sink=config.n_sink,
            n_protect=config.resolved_n_protect, temperature=config.eviction_temperature,
            seed=stream_key(config.seed, self.layer_idx, GUMBEL_STREAM, self.kv_head_offset),
            eviction_index=self.eviction_counter,
            keep_scores=self.policy.keeps_scores, trigger_length=trigger_length,
        )  # fmt: skip

    def evict(self, importance: Optional[torch.Tensor] = None) -> None:
        """Shrink every sequence longer than `budget` to `budget` tokens, in place (eager).

        Sequences at or below `budget` keep their tokens; the choice is made on device from
        `lengths`. With equal lengths this evicts exactly the sequences at capacity.

        Args:
            importance: `[B, Hkv, C]` float32 to rank the candidates by instead of the policy's
                (`self.importance()`); sinks, value protection and sampling still apply.
        """
        self.evict_on_device(importance)
        self.record_eviction()

    def evict_on_device(self, importance: Optional[torch.Tensor] = None) -> None:
        """The device work of `evict()` (importance, selection, compaction), without its host bookkeeping.

        Touches no host state, so that it can be captured once in a CUDA graph and replayed
        (`vase_triton.eviction_graph`); each run must be followed by `record_eviction()`.
        """
        if not self.config.evicts:
            raise ValueError(f"policy: expected an evicting policy; {self.config.policy!r} never evicts")
        self._evict_on_device(self.tensors, importance, trigger_length=self.config.budget + 1)

    def record_eviction(self) -> None:
        """Host bookkeeping of one `evict_on_device()` run: count it and lower `length_bound` to `budget`."""
        self.n_evictions += 1
        self.length_bound = min(self.length_bound, self.config.budget)

    # ----------------------------------------------------------------------------- state

    def reset(self) -> None:
        """Empty the layer without reallocating any buffer."""
        self.tensors.reset_()
        if self._stores_queries and self.query_ring is not None:
            self.query_ring.zero_()
            self.query_valid.zero_()
            self.ring_cursor.zero_()
        self.length_bound = 0
        self.n_evictions = 0
        self.eviction_counter.zero_()
        self.queries_seen = 0


def _buffer_view(name: str) -> property:
    return property(lambda layer: getattr(layer.tensors, name), doc=f"The layer's `tensors.{name}`.")


# `layer.keys`, `layer.lengths`, ...: the buffers of `layer.tensors` by name.
for _name in CacheTensors._fields:
    setattr(VaSECacheLayer, _name, _buffer_view(_name))
