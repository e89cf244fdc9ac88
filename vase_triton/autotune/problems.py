"""Tuning problems: random inputs of one launch shape, a launch per configuration, and its check.

`build_problem(kernel, shape, device, default)` allocates the inputs once. For a
configuration `params`:

- `problem.launcher(params)` returns a function that launches the kernel with `params`;
  its work is the same on every call (buffers a kernel mutates are reset inside it or
  left in a state that costs the same), so it can be timed by repetition;
- `problem.check(params)` runs it on freshly poisoned outputs and compares with the
  PyTorch reference, returning None, or why the configuration is wrong.

Attention and importance (`projected_energy`, `key_similarity`) configurations change
only rounding: a configuration passes when its largest error against the float64
reference (on a sample of rows for long prefills) is at most three times the heuristic
configuration's, plus a small floor, and it wrote every output. Append and eviction
configurations must not change anything: their buffers must be bit-identical to the
reference's, and the eviction's Gumbel selection (philox draws at offset `row * N +
slot`, independent of block sizes) bit-identical to the heuristic's.
"""

from __future__ import annotations

import abc
from typing import Callable, Optional

import torch

from vase_triton import reference
from vase_triton.autotune.shapes import (
    AppendShape,
    DecodeShape,
    EnergyShape,
    EvictShape,
    PrefillShape,
    ScoresShape,
    SimilarityShape,
)
from vase_triton.cache_tensors import CacheTensors
from vase_triton.kernels import (
    cache_append,
    decode_attention,
    eviction,
    key_similarity,
    prefill_attention,
    projected_energy,
)

# Rows per sampled slice and slices per checked sequence of a prefill check.
_SLICE_ROWS = 64
_ERROR_FLOOR = 1e-5
_ERROR_FACTOR = 3.0
_SEED = 0


def _random(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, generator, scale: float = 1.0):
    """Standard normal values drawn on `device` (large inputs are never generated on the host)."""
    return (torch.randn(shape, generator=generator, device=device) * scale).to(dtype)


def _checked_batches(batch: int) -> list[int]:
    """The sequences a check compares: the first and the last."""
    return sorted({0, batch - 1})


def _max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute difference in float64; inf when `actual` holds a NaN or an infinity `expected` lacks."""
    difference = (actual.double() - expected.double()).abs()
    both_inf = torch.isinf(actual.double()) & (actual.double() == expected.double())
    difference = torch.where(both_inf, torch.zeros_like(difference), difference)
    if difference.numel() == 0:
        return 0.0
    if not torch.isfinite(difference).all():
        return float("inf")
    return float(difference.max())


def _bitwise_equal(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Same values, NaN where the other has NaN."""
    if actual.dtype.is_floating_point:
        same = (actual == expected) | (torch.isnan(actual) & torch.isnan(expected))
        return bool(same.all())
    return torch.equal(actual, expected)


class Problem(abc.ABC):
    """Inputs of one launch shape on one device, with `default` the heuristic parameters."""

    def __init__(self, shape: tuple, device: torch.device, default: dict):
        self.shape = shape
        self.device = device
        self.default = default
        self.generator = torch.Generator(device=device).manual_seed(_SEED)

    @abc.abstractmethod
    def launcher(self, params: dict) -> Callable[[], None]:
        """A function launching the kernel with `params` (same work on every call)."""

    @abc.abstractmethod
    def check(self, params: dict) -> Optional[str]:
        """None when `params` gives the reference's result, else the reason it does not."""


class _ToleranceProblem(Problem):
    """Attention: errors against the float64 reference, allowed up to 3x the heuristic's."""

    _baseline: Optional[float] = None

    @abc.abstractmethod
    def error(self, params: dict) -> tuple[float, float]:
        """(largest error against the reference, largest reference magnitude) of one run with `params`."""

    def check(self, params: dict) -> Optional[str]:
        error, magnitude = self.error(params)
        floor = _ERROR_FLOOR * max(1.0, magnitude)
        if self._baseline is None:
            baseline, _ = self.error(self.default) if params != self.default else (error, magnitude)
            self._baseline = baseline if baseline != float("inf") else 0.0
        allowed = _ERROR_FACTOR * self._baseline + floor
        if error <= allowed:
            return None
        return f"max error {error:.3g} against the float64 reference, allowed {allowed:.3g}"


