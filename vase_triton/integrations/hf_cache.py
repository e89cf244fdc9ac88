"""`VaSECache`: a `transformers.Cache` holding one static `VaSECacheLayer` per decoder layer.

The transformers side only sees a cache whose `update` hands the new key/value
states back unchanged: attention itself runs in `VaSECache.attend`, called from
the registered `vase` attention function, which reads and writes the static
buffers. Host-side bookkeeping (tokens seen, when to evict) happens in
`begin_step`, which the patched model forward calls eagerly before every step,
outside any compiled region, so the compiled decode step itself touches no
Python state.
"""

from __future__ import annotations

from typing import Optional

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from vase_triton.cache import VaSECacheLayer
from vase_triton.config import VaSEConfig
from vase_triton.validation import host_checks_allowed


class UnsupportedCacheOperation(NotImplementedError):
    """A transformers cache operation that an evicting cache refuses by design (beam reordering, cropping)."""


class _PassThroughLayer(CacheLayerMixin):
    """transformers-facing layer: returns new states unchanged; the data lives in a `VaSECacheLayer`."""

    is_compileable = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, owner: "VaSECache", store: VaSECacheLayer):
        super().__init__()
        self.owner = owner
        self.store = store
        self.keys = store.keys
        self.values = store.values
        self.is_initialized = True

    @property
    def batch_size(self) -> int:
        return self.store.batch_size

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> None:
        return None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        return key_states, value_states

    def get_seq_length(self, *args, **kwargs) -> int:
        return self.owner.seen_tokens

    def get_max_length(self) -> int:
        """No maximum: evictions keep the token count unbounded at a fixed capacity."""
        return -1

    def get_mask_sizes(self, *args, **kwargs) -> tuple[int, int]:
        query_length = args[0] if args else kwargs.get("query_length", kwargs.get("cache_position"))
        if isinstance(query_length, torch.Tensor):
            query_length = query_length.shape[0]
        return self.owner.seen_tokens + int(query_length or 0), 0

    def reset(self) -> None:
        self.store.reset()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise UnsupportedCacheOperation(
            "VaSECache does not support beam search (each row evicts different tokens); use num_beams=1"
        )

    def crop(self, *args, **kwargs) -> None:
        raise UnsupportedCacheOperation("VaSECache cannot be cropped: evicted tokens are gone")


