"""`VaSECache`: a `transformers.Cache` holding one static `VaSECacheLayer` per decoder layer.

The transformers side only sees a cache whose `update` hands the new key/value
states back unchanged: attention itself runs in `VaSECache.attend`, called from
the registered `vase` attention function, which reads and writes the static
buffers. Host-side bookkeeping (tokens seen, when to evict) happens in
`begin_step`, which the patched model forward calls eagerly before every step,
outside any compiled region, so the compiled decode step itself touches no
Python state. A step of one token per row is a decode step; any other step (a prompt,
a new chat turn on a filled cache) extends the cache in chunks.

Each layer's buffers live on the device that runs that decoder layer (models split
over GPUs with `device_map`), and are sized for the KV heads that device holds
(tensor parallelism shards heads; per-head eviction needs no communication).
"""

from __future__ import annotations

import copy
import weakref
from typing import NamedTuple, Optional, Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from vase_triton.cache import PrefillScratch, VaSECacheLayer, mark_static, shared_padding
from vase_triton.config import VaSEConfig
from vase_triton.eviction_graph import EvictionGraph, unsupported_reason
from vase_triton.ops.attention import decode_workspace
from vase_triton.validation import host_checks_allowed


class UnsupportedCacheOperation(NotImplementedError):
    """A transformers cache operation that an evicting cache refuses by design (beam reordering, cropping,
    repeating or selecting rows)."""


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
        if not self.owner.in_step:
            raise RuntimeError(
                "cache: a VaSECache was handed to a model that vase_triton has not patched (its attention would "
                "ignore the cache); patch the top-level model with vase_triton.patch_qwen3(model) (or patch_qwen2 / "
                "patch_llama) and call it, not its inner model.model"
            )
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

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise UnsupportedCacheOperation(
            "VaSECache cannot repeat its rows (its buffers are sized for one batch): make the cache for the "
            "repeated batch, or let generate expand the prompts (num_return_sequences)"
        )

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise UnsupportedCacheOperation(
            "VaSECache cannot select rows (its buffers are sized for one batch): make a cache for the rows kept"
        )



def _local_rows(weight: torch.Tensor) -> int:
    """Output rows of a projection weight held by this process (a tensor-parallel shard's, if sharded)."""
    local = weight.to_local() if hasattr(weight, "to_local") else weight
    return local.shape[0]


def _execution_device(module: torch.nn.Module) -> torch.device:
    """Where `module` runs: an accelerate hook's execution device, else its first parameter's device."""
    for candidate in (module, *module.children()):
        hook_device = getattr(getattr(candidate, "_hf_hook", None), "execution_device", None)
        if hook_device is not None:
            return torch.device(f"cuda:{hook_device}" if isinstance(hook_device, int) else hook_device)
    parameter = next(module.parameters(), None)
    if parameter is None:
        raise ValueError(f"model: decoder layer {type(module).__name__} has no parameters to place its cache by")
    return parameter.device


def decoder_layers(model) -> Sequence[torch.nn.Module]:
    """The decoder layers of a transformers causal LM (`model.model.layers`)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise TypeError(f"model: expected a causal LM with decoder layers at model.model.layers; got {type(model).__name__}")
    return layers


class _Layout(NamedTuple):
    """What a `VaSECache`'s buffers were built for (`device`: one per layer)."""

    config: VaSEConfig
    num_layers: int
    batch_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: tuple
    capacity: int
    num_query_heads: Optional[int]
    kv_head_offset: int = 0

    @classmethod
    def of(cls, config: VaSEConfig, *, device: Sequence, max_length: Optional[int], **sizes) -> "_Layout":
        """The layout of `VaSECache(config, device=..., max_length=..., **sizes)`, one device per layer."""
        capacity = config.capacity if config.evicts else max_length
        return cls(config, device=tuple(torch.device(d) for d in device), capacity=capacity, **sizes)