class PrefillForwardProblem(_ToleranceProblem):
    """`[B, Hq, Tq, D]` queries over `[B, Hkv, Tk, D]` keys; checked on up to three row slices of two sequences."""

    shape: PrefillShape

    def __init__(self, shape: PrefillShape, device: torch.device, default: dict):
        super().__init__(shape, device, default)
        dtype = getattr(torch, shape.dtype)
        self.q = _random((shape.batch, shape.q_heads, shape.q_len, shape.head_dim), dtype, device, self.generator)
        kv_shape = (shape.batch, shape.kv_heads, shape.k_len, shape.head_dim)
        self.k = _random(kv_shape, dtype, device, self.generator)
        self.v = _random(kv_shape, dtype, device, self.generator)
        self.out = torch.empty_like(self.q) if shape.values else self.q
        self.lse = torch.empty((shape.batch, shape.q_heads, shape.q_len), dtype=torch.float32, device=device)
        self.scale = shape.head_dim**-0.5
        self._expected = None

    def launcher(self, params: dict) -> Callable[[], None]:
        config = prefill_attention.TileConfig(**params)
        shape = self.shape

        def launch() -> None:
            prefill_attention.launch_forward(
                self.q, self.k, self.v, None, self.out, self.lse, self.scale, shape.causal, shape.values, config
            )

        return launch

    def _slices(self) -> list[tuple[int, int]]:
        q_len = self.shape.q_len
        rows = min(_SLICE_ROWS, q_len)
        middle = (q_len - rows) // 2
        return sorted({(0, rows), (middle, middle + rows), (q_len - rows, q_len)})

    def _reference(self) -> list[tuple[int, int, int, torch.Tensor, torch.Tensor]]:
        """(sequence, first row, end row, out, lse) of every compared slice, in float64."""
        if self._expected is None:
            shape, expected = self.shape, []
            for batch in _checked_batches(shape.batch):
                for start, end in self._slices():
                    # Queries are end-aligned: a causal slice sees the keys before its last position.
                    keys_end = shape.k_len - shape.q_len + end if shape.causal else shape.k_len
                    q = self.q[batch : batch + 1, :, start:end].double()
                    k = self.k[batch : batch + 1, :, :keys_end].double()
                    v = self.v[batch : batch + 1, :, :keys_end].double()
                    out, lse, _ = reference.prefill_attention(q, k, v, scale=self.scale, causal=shape.causal)
                    expected.append((batch, start, end, out[0], lse[0]))
            self._expected = expected
        return self._expected

    def error(self, params: dict) -> tuple[float, float]:
        expected = self._reference()
        if self.shape.values:
            self.out.fill_(float("nan"))
        self.lse.fill_(float("nan"))
        self.launcher(params)()
        if bool(torch.isnan(self.lse).any()) or (self.shape.values and bool(torch.isnan(self.out).any())):
            return float("inf"), 1.0
        error, magnitude = 0.0, 1.0
        for batch, start, end, out, lse in expected:
            error = max(error, _max_error(self.lse[batch, :, start:end], lse))
            if self.shape.values:
                error = max(error, _max_error(self.out[batch, :, start:end], out))
                magnitude = max(magnitude, float(out.abs().max()))
        return error, magnitude