class VaSECache(Cache):
    """Static VaSE KV cache for a whole decoder: one `VaSECacheLayer` per layer.

    Args:
        config: eviction policy and sizes.
        num_layers, batch_size, num_kv_heads, head_dim: model and batch geometry.
        dtype, device: of the key/value buffers (the model's).
        max_length: total tokens (prompt + new) the `full` policy must hold; ignored otherwise.

    Every buffer is allocated here, once: keys/values `[B, Hkv, C, D]` per layer with
    `C = budget + window` (or `max_length` for `full`).
    """

    def __init__(
        self,
        config: VaSEConfig,
        *,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device,
        max_length: Optional[int] = None,
        num_query_heads: Optional[int] = None,
    ):
        if not isinstance(config, VaSEConfig):
            raise TypeError(f"config: expected a VaSEConfig; got {type(config).__name__}")
        if not config.evicts and max_length is None:
            raise ValueError(
                f"max_length: the {config.policy!r} policy never evicts, so its capacity (prompt + new tokens) is required"
            )
        for name, value in (("num_layers", num_layers), ("batch_size", batch_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected a positive int; got {value!r}")
        capacity = max_length if not config.evicts else None
        self.vase_config = config
        first = VaSECacheLayer(
            config, batch_size=batch_size, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
            device=device, capacity=capacity, layer_idx=0, num_query_heads=num_query_heads,
        )
        # Layers run one after another: the first layer's decode workspace serves them all.
        shared = first._workspace if num_query_heads is not None else None
        self.stores = [first] + [
            VaSECacheLayer(
                config, batch_size=batch_size, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
                device=device, capacity=capacity, layer_idx=index, num_query_heads=num_query_heads,
                workspace=shared,
            )
            for index in range(1, num_layers)
        ]
        super().__init__(layers=[_PassThroughLayer(self, store) for store in self.stores])
        self.seen_tokens = 0
        self.in_prefill = False
        self.prefill_valid_lengths: Optional[torch.Tensor] = None

    @classmethod
    def for_model(
        cls, model, config: VaSEConfig, *, batch_size: int, max_length: Optional[int] = None
    ) -> "VaSECache":
        """A cache sized for `model` (a transformers causal LM) and `batch_size` sequences."""
        text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
        num_kv_heads = getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
        return cls(
            config,
            num_layers=text_config.num_hidden_layers,
            batch_size=batch_size,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=model.dtype,
            device=model.device,
            max_length=max_length,
            num_query_heads=text_config.num_attention_heads,
        )

    @property
    def capacity(self) -> int:
        """Slots per (sequence, KV head) in every layer."""
        return self.stores[0].capacity

    @property
    def n_evictions(self) -> int:
        """Evictions performed per layer so far."""
        return self.stores[0].n_evictions

    @property
    def memory_bytes(self) -> int:
        """Bytes of every buffer the cache owns: all layers' buffers and the shared decode workspace."""
        return sum(store.memory_bytes for store in self.stores)

    def begin_step(self, num_new_tokens: int, attention_mask: Optional[torch.Tensor] = None) -> None:
        """Host-side bookkeeping before a forward pass that adds `num_new_tokens` tokens per row.

        On the first step (prefill) reads the per-row real lengths from a left-padded
        2D `attention_mask` `[B, T]`. On later steps (one token each) evicts every layer
        whose cache is full, before the step appends. Reads nothing back from the device
        during decode. `end_step` must follow the forward pass.
        """
        self.in_prefill = self.seen_tokens == 0
        if self.in_prefill:
            self.prefill_valid_lengths = self._valid_lengths(num_new_tokens, attention_mask)
            return
        if num_new_tokens != 1:
            raise ValueError(
                f"input_ids: a VaSECache that already holds a sequence accepts one new token per step; "
                f"got {num_new_tokens} (to start a new generation, pass a new cache or call cache.reset())"
            )
        for store in self.stores:
            if store.length_bound >= store.capacity and not store.config.evicts:
                raise ValueError(
                    f"max_length: the {store.config.policy!r} cache holds {store.capacity} tokens and is full; "
                    "create it with a larger max_length"
                )
            store.prepare_decode_step()

    def end_step(self, num_new_tokens: int) -> None:
        """Count the tokens of the forward pass that `begin_step` opened."""
        self.seen_tokens += num_new_tokens
        self.in_prefill = False

    def _valid_lengths(self, num_tokens: int, attention_mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if attention_mask is None or attention_mask.dim() != 2:
            return None
        if tuple(attention_mask.shape) != (self.batch_size, num_tokens):
            raise ValueError(
                f"attention_mask: expected shape [B, T] = [{self.batch_size}, {num_tokens}]; "
                f"got {list(attention_mask.shape)}"
            )
        mask = attention_mask.to(torch.bool)
        if host_checks_allowed(mask) and num_tokens > 1 and bool((mask[:, 1:] < mask[:, :-1]).any()):
            raise ValueError(
                "attention_mask: expected left padding (zeros only before the first real token of each row); "
                "got padding after real tokens (set tokenizer.padding_side = 'left')"
            )
        return mask.sum(dim=-1).to(torch.int32)

    def attend(
        self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """Attention of one layer over its static cache, storing the new tokens.

        Args:
            query: `[B, Hq, T, D]`; key, value: `[B, Hkv, T, D]` (after RoPE).

        Returns:
            `[B, Hq, T, D]`.
        """
        store = self.stores[layer_idx]
        if self.in_prefill:
            return store.prefill(query, key, value, scale=scale, valid_lengths=self.prefill_valid_lengths)
        return store.decode_step(query, key, value, scale=scale)

    def reset(self) -> None:
        """Empty every layer without reallocating, ready for a new generation."""
        super().reset()
        self.seen_tokens = 0
        self.in_prefill = False
        self.prefill_valid_lengths = None
