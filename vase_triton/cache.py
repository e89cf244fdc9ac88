"""`VaSECacheLayer`: the static KV cache of one decoder layer, with value-aware eviction.

Every buffer is allocated once, at construction, with `C` slots per (sequence, KV head).
Decode appends one token per step and attends over the valid slots; when the
longest sequence reaches `C`, one eviction shrinks every sequence longer than
`budget` back to `budget` slots (DESIGN.md §2). The decision of which sequences to
evict is taken on device from `lengths`; the host only keeps `length_bound`, an upper
bound of the longest sequence that moves with the calls, never with device reads.

Eviction is synchronous across the batch: with ragged (left-padded) prompts the
shorter sequences are compressed at the same step as the longest one, so after each
eviction every sequence holds at most `budget` tokens and `length_bound = budget` is
exact again.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from vase_triton.config import ATTENTION_SCORED_POLICIES, VaSEConfig
from vase_triton.ops import append_, evict_, prefill_attention
from vase_triton.ops.attention import decode_workspace
from vase_triton.policies import policy_importance
from vase_triton.validation import FLOAT_DTYPES, check_head_dim, check_lengths, check_rank


class VaSECacheLayer:
    """Static KV cache of one layer: `[B, Hkv, C, D]` keys/values plus eviction state.

    Buffers (allocated once, never reallocated; `C = capacity`):
        keys, values: `[B, Hkv, C, D]` in `dtype` (keys after RoPE).
        scores: `[B, Hkv, C]` float32 attention importance accumulated by decode.
        magnitudes: `[B, Hkv, C]` float32 value magnitude (`config.value_stat`).
        positions: `[B, Hkv, C]` int32 token positions, -1 in empty slots.
        lengths: `[B]` int32 valid slots per sequence.
        next_positions: `[B]` int32 position of each sequence's next token.

    Host-side state: `length_bound` (upper bound of `max(lengths)`) and `n_evictions`.
    Callers that use `decode_step` directly (e.g. compiled) advance `length_bound` by one
    per step themselves and call `evict()` when it reaches `capacity`; `decode` does both.
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
    ) -> None:
        if not isinstance(config, VaSEConfig):
            raise TypeError(f"config: expected a VaSEConfig; got {type(config).__name__}")
        for name, value in (("batch_size", batch_size), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name}: expected an int; got {type(value).__name__} {value!r}")
            if value < 1:
                raise ValueError(f"{name}: expected >= 1; got {value}")
        check_head_dim("head_dim", head_dim)
        if dtype not in FLOAT_DTYPES:
            names = ", ".join(str(d).replace("torch.", "") for d in FLOAT_DTYPES)
            raise TypeError(f"dtype: expected one of ({names}); got {dtype}")
        if config.evicts:
            if capacity is not None and capacity != config.capacity:
                raise ValueError(
                    f"capacity: expected None or config.capacity = budget + window = {config.capacity} "
                    f"for policy {config.policy!r}; got {capacity}"
                )
            capacity = config.capacity
        elif capacity is None or isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(
                f"capacity: expected a positive int for policy 'full' (it never evicts: size it for "
                f"prompt + new tokens); got {capacity!r}"
            )

        self.config = config
        self.capacity = capacity
        self.batch_size = batch_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.layer_idx = layer_idx
        slots = (batch_size, num_kv_heads, capacity)
        self.keys = torch.zeros(slots + (head_dim,), dtype=dtype, device=device)
        self.device = self.keys.device
        self.values = torch.zeros_like(self.keys)
        self.scores = torch.zeros(slots, dtype=torch.float32, device=self.device)
        self.magnitudes = torch.zeros(slots, dtype=torch.float32, device=self.device)
        self.positions = torch.full(slots, -1, dtype=torch.int32, device=self.device)
        self.lengths = torch.zeros((batch_size,), dtype=torch.int32, device=self.device)
        self.next_positions = torch.zeros((batch_size,), dtype=torch.int32, device=self.device)
        self.length_bound = 0
        self.n_evictions = 0
        self._scored = config.policy in ATTENTION_SCORED_POLICIES
        # Split-K scratch of the decode attention, sized for the query heads on first use.
        self._decode_workspace: tuple[torch.Tensor, ...] = ()
        self._mark_static(self.buffers())

    # ----------------------------------------------------------------------------- checks

    def _check_inputs(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> int:
        """Validate `query [B, Hq, T, D]`, `key`/`value [B, Hkv, T, D]` against the cache; return T."""
        check_rank("query", query, 4, "[B, Hq, T, D]")
        check_rank("key", key, 4, "[B, Hkv, T, D]")
        check_rank("value", value, 4, "[B, Hkv, T, D]")
        for name, tensor in (("query", query), ("key", key), ("value", value)):
            if tensor.dtype != self.dtype:
                raise TypeError(f"{name}: expected dtype {self.dtype} like the cache; got {tensor.dtype}")
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
        if query.shape[1] % self.num_kv_heads != 0:
            raise ValueError(
                f"query: expected a number of heads divisible by the {self.num_kv_heads} KV heads; "
                f"got Hq={query.shape[1]}"
            )
        if query.shape[2] != key.shape[2]:
            raise ValueError(f"query: expected T = {key.shape[2]} tokens like key; got T={query.shape[2]}")
        if key.shape[2] < 1:
            raise ValueError(f"key: expected at least one token (T >= 1); got T={key.shape[2]}")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale: expected a finite positive float; got {scale!r}")
        return key.shape[2]

    def _prepare_decode_workspace(self, q_heads: int) -> None:
        """Allocate (eagerly, once per head count) the scratch `decode_step` hands to the kernel."""
        if not self._decode_workspace or self._decode_workspace[0].shape[1] != q_heads:
            self._decode_workspace = decode_workspace(q_heads, self.keys, self.dtype, emit_scores=self._scored)
            self._mark_static(self._decode_workspace)

    def _mark_static(self, tensors) -> None:
        """On CUDA, fixed data pointers let compiled decode steps run under CUDA graphs without copies."""
        if self.device.type == "cuda":
            for tensor in tensors:
                torch._dynamo.mark_static_address(tensor)

    # ----------------------------------------------------------------------------- prefill

    def prefill(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        scale: float,
        valid_lengths: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Attend over a left-padded prompt and store its real tokens (compressed if longer than C).

        Args:
            query: `[B, Hq, T, D]`; key, value: `[B, Hkv, T, D]` (after RoPE).
            scale: softmax scale.
            valid_lengths: `[B]` int, the last `valid_lengths[b]` tokens of row b are real
                (left padding); None means all `T`.

        Returns:
            `[B, Hq, T, D]` attention output; zeros for pad queries.
        """
        prompt_len = self._check_inputs(query, key, value, scale)
        self._prepare_decode_workspace(query.shape[1])
        if self.length_bound != 0:
            raise ValueError(
                f"prefill: expected an empty layer (call reset() first); got one holding up to "
                f"{self.length_bound} tokens"
            )
        if valid_lengths is not None:
            check_lengths("valid_lengths", valid_lengths, self.batch_size, 0, prompt_len)
            if valid_lengths.device != self.device:
                raise ValueError(
                    f"valid_lengths: expected a tensor on {self.device} like the cache; got {valid_lengths.device}"
                )
        compress = prompt_len > self.capacity
        if compress and not self.config.evicts:
            raise ValueError(
                f"key: expected at most capacity = {self.capacity} prompt tokens for policy 'full' "
                f"(it never evicts); got T={prompt_len}"
            )

        batch, kv_heads, head_dim = self.batch_size, self.num_kv_heads, self.head_dim
        token = torch.arange(prompt_len, device=self.device)
        if valid_lengths is None:
            lengths = torch.full((batch,), prompt_len, dtype=torch.int32, device=self.device)
        else:
            lengths = valid_lengths.to(torch.int32)
        real = token.view(1, prompt_len) < lengths.view(batch, 1)  # [B, T]
        # Left-align: slot j of row b holds token pad_b + j, pad_b = T - lengths[b].
        source = (token.view(1, prompt_len) + (prompt_len - lengths).view(batch, 1)).clamp_max(prompt_len - 1)
        source = source.view(batch, 1, prompt_len, 1).expand(batch, kv_heads, prompt_len, head_dim)
        keep = real.view(batch, 1, prompt_len, 1)
        keys = torch.where(keep, key.gather(2, source), torch.zeros((), dtype=key.dtype, device=self.device))
        values = torch.where(keep, value.gather(2, source), torch.zeros((), dtype=value.dtype, device=self.device))

        score_window = min(self.config.window, prompt_len) if self._scored else 0
        out, _, window_scores = prefill_attention(
            query, keys, values, scale=scale, causal=True,
            kv_lens=None if valid_lengths is None else lengths, score_window=score_window,
        )

        if compress:
            slots = (batch, kv_heads, prompt_len)
            dest_keys, dest_values = torch.zeros_like(keys), torch.zeros_like(values)
            dest_scores = torch.zeros(slots, dtype=torch.float32, device=self.device)
            dest_magnitudes = torch.zeros(slots, dtype=torch.float32, device=self.device)
            dest_positions = torch.full(slots, -1, dtype=torch.int32, device=self.device)
            dest_lengths = torch.zeros((batch,), dtype=torch.int32, device=self.device)
            dest_next = torch.zeros((batch,), dtype=torch.int32, device=self.device)
        else:
            dest_keys, dest_values, dest_scores = self.keys, self.values, self.scores
            dest_magnitudes, dest_positions = self.magnitudes, self.positions
            dest_lengths, dest_next = self.lengths, self.next_positions

        append_(
            dest_keys, dest_values, dest_magnitudes, dest_positions, dest_lengths, dest_next,
            keys, values, value_stat=self.config.value_stat,
        )
        # The append stored all T slots; un-store the padding (slots >= lengths[b]).
        stored = dest_positions[:, :, :prompt_len]
        pad_slots = ~real.view(batch, 1, prompt_len)
        stored.masked_fill_(pad_slots, -1)
        dest_magnitudes[:, :, :prompt_len].masked_fill_(pad_slots, 0.0)
        dest_lengths.copy_(lengths)
        dest_next.copy_(lengths)
        if window_scores is not None:
            dest_scores[:, :, :prompt_len].copy_(window_scores.masked_fill(pad_slots, 0.0))

        if compress:
            config = self.config
            importance = policy_importance(
                config, dest_keys, dest_values, dest_scores, dest_magnitudes, dest_positions, dest_lengths,
                eviction_index=self.n_evictions,
            )
            evict_(
                dest_keys, dest_values, dest_scores, dest_magnitudes, dest_positions, dest_lengths, importance,
                **self._eviction_arguments(), trigger_length=self.capacity,
            )
            self.n_evictions += 1
            capacity = self.capacity
            self.keys.copy_(dest_keys[:, :, :capacity])
            self.values.copy_(dest_values[:, :, :capacity])
            self.scores.copy_(dest_scores[:, :, :capacity])
            self.magnitudes.copy_(dest_magnitudes[:, :, :capacity])
            self.positions.copy_(dest_positions[:, :, :capacity])
            self.lengths.copy_(dest_lengths)
            self.next_positions.copy_(dest_next)
            # Compressed rows hold `budget`; ragged rows that were not compressed may hold up to C.
            self.length_bound = config.budget if valid_lengths is None else capacity
        else:
            self.length_bound = prompt_len
        if self.length_bound == self.capacity and self.config.evicts:
            self.evict()
        return out

    # ----------------------------------------------------------------------------- decode

    def decode_step(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, scale: float) -> torch.Tensor:
        """Append one token per sequence and attend over the cache; device-only, trace-safe.

        A sequence already at capacity is not appended to (the kernel skips it). Accumulates
        attention importance into `scores` for attention-scored policies. Does not touch
        `length_bound`, reads nothing back to the host, allocates no cache-sized tensor, and
        compiles under `torch.compile(fullgraph=True)`.

        Args:
            query: `[B, Hq, 1, D]`; key, value: `[B, Hkv, 1, D]` (after RoPE).

        Returns:
            `[B, Hq, 1, D]`.
        """
        append_(
            self.keys, self.values, self.magnitudes, self.positions, self.lengths, self.next_positions,
            key, value, value_stat=self.config.value_stat,
        )
        scores = None
        if self._scored:
            if self.config.policy == "tova":
                self.scores.zero_()
            scores = self.scores
        # The registered op itself: the public wrapper's value checks would read lengths on the host.
        return torch.ops.vase_triton.decode_attention(
            query, self.keys, self.values, self.lengths, scale, scores, *self._decode_workspace
        )

    def decode(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, scale: float) -> torch.Tensor:
        """Eager decode: validate, `decode_step`, advance `length_bound`, evict when full.

        Args:
            query: `[B, Hq, 1, D]`; key, value: `[B, Hkv, 1, D]` (after RoPE).

        Returns:
            `[B, Hq, 1, D]`.
        """
        new_len = self._check_inputs(query, key, value, scale)
        if new_len != 1:
            raise ValueError(f"key: expected one new token per sequence, shape [B, Hkv, 1, D]; got T={new_len}")
        if self.length_bound >= self.capacity:
            raise ValueError(
                f"key: cannot append past capacity = {self.capacity} without eviction (policy "
                f"{self.config.policy!r} never evicts); the layer may already hold {self.length_bound} tokens"
            )
        self._prepare_decode_workspace(query.shape[1])
        out = self.decode_step(query, key, value, scale=scale)
        self.length_bound += 1
        if self.length_bound == self.capacity and self.config.evicts:
            self.evict()
        return out

    # ----------------------------------------------------------------------------- eviction

    def _eviction_arguments(self) -> dict:
        config = self.config
        return dict(
            budget=config.budget,
            window=config.window,
            n_sink=config.n_sink,
            n_protect=config.resolved_n_protect,
            temperature=float(config.temperature) if config.stochastic else 0.0,
            seed=config.seed,
            eviction_index=self.n_evictions,
            keep_scores=config.policy == "h2o",
        )

    def evict(self) -> None:
        """Shrink every sequence longer than `budget` to `budget` tokens, in place (eager).

        Sequences at or below `budget` are untouched; the choice is made on device from
        `lengths`. With equal lengths this evicts exactly the sequences at capacity.
        """
        if not self.config.evicts:
            raise ValueError("policy: expected an evicting policy; 'full' never evicts")
        importance = policy_importance(
            self.config, self.keys, self.values, self.scores, self.magnitudes, self.positions, self.lengths,
            eviction_index=self.n_evictions,
        )
        evict_(
            self.keys, self.values, self.scores, self.magnitudes, self.positions, self.lengths, importance,
            **self._eviction_arguments(), trigger_length=self.config.budget + 1,
        )
        self.n_evictions += 1
        self.length_bound = min(self.length_bound, self.config.budget)

    # ----------------------------------------------------------------------------- state

    def reset(self) -> None:
        """Empty the layer without reallocating any buffer."""
        self.keys.zero_()
        self.values.zero_()
        self.scores.zero_()
        self.magnitudes.zero_()
        self.positions.fill_(-1)
        self.lengths.zero_()
        self.next_positions.zero_()
        self.length_bound = 0
        self.n_evictions = 0

    def buffers(self) -> tuple[torch.Tensor, ...]:
        """Every static buffer of the layer."""
        return (
            self.keys, self.values, self.scores, self.magnitudes, self.positions, self.lengths, self.next_positions,
        )

    @property
    def memory_bytes(self) -> int:
        """Bytes held by all buffers."""
        return sum(buffer.numel() * buffer.element_size() for buffer in self.buffers())