class PrefillScoresProblem(_ToleranceProblem):
    """The window scores of `[B, Hq, W, D]` queries over `[B, Hkv, Tk, D]` keys, given exact log-sum-exps."""

    shape: ScoresShape

    def __init__(self, shape: ScoresShape, device: torch.device, default: dict):
        super().__init__(shape, device, default)
        dtype = getattr(torch, shape.dtype)
        self.q = _random((shape.batch, shape.q_heads, shape.window, shape.head_dim), dtype, device, self.generator)
        self.k = _random((shape.batch, shape.kv_heads, shape.k_len, shape.head_dim), dtype, device, self.generator)
        self.scores = torch.empty((shape.batch, shape.kv_heads, shape.k_len), dtype=torch.float32, device=device)
        self.scale = shape.head_dim**-0.5
        self.lse = torch.empty((shape.batch, shape.q_heads, shape.window), dtype=torch.float32, device=device)
        self.expected = {}
        checked = _checked_batches(shape.batch)
        for batch in range(shape.batch):
            q = self.q[batch : batch + 1].double()
            k = self.k[batch : batch + 1].double()
            _, lse, scores = reference.prefill_attention(
                q, k, k, scale=self.scale, causal=shape.causal, score_window=shape.window
            )
            self.lse[batch] = lse[0].float()
            if batch in checked:
                self.expected[batch] = scores[0]

    def launcher(self, params: dict) -> Callable[[], None]:
        config = prefill_attention.TileConfig(**params)
        shape = self.shape

        def launch() -> None:
            prefill_attention.launch_scores(
                self.q, self.k, self.lse, None, self.scores, self.scale, shape.causal, shape.window, config
            )

        return launch

    def error(self, params: dict) -> tuple[float, float]:
        self.scores.fill_(float("nan"))
        self.launcher(params)()
        if bool(torch.isnan(self.scores).any()):
            return float("inf"), 1.0
        error, magnitude = 0.0, 1.0
        for batch, expected in self.expected.items():
            error = max(error, _max_error(self.scores[batch], expected))
            magnitude = max(magnitude, float(expected.abs().max()))
        return error, magnitude


class DecodeProblem(_ToleranceProblem):
    """One decode step over a `[B, Hkv, C, D]` cache (the last sequence half full), with the reference's output and scores.

    `kernel` is `decode` (params configure the split-K stage; the combine stage uses
    `partner`) or `decode_combine` (params configure the combine stage; the split-K stage
    uses `partner`).
    """

    shape: DecodeShape

    def __init__(self, kernel: str, shape: DecodeShape, device: torch.device, default: dict, partner: dict):
        super().__init__(shape, device, default)
        self.kernel = kernel
        self.partner = partner
        dtype = getattr(torch, shape.dtype)
        self.q = _random((shape.batch, shape.q_heads, 1, shape.head_dim), dtype, device, self.generator, 1.5)
        cache_shape = (shape.batch, shape.kv_heads, shape.capacity, shape.head_dim)
        self.k = _random(cache_shape, dtype, device, self.generator)
        self.v = _random(cache_shape, dtype, device, self.generator)
        lengths = torch.full((shape.batch,), shape.capacity, dtype=torch.int32)
        if shape.batch > 1:
            lengths[-1] = shape.capacity // 2 + 1
        self.lengths = lengths.to(device)
        self.out = torch.empty_like(self.q)
        scores_shape = (shape.batch, shape.kv_heads, shape.capacity)
        self.initial_scores = torch.rand(scores_shape, generator=self.generator, device=device)
        self.scores = self.initial_scores.clone() if shape.scores else None
        self.scale = shape.head_dim**-0.5
        added = torch.zeros((shape.batch, shape.kv_heads, shape.capacity), dtype=torch.float64, device=device)
        self.expected_out = reference.decode_attention(
            self.q.double(), self.k.double(), self.v.double(), self.lengths, scale=self.scale,
            scores=added if shape.scores else None,
        )  # fmt: skip
        self.expected_added = added

    def _configs(self, params: dict) -> tuple[decode_attention.DecodeConfig, decode_attention.CombineConfig]:
        if self.kernel == "decode":
            return decode_attention.DecodeConfig(**params), decode_attention.CombineConfig(**self.partner)
        return decode_attention.DecodeConfig(**self.partner), decode_attention.CombineConfig(**params)

    def launcher(self, params: dict) -> Callable[[], None]:
        config, combine = self._configs(params)
        workspace = decode_attention.decode_workspace(
            self.shape.q_heads, self.k, self.q.dtype, emit_scores=self.shape.scores, config=config
        )

        def launch() -> None:
            decode_attention.decode_attention_triton(
                self.q, self.k, self.v, self.lengths, self.scale, self.scores, out=self.out, workspace=workspace,
                config=config, combine_config=combine,
            )  # fmt: skip

        return launch

    def error(self, params: dict) -> tuple[float, float]:
        self.out.fill_(float("nan"))
        if self.scores is not None:
            self.scores.copy_(self.initial_scores)
        self.launcher(params)()
        error = _max_error(self.out, self.expected_out)
        if self.scores is not None:
            error = max(error, _max_error(self.scores - self.initial_scores, self.expected_added))
        return error, max(1.0, float(self.expected_out.abs().max()))