def _first_kv_head(local_heads: int, total_heads: int) -> int:
    """The model's index of the first KV head this process holds.

    0 unless the heads are split over a tensor-parallel group, whose ranks are taken to be
    consecutive, as in transformers' `tp_plan` meshes.
    """
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if local_heads >= total_heads or not distributed:
        return 0
    return torch.distributed.get_rank() % (total_heads // local_heads) * local_heads


def _model_geometry(model) -> dict:
    """The `VaSECache` arguments `model` decides: layers, heads held here, head dim, dtype, per-layer devices."""
    layers = decoder_layers(model)
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    attention = layers[0].self_attn
    kv_heads = _local_rows(attention.k_proj.weight) // head_dim
    total_kv_heads = getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
    return dict(
        num_layers=len(layers),
        num_kv_heads=kv_heads,
        kv_head_offset=_first_kv_head(kv_heads, total_kv_heads),
        head_dim=head_dim,
        dtype=model.dtype,
        device=[_execution_device(layer) for layer in layers],
        num_query_heads=_local_rows(attention.q_proj.weight) // head_dim,
    )


class VaSECache(Cache):
    """Static VaSE KV cache for a whole decoder: one `VaSECacheLayer` per layer.

    Args:
        config: eviction policy and sizes.
        num_layers, batch_size, num_kv_heads, head_dim: model and batch geometry (KV heads
            held by this process).
        dtype, device: of the key/value buffers; `device` may be one device or one per layer.
        max_length: total tokens (prompt + new) a policy that never evicts must hold; ignored otherwise.
        num_query_heads: query heads held by this process (sizes the decode workspaces and
            the query rings here); None: each layer sizes its own at its first step.
        kv_head_offset: the model's index of the first KV head held here (a tensor-parallel
            rank's); it keys the eviction draws, so that ranks draw independently.

    Every buffer is allocated here, once: keys/values `[B, Hkv, C, D]` per layer with
    `C = budget + window` (or `max_length`), and, given `num_query_heads`, one decode workspace
    per device and the query rings (without it, each layer allocates its own workspace and ring
    at its first step). The prefill scratch (at most `C + prefill_chunk_size` slots per row,
    one per device) is held only from the first chunk that overflows a layer until decoding
    starts.
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
        kv_head_offset: int = 0,
    ):
        if not isinstance(config, VaSEConfig):
            raise TypeError(f"config: expected a VaSEConfig; got {type(config).__name__}")
        if not config.evicts and max_length is None:
            raise ValueError(
                f"max_length: the {config.policy!r} policy never evicts, so its capacity (prompt + new tokens) is required"
            )
        sizes = [("num_layers", num_layers, ""), ("batch_size", batch_size, "")]
        if not config.evicts:
            sizes.append(("max_length", max_length, " (prompt + new tokens)"))
        for name, value, meaning in sizes:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected a positive int{meaning}; got {value!r}")
        devices = list(device) if isinstance(device, (list, tuple)) else [device] * num_layers
        if len(devices) != num_layers:
            raise ValueError(f"device: expected one device or {num_layers} (one per layer); got {len(devices)}")
        self.vase_config = config
        # What the buffers were built for: equal layouts can share one cache (see `fits`).
        self.layout = _Layout.of(
            config, num_layers=num_layers, batch_size=batch_size, num_kv_heads=num_kv_heads, head_dim=head_dim,
            dtype=dtype, device=devices, max_length=max_length, num_query_heads=num_query_heads,
            kv_head_offset=kv_head_offset,
        )  # fmt: skip
        self._scratch = PrefillScratch()
        self._workspaces: dict[torch.device, tuple[torch.Tensor, ...]] = {}
        emits = config.policy_spec.decode_emits_scores(config.score_mode)
        slots = self.layout.capacity
        self.stores = []
        for index, layer_device in enumerate(devices):
            layer_device = torch.device(layer_device)
            if num_query_heads is not None and layer_device not in self._workspaces:
                shape_only = torch.empty((), dtype=dtype, device=layer_device).expand(
                    batch_size, num_kv_heads, slots, head_dim
                )
                self._workspaces[layer_device] = decode_workspace(num_query_heads, shape_only, dtype, emit_scores=emits)
                mark_static(self._workspaces[layer_device])
            self.stores.append(
                VaSECacheLayer(
                    config, batch_size=batch_size, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
                    device=layer_device, capacity=slots, layer_idx=index, num_query_heads=num_query_heads,
                    workspace=self._workspaces.get(layer_device), scratch=self._scratch, kv_head_offset=kv_head_offset,
                )
            )
        super().__init__(layers=[_PassThroughLayer(self, store) for store in self.stores])
        self.seen_tokens = 0
        self.decode_steps = 0  # decode steps run since the cache was made or reset
        self.in_step = False
        # Whether the open step adds one token per row to a cache that holds tokens (set by
        # begin_step: traced code reads this flag, never the token counts).
        self.is_decode_step = False
        self.step_valid_lengths: Optional[torch.Tensor] = None
        # Whether a row holds no token yet (all of its input so far was padding): its next token
        # may be padding too, so a one-token step then reads its mask instead of decoding.
        self._empty_rows = False
        self._mask_placeholders: dict[torch.device, torch.Tensor] = {}
        self.eviction_graph: Optional[EvictionGraph] = None  # made at the first graph-replayed eviction
        self._checked_model: Optional[weakref.ref] = None  # a weak reference: a cache does not keep its model alive
        # Layers that began to store the open step's tokens, counted when the step runs eagerly:
        # a decode step refused before the first one began is taken back whole (`abort_step`).
        self._layers_storing = 0
        # Why the layers disagree on what they hold (a step failed after some of them stored), or None.
        self._broken: Optional[str] = None

    def __deepcopy__(self, memo: dict) -> "VaSECache":
        """A cache with buffers of its own holding the same tokens (a prefilled prompt reused by
        several generations, as with transformers' caches). The copy records its own eviction
        graph when it first needs one: a recorded graph writes the original's buffers."""
        copied = object.__new__(type(self))
        memo[id(self)] = copied
        for name, value in self.__dict__.items():
            setattr(copied, name, None if name == "eviction_graph" else copy.deepcopy(value, memo))
        return copied

    @classmethod
    def for_model(
        cls, model, config: VaSEConfig, *, batch_size: int, max_length: Optional[int] = None
    ) -> "VaSECache":
        """A cache sized for `model` (a transformers causal LM) and `batch_size` sequences.

        Each layer's buffers go where its decoder layer runs (`device_map`, accelerate hooks)
        and hold the KV heads its attention projections produce in this process.
        """
        return cls(config, batch_size=batch_size, max_length=max_length, **_model_geometry(model))

    def fits(self, model, config: VaSEConfig, *, batch_size: int, max_length: Optional[int] = None) -> bool:
        """Whether `for_model(model, config, ...)` would build buffers like this cache's, so that this
        cache, `reset()`, can serve instead (keeping its buffers' addresses, and so the CUDA graphs
        recorded over them)."""
        wanted = _Layout.of(config, batch_size=batch_size, max_length=max_length, **_model_geometry(model))
        same_policy = self.stores[0].policy is config.policy_spec  # one config for all layers
        return wanted == self.layout and same_policy and not self._locked_in_inference_tensors(every_buffer=True)

    def _locked_in_inference_tensors(self, *, every_buffer: bool) -> bool:
        """Whether buffers were made under `torch.inference_mode()`, which is off now: PyTorch then
        refuses to write them. `every_buffer`: all of them, those made lazily (query ring, decode
        workspace, prefill scratch) included; else the keys of the first layer only (a per-step check)."""
        if torch.is_inference_mode_enabled() or not self.stores:
            return False
        if not every_buffer:
            return self.stores[0].keys.is_inference()
        return any(buffer.is_inference() for store in self.stores for buffer in store.buffers())

    def check_model(self, model) -> None:
        """Raise unless the buffers were made for `model`'s layer count, KV heads, head dim and
        query heads (once they are known: a cache made without them sizes them at its first step).

        The dtype is left to the ops, which refuse keys of another dtype than the cache's: a
        model run under autocast computes its keys in another dtype than its weights'.
        """
        geometry = _model_geometry(model)
        made_for = self.layout._asdict() | {"num_query_heads": self.stores[0].num_query_heads}
        for name in ("num_layers", "num_kv_heads", "head_dim", "num_query_heads"):
            if made_for[name] is not None and made_for[name] != geometry[name]:
                raise ValueError(
                    f"cache: made for {name}={made_for[name]}, the model has {name}={geometry[name]}; make the "
                    "cache for this model with VaSECache.for_model(model, config, batch_size=...)"
                )
        self._checked_model = weakref.ref(model)

    def checked_for(self, model) -> bool:
        """Whether the last `check_model` accepted `model` (so that decode steps need not walk its layers again)."""
        return self._checked_model is not None and self._checked_model() is model

    @classmethod
    def reuse_or_make(
        cls, previous: Optional["VaSECache"], model, config: VaSEConfig, *, batch_size: int,
        max_length: Optional[int] = None,
    ) -> "VaSECache":
        """`previous`, reset, when it `fits` this call and no step of it is open; else `for_model(...)`."""
        size = dict(batch_size=batch_size, max_length=max_length)
        if previous is not None and not previous.in_step and previous.fits(model, config, **size):
            previous.reset()
            return previous
        return cls.for_model(model, config, **size)

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
        """Bytes of every buffer the cache owns: the layers', the decode workspaces and the prefill scratch."""
        shared = [t for workspace in self._workspaces.values() for t in workspace] + list(self._scratch.buffers())
        return sum(store.memory_bytes for store in self.stores) + sum(t.numel() * t.element_size() for t in shared)

    def begin_step(
        self, num_new_tokens: int, attention_mask: Optional[torch.Tensor] = None, *, graph_evictions: bool = False
    ) -> None:
        """Host-side bookkeeping before a forward pass that adds `num_new_tokens` tokens per row.

        A step of one token on a cache whose every row holds tokens is a decode step: layers
        that are full evict now, and nothing is read back from the device (its mask is not
        read: a one-token turn may not pad a row). With `graph_evictions`
        (decode steps under CUDA graphs) the evictions of all layers, when they fall on one
        CUDA device, are replayed from one CUDA graph (`vase_triton.eviction_graph`). Any
        other step extends the cache; a 2D `attention_mask` (`[B, seen + T]` or `[B, T]`) gives
        each row's real new tokens, which must be left-padded: padding may only precede a
        row's first token. `end_step` (or `abort_step`) must follow the forward pass.
        """
        if not isinstance(num_new_tokens, int) or num_new_tokens < 1:
            conversation = (
                f" (the cache holds a conversation of {self.seen_tokens} tokens: given to generate, input_ids holds "
                "the whole conversation, its earlier turns included, then the new tokens)"
                if self.seen_tokens else ""
            )
            raise ValueError(
                f"input_ids: expected at least one new token per row; got {num_new_tokens!r}{conversation}"
            )
        self.check_usable()
        self.check_mask_layout(num_new_tokens, attention_mask)
        self.step_valid_lengths = None
        self._layers_storing = 0
        self.is_decode_step = num_new_tokens == 1 and self.seen_tokens > 0 and not self._empty_rows
        if self.is_decode_step:
            self._scratch.release()
            for store in self.stores:
                if store.length_bound >= store.capacity and not store.config.evicts:
                    raise ValueError(
                        f"max_length: the {store.config.policy!r} cache holds {store.capacity} tokens and is full; "
                        "create it with a larger max_length"
                    )
            try:
                if graph_evictions and all(store.length_bound >= store.capacity for store in self.stores):
                    graph = self._eviction_graph()
                    if graph is not None:
                        graph.run()
                for store in self.stores:
                    store.prepare_decode_step()
            except BaseException:
                self.refuse_until_reset("an eviction before a decode step failed partway")
                raise
        else:
            self.step_valid_lengths = self._valid_lengths(num_new_tokens, attention_mask)
        self.in_step = True

    def end_step(self, num_new_tokens: int) -> None:
        """Count the tokens (and the decode step) of the forward pass that `begin_step` opened."""
        # A masked step while a row may still be empty: is one still? A row that holds tokens holds
        # them until `reset()` (an eviction keeps `budget`), so later steps read nothing here.
        if self.step_valid_lengths is not None and (self.seen_tokens == 0 or self._empty_rows):
            lengths = self.stores[0].tensors.lengths
            self._empty_rows = host_checks_allowed(lengths) and bool((lengths == 0).any())
        self.seen_tokens += num_new_tokens
        self.decode_steps += self.is_decode_step
        self._close_step()

    def abort_step(self, *, ran_eagerly: bool = True) -> None:
        """Close the open step without counting its tokens (its forward pass raised).

        A decode step that ran eagerly and was refused before any layer began to store its
        token is taken back whole: the layers' counts return to where they were, so the next
        step runs as this one would have (an eviction that fell due here has run; it is the one
        the next step would run). A step that failed after a layer began to store, or a compiled
        step (whose progress the host does not see), leaves the cache refused until `reset()`.
        """
        if self.in_step and self.is_decode_step and ran_eagerly and self._layers_storing == 0:
            for store in self.stores:
                store.cancel_decode_step()
        elif self.in_step and ran_eagerly and self._layers_storing > 0:
            self.refuse_until_reset(
                f"a forward pass failed after {self._layers_storing} of {len(self.stores)} layers began to store its "
                "tokens"
            )
        elif self.in_step and not ran_eagerly:
            self.refuse_until_reset("a compiled decode step failed, and which layers stored its token is not known")
        self._close_step()

    def refuse_until_reset(self, reason: str) -> None:
        """Refuse every later use of the cache until `reset()`: `reason` says how its layers came to
        disagree on what they hold (the first reason given is kept)."""
        if self._broken is None:
            self._broken = reason

    def _close_step(self) -> None:
        self.in_step = False
        self.step_valid_lengths = None
        self._layers_storing = 0

    def _eviction_graph(self) -> Optional[EvictionGraph]:
        """The cache's `EvictionGraph`, or None when its layers cannot replay evictions from one graph."""
        if self.eviction_graph is None and unsupported_reason(self.stores) is None:
            self.eviction_graph = EvictionGraph(self.stores)
        return self.eviction_graph

    def mask_placeholder(self, device) -> torch.Tensor:
        """A constant `[1, 1, 1, 1]` mask passed to transformers instead of the 2D one (the cache tracks padding)."""
        device = torch.device(device)
        if device not in self._mask_placeholders:
            self._mask_placeholders[device] = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)
        return self._mask_placeholders[device]

    def check_usable(self) -> None:
        """Refuse a cache whose layers disagree on what they hold (a step failed after some of them stored),
        that was built for a policy replaced since, or whose first layer's keys only inference mode may write."""
        if self._broken is not None:
            raise RuntimeError(f"cache: {self._broken}, so its layers disagree; call cache.reset() or make a new cache")
        self.check_writable(every_buffer=False)
        if self.stores:
            self.stores[0].check_policy()  # the layers share one config

    def check_writable(self, *, every_buffer: bool = True) -> None:
        """Refuse a cache whose buffers only inference mode may write, outside it (`every_buffer`: also
        those made after the cache, as a step that is not a decode step checks; else one, per step)."""
        if self._locked_in_inference_tensors(every_buffer=every_buffer):
            raise RuntimeError(
                "cache: used under torch.inference_mode(), whose tensors PyTorch lets no code outside it write; "
                "run this call under torch.inference_mode() too, or make and use the cache outside it "
                "(torch.no_grad() is enough for generation)"
            )

    def check_mask_layout(self, num_tokens: int, attention_mask: object) -> None:
        """A mask must be 2D `[B, T]` or `[B, seen + T]`: the cache reads padding from it and masks itself."""
        if attention_mask is None:
            return
        batch, seen = self.stores[0].batch_size, self.seen_tokens
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
            given = list(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask)
            raise ValueError(
                f"attention_mask: expected a 2D padding mask [B, T] = [{batch}, {num_tokens}] or [B, seen + T] = "
                f"[{batch}, {seen + num_tokens}] with a VaSECache (it builds the causal mask itself); got {given}"
            )
        if attention_mask.shape[0] != batch or attention_mask.shape[1] not in (num_tokens, seen + num_tokens):
            raise ValueError(
                f"attention_mask: expected shape [B, T] = [{batch}, {num_tokens}] or [B, seen + T] = "
                f"[{batch}, {seen + num_tokens}]; got {list(attention_mask.shape)}"
            )

    def check_prompt_mask(self, num_tokens: int, attention_mask: object) -> int:
        """`check_mask_layout` and the padding rules of `begin_step` on a whole prompt's mask (`[B, T]` or
        `[B, seen + T]`), so that a prompt stored in chunks is refused before its first chunk is stored.

        Returns the prompt's leading columns that pad every row (each layer leaves them out)."""
        self.check_mask_layout(num_tokens, attention_mask)
        return shared_padding(self._valid_lengths(num_tokens, attention_mask), num_tokens)

    def _valid_lengths(self, num_tokens: int, attention_mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if attention_mask is None:
            return None
        width = attention_mask.shape[1]
        mask = attention_mask.to(torch.bool)
        if host_checks_allowed(mask) and self.seen_tokens > 0 and width == num_tokens and not bool(mask.all()):
            raise ValueError(
                "attention_mask: a [B, T] mask of a new turn on a filled cache must be all ones (padding may only "
                "precede a row's first token; pass the [B, seen + T] mask to pad rows that are still empty); "
                f"got {int((~mask).sum())} zeros"
            )
        if host_checks_allowed(mask) and width > 1 and bool((mask[:, 1:] < mask[:, :-1]).any()):
            raise ValueError(
                "attention_mask: expected left padding (zeros only before each row's first real token, which also "
                "rules out padding inside a new turn on a filled cache); got padding after real tokens (set "
                "tokenizer.padding_side = 'left', and give every row of a new turn the same length)"
            )
        return mask[:, width - num_tokens :].sum(dim=-1).to(torch.int32)

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
        if self.is_decode_step:
            store.check_inputs(query, key, value, scale)  # shapes and dtypes only: free once traced
            if not torch.compiler.is_compiling():
                self._layers_storing += 1
            return store.decode_step(query, key, value, scale=scale)
        valid = self.step_valid_lengths
        if valid is not None and valid.device != store.device:
            valid = valid.to(store.device)
        store.check_extend(query, key, value, scale=scale, valid_lengths=valid)
        if not torch.compiler.is_compiling():
            self._layers_storing += 1  # counted before it stores: a failure inside may leave it holding part
        return store.extend_checked(query, key, value, scale=scale, valid_lengths=valid)

    def reset(self) -> None:
        """Empty every layer without reallocating, ready for a new generation (the prefill scratch,
        which only a prompt or a new turn holds, is released)."""
        super().reset()
        self._scratch.release()
        self.seen_tokens = 0
        self.decode_steps = 0
        self._empty_rows = False
        self._broken = None
        self._close_step()