class AppendProblem(Problem):
    """Append `[B, Hkv, T_new, D]` tokens after 0-15 stored ones; buffers must equal the reference's bit for bit.

    Each timed launch first resets the two `[B]` counters, so every append writes the same slots.
    """

    shape: AppendShape

    def __init__(self, shape: AppendShape, device: torch.device, default: dict):
        super().__init__(shape, device, default)
        dtype = getattr(torch, shape.dtype)
        capacity = shape.new_len + 16
        self.cache = CacheTensors.empty(shape.batch, shape.kv_heads, capacity, shape.head_dim, dtype=dtype, device=device)
        new_shape = (shape.batch, shape.kv_heads, shape.new_len, shape.head_dim)
        self.new_keys = _random(new_shape, dtype, device, self.generator)
        self.new_values = _random(new_shape, dtype, device, self.generator)
        self.lengths = ((torch.arange(shape.batch, dtype=torch.int32) * 5) % 16).to(device)
        self.next_positions = (self.lengths + 100).to(torch.int32)

    def _reset(self) -> None:
        self.cache.lengths.copy_(self.lengths)
        self.cache.next_positions.copy_(self.next_positions)

    def launcher(self, params: dict) -> Callable[[], None]:
        config = cache_append.AppendConfig(**params)

        def launch() -> None:
            self._reset()
            cache_append.cache_append_triton(self.cache, self.new_keys, self.new_values, "range", config=config)

        return launch

    def check(self, params: dict) -> Optional[str]:
        for buffer in (self.cache.keys, self.cache.values, self.cache.magnitudes):
            buffer.fill_(float("nan"))
        self.cache.positions.fill_(-7)
        self._reset()
        expected = CacheTensors(*(buffer.clone() for buffer in self.cache))
        reference.append_(expected, self.new_keys, self.new_values, value_stat="range")
        self.launcher(params)()
        for name, actual, wanted in zip(CacheTensors._fields, self.cache, expected):
            if not _bitwise_equal(actual, wanted):
                return f"cache.{name} differs from the reference append"
        return None


class EvictProblem(Problem):
    """One `vase` eviction of full `[B, Hkv, N, D]` rows to `budget` (window, 4 sinks, budget // 4 protected).

    `kernel`: `evict_select` / `evict_select_tiled` (params configure the selection) or
    `evict_compact` (params configure the compaction; the selection uses the heuristic).
    """

    shape: EvictShape
    TEMPERATURE = 1.0
    EVICTION_SEED = 12345

    def __init__(self, kernel: str, shape: EvictShape, device: torch.device, default: dict):
        super().__init__(shape, device, default)
        self.kernel = kernel
        dtype = getattr(torch, shape.dtype)
        batch, heads, slots = shape.batch, shape.kv_heads, shape.num_slots
        rows = (batch, heads, slots)
        keys = _random(rows + (shape.head_dim,), dtype, device, self.generator)
        values = _random(rows + (shape.head_dim,), dtype, device, self.generator)
        # Magnitudes on a coarse grid, so protection breaks ties. The selection problems give some
        # importance exactly 0; the compaction's has none, so that its top-k evicts slots spread over
        # the row and moves nearly every survivor, as sampled evictions do (ties at 0 would evict
        # the last zeros and leave most of the row in place).
        uniform = dict(generator=self.generator, device=device)
        magnitudes = (torch.rand(rows, **uniform) * 64).round() / 8
        self.importance = torch.rand(rows, **uniform)
        if kernel != "evict_compact":
            self.importance *= torch.rand(rows, **uniform) > 0.05
        positions = (torch.arange(slots, dtype=torch.int32) * 2 + 5).expand(rows).contiguous().to(device)
        lengths = torch.full((batch,), slots, dtype=torch.int32, device=device)
        self.initial = CacheTensors(
            keys, values, torch.rand(rows, **uniform), magnitudes, positions, lengths,
            lengths.clone(),
        )  # fmt: skip
        self.cache = CacheTensors(*(buffer.clone() for buffer in self.initial))
        budget, window = shape.budget, shape.window
        self.selection = dict(
            budget=budget, window=window, n_sink=min(4, budget - window),
            n_protect=min(budget // 4, budget - window), seed=self.EVICTION_SEED,
            eviction_index=torch.zeros(1, dtype=torch.int64, device=device),  # the Gumbel draws' counter
            trigger_length=min(slots, budget + 1), noise=None,
        )  # fmt: skip
        self.sources = torch.empty((batch * heads, budget), dtype=torch.int32, device=device)
        self.flags = torch.empty((batch * heads,), dtype=torch.int8, device=device)
        self._expected_topk = None
        self._expected_sampled = None

    def _select_config(self, params: dict):
        if self.kernel == "evict_select_tiled":
            return eviction.TiledSelectConfig(**params)
        return eviction.SelectConfig(**params)

    def _heuristic_selection(self):
        """The selection launch a compaction is tuned after: the heuristic of the kernel rows of `N` slots take."""
        if eviction.uses_tiled_selection(self.shape.num_slots, self.shape.window):
            return eviction.tiled_select_heuristic(self.shape)
        return eviction.select_heuristic(self.shape)

    def _select(self, config, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        self.sources.fill_(-1)
        self.flags.fill_(-1)
        eviction.select_survivors_(
            self.cache, self.importance, self.sources, self.flags, temperature=temperature, config=config,
            **self.selection,
        )  # fmt: skip
        return self.sources.clone(), self.flags.clone()

    def launcher(self, params: dict) -> Callable[[], None]:
        if self.kernel == "evict_compact":
            config = eviction.CompactConfig(**params)
            self._reset_cache()
            self._select(self._heuristic_selection(), 0.0)
            budget, window = self.shape.budget, self.shape.window

            def launch() -> None:
                eviction.compact_survivors_(
                    self.cache, self.sources, self.flags, budget=budget, window=window, keep_scores=False, config=config
                )

            return launch
        config = self._select_config(params)

        def launch() -> None:
            eviction.select_survivors_(
                self.cache, self.importance, self.sources, self.flags, temperature=self.TEMPERATURE, config=config,
                **self.selection,
            )  # fmt: skip

        return launch

    def _reset_cache(self) -> None:
        for buffer, initial in zip(self.cache, self.initial):
            buffer.copy_(initial)

    def _reference_topk(self) -> CacheTensors:
        """The reference eviction with deterministic (top-k) selection."""
        if self._expected_topk is None:
            expected = CacheTensors(*(buffer.clone() for buffer in self.initial))
            reference.evict_(expected, self.importance, temperature=0.0, keep_scores=False, **self.selection)
            self._expected_topk = expected
        return self._expected_topk

    def check(self, params: dict) -> Optional[str]:
        self._reset_cache()
        expected = self._reference_topk()
        if self.kernel == "evict_compact":
            self._select(self._heuristic_selection(), 0.0)
            self.launcher(params)()
            for name, actual, wanted in zip(CacheTensors._fields, self.cache, expected):
                if not _bitwise_equal(actual, wanted):
                    return f"cache.{name} differs from the reference eviction"
            return None
        keep = expected.positions[:, :, : self.shape.budget]
        sources, flags = self._select(self._select_config(params), 0.0)
        moved = self.initial.positions.gather(2, sources.long().view(keep.shape).clamp(0, self.shape.num_slots - 1))
        if not (bool((flags == 1).all()) and torch.equal(moved, keep)):
            return "top-k survivors differ from the reference selection"
        if self._expected_sampled is None:
            self._expected_sampled = self._select(self._select_config(self.default), self.TEMPERATURE)
        sampled = self._select(self._select_config(params), self.TEMPERATURE)
        if not all(torch.equal(a, b) for a, b in zip(sampled, self._expected_sampled)):
            return "Gumbel-sampled survivors differ from the heuristic configuration's (same philox draws)"
        return None


class _ImportanceProblem(_ToleranceProblem):
    """An eviction importance pass over `[B, Hkv, N, D]` cache rows (the last sequence half full,
    `window` recent slots), against its float64 reference on the first and the last sequence."""

    config_type: type  # the kernel's launch-parameter tuple

    def __init__(self, shape: tuple, device: torch.device, default: dict):
        super().__init__(shape, device, default)
        dtype = getattr(torch, shape.dtype)
        rows = (shape.batch, shape.kv_heads, shape.num_slots, shape.head_dim)
        self.keys = _random(rows, dtype, device, self.generator)
        self.window = min(64, max(1, shape.num_slots // 4))
        self.lengths = torch.full((shape.batch,), shape.num_slots, dtype=torch.int32, device=device)
        self.lengths[-1] = max(self.window, shape.num_slots // 2)
        self.output: Optional[torch.Tensor] = None

    @abc.abstractmethod
    def run(self, config) -> torch.Tensor:
        """The kernel's `[B, Hkv, N]` output with launch parameters `config` (a `config_type`)."""

    @abc.abstractmethod
    def expected(self, batch: int) -> torch.Tensor:
        """The float64 reference output `[Hkv, N]` of sequence `batch`."""

    def launcher(self, params: dict) -> Callable[[], None]:
        config = self.config_type(**params)

        def launch() -> None:
            self.output = self.run(config)

        return launch

    def error(self, params: dict) -> tuple[float, float]:
        self.launcher(params)()
        error, magnitude = 0.0, 1.0
        for batch in _checked_batches(self.shape.batch):
            expected = self.expected(batch)
            error = max(error, _max_error(self.output[batch], expected))
            magnitude = max(magnitude, float(expected.abs().max()))
        return error, magnitude


class EnergyProblem(_ImportanceProblem):
    """`vase-dkv`'s projected energy `||kG||² · ||vG||²` through a `[D, rank]` Gaussian projection per row."""

    shape: EnergyShape
    config_type = projected_energy.EnergyConfig

    def __init__(self, shape: EnergyShape, device: torch.device, default: dict):
        super().__init__(shape, device, default)
        self.values = _random(self.keys.shape, self.keys.dtype, device, self.generator)
        projection_shape = (shape.batch, shape.kv_heads, shape.head_dim, shape.rank)
        self.projection = _random(projection_shape, torch.float32, device, self.generator, scale=shape.rank**-0.5)

    def run(self, config) -> torch.Tensor:
        return projected_energy.projected_energy_triton(
            self.keys, self.values, self.projection, self.lengths, self.window, config=config
        )

    def expected(self, batch: int) -> torch.Tensor:
        rows = slice(batch, batch + 1)
        return reference.projected_energy(
            self.keys[rows].double(), self.values[rows].double(), self.projection[rows].double(),
            self.lengths[rows], window=self.window,
        )[0]  # fmt: skip


class SimilarityProblem(_ImportanceProblem):
    """`rkv`'s mean cosine similarity of each candidate key to the other candidates of its row."""

    shape: SimilarityShape
    config_type = key_similarity.SimilarityConfig

    def run(self, config) -> torch.Tensor:
        return key_similarity.mean_key_similarity_triton(self.keys, self.lengths, self.window, config=config)

    def expected(self, batch: int) -> torch.Tensor:
        rows = slice(batch, batch + 1)
        return reference.mean_key_similarity(self.keys[rows].double(), self.lengths[rows], window=self.window)[0]


def build_problem(kernel: str, shape: tuple, device: torch.device, default: dict, partner: Optional[dict] = None) -> Problem:
    """The problem of tuning `kernel` at `shape` on `device`.

    `default`: the heuristic parameters (the accuracy yardstick); `partner`: for `decode`
    the combine stage's parameters, for `decode_combine` the split-K stage's.
    """
    if kernel == "prefill_forward":
        return PrefillForwardProblem(shape, device, default)
    if kernel == "prefill_scores":
        return PrefillScoresProblem(shape, device, default)
    if kernel in ("decode", "decode_combine"):
        if partner is None:
            raise ValueError(f"partner: expected the other decode stage's parameters for {kernel}; got None")
        return DecodeProblem(kernel, shape, device, default, partner)
    if kernel == "append":
        return AppendProblem(shape, device, default)
    if kernel in ("evict_select", "evict_select_tiled", "evict_compact"):
        return EvictProblem(kernel, shape, device, default)
    if kernel == "projected_energy":
        return EnergyProblem(shape, device, default)
    if kernel == "key_similarity":
        return SimilarityProblem(shape, device, default)
    raise ValueError(f"kernel: expected one of the tuned kernels; got {kernel!r}")
