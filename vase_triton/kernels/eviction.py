"""Fused value-aware Gumbel eviction: select the survivors of each row, compact them in place.

Two launches share the work of one eviction:

- Selection picks exactly `budget` survivors per evicted row (one row = one
  `(b, kv_head)`): the sinks, the largest value magnitudes among the other candidates
  (`n_protect` in all, sinks included), the largest Gumbel-perturbed importance keys among
  the rest up to `budget - window` kept candidates, and the recent window. Each "largest
  `m`" is an exact threshold found by a search on the order-preserving int32 image of the
  float32 keys: starting from the row's range of eligible keys, each round counts the keys
  at or above `PROBES` thresholds and keeps the part of the range between two of them that
  holds the `m`-th largest key (one probe bisects: at most 32 rounds; 16 probes: at most 8,
  each counting 16x as much); it stops early when some threshold has exactly `m` keys at
  or above it, as distinct continuous keys soon do. Ties at the threshold are filled in
  slot order with `tl.cumsum`. It writes, per row, the source slot of each destination
  slot `[0, budget)` and a flag saying whether the row is evicted at all.
  - `_evict_select_kernel` holds the candidate slots of `BLOCK_R` rows in registers (the
    recent window is kept outright, its sources written without a selection): the fast
    path, used while the candidates fit (`N - window <= _MAX_RESIDENT_SLOTS`, every
    decode-time eviction up to budget 8192).
  - `_evict_select_tiled_kernel` walks a row in `BLOCK_N` tiles through an int32 key
    scratch and an int8 state scratch (one program per row), for long prompts: its
    register use and its compiled variants do not depend on `N`.
  Both draw the same philox numbers (offset `row * N + slot`), so they select the same slots.
- `_evict_compact_kernel` moves the survivors down in place, one program per
  `(BLOCK_R rows, BLOCK_D slice of D)` (one row per program on GPU; many under the
  interpreter): destination slots are walked in increasing order and a survivor's
  source slot is never below its destination, so a `[BLOCK_M, BLOCK_D]` tile read
  before a barrier can be written after it without clobbering unread data. The slice-0
  program of a row also moves magnitudes, positions and (with `keep_scores`) scores and
  clears the freed slots; the one of `(b, head 0)` writes `lengths[b]`.

Selection reads `lengths`, compaction only the flags, so `lengths` can be updated in
the second launch without racing with the heads that still read it.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Union

import torch
import triton
import triton.language as tl

from vase_triton.autotune.lookup import tuned_params
from vase_triton.autotune.shapes import EvictShape, dtype_name
from vase_triton.backend import interpreter_enabled
from vase_triton.cache_tensors import CacheTensors
from vase_triton.config import MIN_TEMPERATURE

# Uniforms are clamped into [_U_MIN, _U_MAX] before the Gumbel transform, so that
# -log(-log(u)) is finite; the reference clamps identically.
_U_MIN = tl.constexpr(1.1754943508222875e-38)
_U_MAX = tl.constexpr(1.0 - 2.0**-24)
# Selection states of the tiled kernel's scratch.
_ELIGIBLE = tl.constexpr(0)
_KEPT = tl.constexpr(1)
_OUTSIDE = tl.constexpr(2)

# Elements of a [BLOCK_R, BLOCK_N] selection tile per warp on GPU (16 per thread, so that the
# half-dozen live [BLOCK_R, BLOCK_N] keys and masks stay in registers): sets num_warps.
_SELECT_ELEMENTS_PER_WARP = 512
# Longest row the in-register selection holds (sm_90: no spills up to here); longer rows
# take the tiled kernel with `_TILED_BLOCK_N`-slot tiles.
_MAX_RESIDENT_SLOTS = 8192
_TILED_BLOCK_N = 2048
# Interpreter: rows are batched into one program up to this many selection elements
# (and 16x as many compaction elements), since its cost grows with programs x operations.
_INTERPRETER_TILE = 65536


@triton.jit
def _ordered_bits(x):
    """Int32 image of float32 `x` whose signed order is the float order (-0 == +0)."""
    bits = (x + 0.0).to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _probe_points(lo, hi, PROBES: tl.constexpr):
    """`[R, PROBES]` int64 points `p_j = lo + floor(j * (hi - lo + 1) / (PROBES + 1))`, `j = 1..PROBES`,
    which cut each row's `[lo, hi]` (`lo`, `hi`: `[R]`) into `PROBES + 1` near-equal parts."""
    j = (tl.arange(0, PROBES) + 1).to(tl.int64)
    return lo[:, None] + ((hi - lo + 1)[:, None] * j[None, :]) // (PROBES + 1)


@triton.jit
def _count_at_least(ordered, eligible, probes, PROBES: tl.constexpr):
    """`[R, PROBES]` int32: how many `eligible` `ordered` values (`[R, BLOCK_N]`) are >= each probe (`[R, PROBES]`)."""
    if PROBES == 1:
        hits = eligible & (ordered >= probes.to(tl.int32))  # [R, BLOCK_N]
        return tl.sum(hits.to(tl.int32), axis=1)[:, None]
    else:
        hits = eligible[:, None, :] & (ordered[:, None, :] >= probes.to(tl.int32)[:, :, None])  # [R, PROBES, BLOCK_N]
        return tl.sum(hits.to(tl.int32), axis=2)


@triton.jit
def _narrow(lo, hi, n_at_least, count, PROBES: tl.constexpr):
    """Narrow `[lo, hi]` (`[R]`), which holds the threshold of the `count` largest values, to the part
    between two consecutive probes (`_probe_points`) that holds it, given `n_at_least` (`[R, PROBES]`)
    values at or above each probe.

    The threshold is the largest `t` with at least `count` values `>= t`: the `count`-th largest
    value. The search stops early (`lo == hi`, a probe) when exactly `count` values are at or above
    a probe, which selects the same values without ties. With one probe this is bisection.
    """
    size = hi - lo + 1  # [R]
    # Counts fall as probes rise: the probes with enough values at or above them are a prefix.
    part = tl.sum((n_at_least >= count).to(tl.int32), axis=1)  # [R], in [0, PROBES]
    new_lo = lo + (size * part) // (PROBES + 1)
    new_hi = lo + (size * (part + 1)) // (PROBES + 1) - 1
    j = tl.arange(0, PROBES) + 1
    n_at_new_lo = tl.sum(tl.where(j[None, :] == part[:, None], n_at_least, 0), axis=1)  # [R]
    exact = (part > 0) & (n_at_new_lo == count)
    return new_lo, tl.where(exact, new_lo, new_hi)


@triton.jit
def _select_largest(ordered, eligible, count, BLOCK_R: tl.constexpr, PROBES: tl.constexpr):
    """Mask of the `count` largest `ordered` values among `eligible`, ties to the earlier slot.

    `ordered`, `eligible`: [BLOCK_R, BLOCK_N]; `count`: scalar. Rows with fewer than
    `count` eligible slots get an unspecified mask (the caller never uses them).
    """
    # A threshold t with the `count` largest at or above it, by a search on int32 that cuts the
    # range into PROBES + 1 parts a round (at most 32 rounds with one probe, 8 with 16), from the
    # row's eligible [min, max] (a row without eligible values has nothing to search).
    lo = tl.min(tl.where(eligible, ordered, 2147483647), axis=1).to(tl.int64)  # [BLOCK_R]
    hi = tl.maximum(tl.max(tl.where(eligible, ordered, -2147483648), axis=1).to(tl.int64), lo)
    while tl.max(hi - lo, axis=0) > 0:
        n_at_least = _count_at_least(ordered, eligible, _probe_points(lo, hi, PROBES), PROBES)
        lo, hi = _narrow(lo, hi, n_at_least, count, PROBES)
    threshold = lo.to(tl.int32)[:, None]  # [BLOCK_R, 1]
    above = eligible & (ordered > threshold)  # [BLOCK_R, BLOCK_N]
    ties = eligible & (ordered == threshold)  # [BLOCK_R, BLOCK_N]
    n_above = tl.sum(above.to(tl.int32), axis=1)  # [BLOCK_R]
    tie_rank = tl.cumsum(ties.to(tl.int32), axis=1)  # [BLOCK_R, BLOCK_N], 1-based in slot order
    return above | (ties & (tie_rank <= (count - n_above)[:, None]))


@triton.jit
def eviction_philox(philox_key, offsets, eviction_index_ptr):
    """The four philox words of every draw of an eviction: keyed by `philox_key` (a stream of
    `vase_triton.seeding`), at counters `(offsets, eviction index, 0, 0)`.

    The eviction index is read from device memory, so a captured eviction draws anew at every replay.
    """
    zero = offsets * 0
    return tl.philox(philox_key, offsets, zero + tl.load(eviction_index_ptr), zero, zero)


@triton.jit
def _selection_key(weight, rows, slots, num_slots, noise_ptrs, noise_mask, inv_temperature, philox_key,
                   eviction_index_ptr, STOCHASTIC: tl.constexpr, HAS_NOISE: tl.constexpr):
    """Selection key of weights `weight` [.., BLOCK_N]: `log(w)/tau + Gumbel`, or `w` when deterministic."""
    if STOCHASTIC:
        if HAS_NOISE:
            uniform = tl.load(noise_ptrs, mask=noise_mask, other=0.5)
        else:
            bits, _, _, _ = eviction_philox(philox_key, rows * num_slots + slots, eviction_index_ptr)
            uniform = tl.uint_to_uniform_float(bits)
        uniform = tl.minimum(tl.maximum(uniform, _U_MIN), _U_MAX)
        gumbel = -tl.log(-tl.log(uniform))
        positive = weight > 0
        log_weight = tl.log(tl.where(positive, weight, 1.0))
        key = tl.where(positive, log_weight * inv_temperature + gumbel, float("-inf"))
    else:
        key = tl.where(weight == weight, weight, float("-inf"))
    return key


@triton.jit
def _evict_select_kernel(
    # pointers
    importance_ptr,
    magnitudes_ptr,
    noise_ptr,
    lengths_ptr,
    sources_ptr,
    flags_ptr,
    eviction_index_ptr,
    # sizes
    num_rows,
    num_heads,
    num_slots,
    budget,
    window,
    n_sink,
    n_large,
    trigger_length,
    inv_temperature,
    philox_key,
    # strides
    stride_ib, stride_ih, stride_in,
    stride_mb, stride_mh, stride_mn,
    stride_ub, stride_uh, stride_un,
    # meta-parameters
    STOCHASTIC: tl.constexpr,
    HAS_NOISE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_W: tl.constexpr,
    PROBES: tl.constexpr,
):
    # BLOCK_N >= N - window covers every candidate slot; BLOCK_W >= window the recent ones.
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)  # [BLOCK_R]
    row_ok = rows < num_rows
    batch = rows // num_heads
    head = rows % num_heads
    length = tl.minimum(tl.load(lengths_ptr + batch, mask=row_ok, other=0).to(tl.int32), num_slots)
    evict = row_ok & (length >= trigger_length)
    tl.store(flags_ptr + rows, evict.to(tl.int8), mask=row_ok)

    # Rows that are not evicted need no selection (all of them, often, at prefill).
    if tl.max(evict.to(tl.int32), axis=0) > 0:
        slots = tl.arange(0, BLOCK_N)
        n_candidates = length - window  # [BLOCK_R]
        candidate = row_ok[:, None] & (slots[None, :] < n_candidates[:, None])  # [BLOCK_R, BLOCK_N]
        sink = candidate & (slots[None, :] < n_sink)

        # 1. value protection: the n_large largest magnitudes among the non-sink candidates.
        protected = slots[None, :] < tl.zeros([BLOCK_R, 1], tl.int32)  # [BLOCK_R, BLOCK_N], all False
        if n_large > 0:
            mag_rows = magnitudes_ptr + batch * stride_mb + head * stride_mh  # [BLOCK_R]
            magnitude = tl.load(mag_rows[:, None] + slots[None, :] * stride_mn, mask=candidate, other=0.0)
            magnitude = tl.where(magnitude == magnitude, magnitude, float("-inf"))
            protected = _select_largest(_ordered_bits(magnitude), candidate & ~sink, n_large, BLOCK_R, PROBES)

        # 2. importance keys: log(w)/tau + Gumbel noise, or w itself when deterministic.
        imp_ptrs = importance_ptr + batch[:, None] * stride_ib + head[:, None] * stride_ih + slots[None, :] * stride_in
        weight = tl.load(imp_ptrs, mask=candidate, other=0.0)  # [BLOCK_R, BLOCK_N]
        noise_ptrs = noise_ptr + batch[:, None] * stride_ub + head[:, None] * stride_uh + slots[None, :] * stride_un
        key = _selection_key(weight, rows[:, None], slots[None, :], num_slots, noise_ptrs, candidate,
                             inv_temperature, philox_key, eviction_index_ptr, STOCHASTIC, HAS_NOISE)
        k_sampled = budget - window - n_sink - n_large
        sampled = _select_largest(_ordered_bits(key), candidate & ~sink & ~protected, k_sampled, BLOCK_R, PROBES)

        # 3. survivors in temporal order: destination = number of survivors before the slot. The
        # `budget - window` kept candidates come first, then the recent window, all of it.
        keep = sink | protected | sampled  # [BLOCK_R, BLOCK_N]
        destination = tl.cumsum(keep.to(tl.int32), axis=1) - 1
        src_ptrs = sources_ptr + rows[:, None] * budget + destination
        tl.store(src_ptrs, slots[None, :] + tl.zeros([BLOCK_R, BLOCK_N], tl.int32), mask=keep & evict[:, None])
        recent = tl.arange(0, BLOCK_W)  # [BLOCK_W]
        recent_ptrs = sources_ptr + rows[:, None] * budget + (budget - window) + recent[None, :]
        tl.store(recent_ptrs, n_candidates[:, None] + recent[None, :], mask=evict[:, None] & (recent[None, :] < window))


@triton.jit
def _tiled_threshold(bits_row, state_row, num_slots, count, lo, hi, BLOCK_N: tl.constexpr, PROBES: tl.constexpr):
    """(threshold, number above it) of the `count` largest `bits` among `_ELIGIBLE` slots of one row.

    `bits_row`, `state_row`: pointers to the row's int32 keys and int8 states in scratch; `lo`,
    `hi`: `[1]` int32, the least and the largest eligible key, where the search starts (`lo > hi`
    when none is eligible). Each round of the search (`_narrow`) walks the row once.
    """
    offs = tl.arange(0, BLOCK_N)
    lo = lo.to(tl.int64)
    hi = tl.maximum(hi.to(tl.int64), lo)
    while tl.max(hi - lo, axis=0) > 0:
        # 1-D counts: a [1, BLOCK_N] walk here makes Triton 3.6 spill the whole tile.
        probes = tl.reshape(_probe_points(lo, hi, PROBES), [PROBES]).to(tl.int32)
        n_at_least = tl.zeros([PROBES], tl.int32)
        for start in range(0, num_slots, BLOCK_N):
            slots = start + offs
            in_row = slots < num_slots
            bits = tl.load(bits_row + slots, mask=in_row, other=0)
            eligible = tl.load(state_row + slots, mask=in_row, other=_OUTSIDE) == _ELIGIBLE
            if PROBES == 1:
                n_at_least += tl.sum((eligible & (bits >= probes)).to(tl.int32), axis=0)
            else:
                hits = eligible[None, :] & (bits[None, :] >= probes[:, None])  # [PROBES, BLOCK_N]
                n_at_least += tl.sum(hits.to(tl.int32), axis=1)
        lo, hi = _narrow(lo, hi, n_at_least[None, :], count, PROBES)
    threshold = lo.to(tl.int32)
    n_above = tl.zeros([1], tl.int32)
    for start in range(0, num_slots, BLOCK_N):
        slots = start + offs
        in_row = slots < num_slots
        bits = tl.load(bits_row + slots, mask=in_row, other=0)
        eligible = tl.load(state_row + slots, mask=in_row, other=_OUTSIDE) == _ELIGIBLE
        n_above += tl.sum((eligible & (bits > threshold)).to(tl.int32), axis=0)
    return threshold, n_above


@triton.jit
def _take_largest(bits, eligible, threshold, n_above, ties_before, count):
    """Tile part of the `count` largest: above the threshold, or tied and early enough in slot order.

    Returns `(chosen mask [BLOCK_N], ties seen up to the end of this tile)`.
    """
    ties = eligible & (bits == threshold)
    tie_rank = ties_before + tl.cumsum(ties.to(tl.int32), axis=0)
    chosen = (eligible & (bits > threshold)) | (ties & (tie_rank <= count - n_above))
    return chosen, ties_before + tl.sum(ties.to(tl.int32), axis=0)


@triton.jit
def _evict_select_tiled_kernel(
    # pointers
    importance_ptr,
    magnitudes_ptr,
    noise_ptr,
    lengths_ptr,
    sources_ptr,
    flags_ptr,
    eviction_index_ptr,
    bits_ptr,
    state_ptr,
    # sizes
    num_heads,
    num_slots,
    budget,
    window,
    n_sink,
    n_large,
    trigger_length,
    inv_temperature,
    philox_key,
    # strides
    stride_ib, stride_ih, stride_in,
    stride_mb, stride_mh, stride_mn,
    stride_ub, stride_uh, stride_un,
    # meta-parameters
    STOCHASTIC: tl.constexpr,
    HAS_NOISE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PROBES: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    batch = row // num_heads
    head = row % num_heads
    length = tl.minimum(tl.load(lengths_ptr + batch).to(tl.int32), num_slots)
    evict = length >= trigger_length
    tl.store(flags_ptr + row, evict.to(tl.int8))
    if evict:
        offs = tl.arange(0, BLOCK_N)
        n_candidates = length - window
        bits_row = bits_ptr + row * num_slots
        state_row = state_ptr + row * num_slots
        mag_row = magnitudes_ptr + batch * stride_mb + head * stride_mh
        imp_row = importance_ptr + batch * stride_ib + head * stride_ih
        noise_row = noise_ptr + batch * stride_ub + head * stride_uh

        # 1. magnitudes of the non-sink candidates; sinks and the window are kept outright. The
        # searches start from the least and the largest eligible key, gathered as they are written.
        least = tl.full([1], 2147483647, tl.int32)
        largest = tl.full([1], -2147483648, tl.int32)
        for start in range(0, num_slots, BLOCK_N):
            slots = start + offs
            in_row = slots < num_slots
            candidate = slots < n_candidates
            magnitude = tl.load(mag_row + slots * stride_mn, mask=candidate, other=0.0)
            magnitude = tl.where(magnitude == magnitude, magnitude, float("-inf"))
            eligible = candidate & (slots >= n_sink)
            state = tl.where(eligible, _ELIGIBLE, tl.where(slots < length, _KEPT, _OUTSIDE))
            bits = _ordered_bits(magnitude)
            least = tl.minimum(least, tl.min(tl.where(eligible, bits, 2147483647), axis=0))
            largest = tl.maximum(largest, tl.max(tl.where(eligible, bits, -2147483648), axis=0))
            tl.store(bits_row + slots, bits, mask=in_row)
            tl.store(state_row + slots, state.to(tl.int8), mask=in_row)

        # 2. protect the n_large largest magnitudes; replace magnitudes by selection keys.
        threshold = tl.full([1], 2147483647, tl.int32)
        n_above = tl.zeros([1], tl.int32)
        if n_large > 0:
            threshold, n_above = _tiled_threshold(bits_row, state_row, num_slots, n_large, least, largest,
                                                  BLOCK_N, PROBES)
        least = tl.full([1], 2147483647, tl.int32)
        largest = tl.full([1], -2147483648, tl.int32)
        ties_before = tl.zeros([1], tl.int32)
        for start in range(0, num_slots, BLOCK_N):
            slots = start + offs
            in_row = slots < num_slots
            bits = tl.load(bits_row + slots, mask=in_row, other=0)
            state = tl.load(state_row + slots, mask=in_row, other=_OUTSIDE)
            eligible = state == _ELIGIBLE
            protected, ties_before = _take_largest(bits, eligible, threshold, n_above, ties_before, n_large)
            weight = tl.load(imp_row + slots * stride_in, mask=eligible, other=0.0)
            key = _selection_key(weight, row, slots, num_slots, noise_row + slots * stride_un, eligible,
                                 inv_temperature, philox_key, eviction_index_ptr, STOCHASTIC, HAS_NOISE)
            key_bits = _ordered_bits(key)
            remaining = eligible & ~protected
            least = tl.minimum(least, tl.min(tl.where(remaining, key_bits, 2147483647), axis=0))
            largest = tl.maximum(largest, tl.max(tl.where(remaining, key_bits, -2147483648), axis=0))
            tl.store(bits_row + slots, key_bits, mask=in_row)
            tl.store(state_row + slots, tl.where(protected, _KEPT, state).to(tl.int8), mask=in_row)

        # 3. sample (or take the top of) the rest; survivors in temporal order.
        k_sampled = budget - window - n_sink - n_large
        threshold, n_above = _tiled_threshold(bits_row, state_row, num_slots, k_sampled, least, largest,
                                              BLOCK_N, PROBES)
        ties_before = tl.zeros([1], tl.int32)
        kept_before = tl.zeros([1], tl.int32)
        for start in range(0, num_slots, BLOCK_N):
            slots = start + offs
            in_row = slots < num_slots
            bits = tl.load(bits_row + slots, mask=in_row, other=0)
            state = tl.load(state_row + slots, mask=in_row, other=_OUTSIDE)
            sampled, ties_before = _take_largest(bits, state == _ELIGIBLE, threshold, n_above, ties_before, k_sampled)
            keep = (state == _KEPT) | sampled
            destination = kept_before + tl.cumsum(keep.to(tl.int32), axis=0) - 1
            tl.store(sources_ptr + row * budget + destination, slots.to(tl.int32), mask=keep)
            kept_before += tl.sum(keep.to(tl.int32), axis=0)


@triton.jit
def _slot_tile(row_bases, slots, offs_d, stride_n, stride_d):
    """Pointers [BLOCK_R, BLOCK_M, BLOCK_D] to dims `offs_d` [BLOCK_D] of slots `slots`
    [BLOCK_R or 1, BLOCK_M] of the rows starting at `row_bases` [BLOCK_R]."""
    return row_bases[:, None, None] + slots[:, :, None] * stride_n + offs_d[None, None, :] * stride_d


@triton.jit
def _evict_compact_kernel(
    # pointers
    keys_ptr,
    values_ptr,
    scores_ptr,
    magnitudes_ptr,
    positions_ptr,
    lengths_ptr,
    sources_ptr,
    flags_ptr,
    # sizes
    num_rows,
    num_heads,
    num_slots,
    head_dim,
    budget,
    # strides
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_sb, stride_sh, stride_sn,
    stride_mb, stride_mh, stride_mn,
    stride_pb, stride_ph, stride_pn,
    # meta-parameters
    KEEP_SCORES: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)  # [BLOCK_R]
    pid_d = tl.program_id(1)
    row_ok = rows < num_rows
    evict = row_ok & (tl.load(flags_ptr + rows, mask=row_ok, other=0) != 0)
    if tl.max(evict.to(tl.int32), axis=0) > 0:
        batch = rows // num_heads
        head = rows % num_heads
        offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
        mask_d = offs_d < head_dim
        # Only the slice-0 program of a row moves and clears its per-token data.
        owner = evict & ((tl.zeros([BLOCK_R], tl.int32) + pid_d) == 0)  # [BLOCK_R]
        k_rows = keys_ptr + batch * stride_kb + head * stride_kh
        v_rows = values_ptr + batch * stride_vb + head * stride_vh
        s_rows = scores_ptr + batch * stride_sb + head * stride_sh
        m_rows = magnitudes_ptr + batch * stride_mb + head * stride_mh
        p_rows = positions_ptr + batch * stride_pb + head * stride_ph

        # A tile's source slots are loaded one tile ahead (`sources` is not written here), so that
        # its key and value loads are issued as soon as the previous tile's stores are.
        offs_m = tl.arange(0, BLOCK_M)
        src_rows = sources_ptr + rows[:, None] * budget  # [BLOCK_R, 1]
        next_src = tl.load(src_rows + offs_m[None, :], mask=evict[:, None] & (offs_m[None, :] < budget), other=0)
        for start in range(0, budget, BLOCK_M):
            dst = start + offs_m  # [BLOCK_M]
            dst_ok = evict[:, None] & (dst[None, :] < budget)  # [BLOCK_R, BLOCK_M]
            src = next_src
            following = dst[None, :] + BLOCK_M
            next_src = tl.load(src_rows + following, mask=evict[:, None] & (following < budget), other=0)
            move = dst_ok & (src != dst[None, :])  # [BLOCK_R, BLOCK_M]
            src = src.to(tl.int64)
            dst = dst.to(tl.int64)
            move_tile = move[:, :, None] & mask_d[None, None, :]  # [BLOCK_R, BLOCK_M, BLOCK_D]
            k_src = _slot_tile(k_rows, src, offs_d, stride_kn, stride_kd)
            v_src = _slot_tile(v_rows, src, offs_d, stride_vn, stride_vd)
            k_tile = tl.load(k_src, mask=move_tile)  # [BLOCK_R, BLOCK_M, BLOCK_D]
            v_tile = tl.load(v_src, mask=move_tile)  # [BLOCK_R, BLOCK_M, BLOCK_D]
            move_token = move & owner[:, None]  # [BLOCK_R, BLOCK_M]
            magnitude = tl.load(m_rows[:, None] + src * stride_mn, mask=move_token)
            position = tl.load(p_rows[:, None] + src * stride_pn, mask=move_token)
            if KEEP_SCORES:
                score = tl.load(s_rows[:, None] + src * stride_sn, mask=move_token)
            # Every thread has read its sources before any thread overwrites one.
            tl.debug_barrier()
            k_dst = _slot_tile(k_rows, dst[None, :], offs_d, stride_kn, stride_kd)
            v_dst = _slot_tile(v_rows, dst[None, :], offs_d, stride_vn, stride_vd)
            tl.store(k_dst, k_tile, mask=move_tile)
            tl.store(v_dst, v_tile, mask=move_tile)
            tl.store(m_rows[:, None] + dst[None, :] * stride_mn, magnitude, mask=move_token)
            tl.store(p_rows[:, None] + dst[None, :] * stride_pn, position, mask=move_token)
            if KEEP_SCORES:
                tl.store(s_rows[:, None] + dst[None, :] * stride_sn, score, mask=move_token)

        # Freed slots: position -1 and, when scores travel with their tokens, score 0 (otherwise
        # the launcher resets every score after this kernel).
        for start in range(budget, num_slots, BLOCK_M):
            slot = start + tl.arange(0, BLOCK_M)  # [BLOCK_M]
            freed = owner[:, None] & (slot[None, :] < num_slots)  # [BLOCK_R, BLOCK_M]
            slot = slot.to(tl.int64)
            freed_position = tl.full([BLOCK_R, BLOCK_M], -1, tl.int32)
            tl.store(p_rows[:, None] + slot[None, :] * stride_pn, freed_position, mask=freed)
            if KEEP_SCORES:
                zero_score = tl.zeros([BLOCK_R, BLOCK_M], tl.float32)
                tl.store(s_rows[:, None] + slot[None, :] * stride_sn, zero_score, mask=freed)
        new_length = tl.zeros([BLOCK_R], tl.int32) + budget
        tl.store(lengths_ptr + batch, new_length, mask=owner & (head == 0))


class SelectConfig(NamedTuple):
    """In-register selection launch: `BLOCK_R` whole rows (of `next_power_of_2(N)` slots) per program,
    warps, and the thresholds each round of the search counts at (`PROBES`, a power of two; 1 bisects)."""

    block_r: int
    num_warps: int
    probes: int = 1


class TiledSelectConfig(NamedTuple):
    """Tiled selection launch: one row per program walked in `[BLOCK_N]` tiles, warps, and the
    thresholds each round (one walk of the row) counts at (`PROBES`, a power of two; 1 bisects)."""

    block_n: int
    num_warps: int
    probes: int = 1


class CompactConfig(NamedTuple):
    """Compaction launch: `[BLOCK_R, BLOCK_M, BLOCK_D]` tiles (rows, destination slots, dims), and warps."""

    block_r: int
    block_m: int
    block_d: int
    num_warps: int


def uses_tiled_selection(num_slots: int, window: int) -> bool:
    """Whether rows of `num_slots` slots, `window` of them recent, take the tiled selection kernel
    (too many candidates to hold in registers)."""
    return num_slots - window > _MAX_RESIDENT_SLOTS


def candidate_block(shape: EvictShape) -> int:
    """Slots the in-register selection holds per row: every candidate, `N - window` at most."""
    return triton.next_power_of_2(shape.num_slots - shape.window)


def select_heuristic(shape: EvictShape) -> SelectConfig:
    """Rows per program and warps of the in-register selection (`_SELECT_ELEMENTS_PER_WARP` per warp); bisection."""
    rows = shape.batch * shape.kv_heads
    block_n = candidate_block(shape)
    if interpreter_enabled():
        return SelectConfig(max(1, min(triton.next_power_of_2(rows), _INTERPRETER_TILE // block_n)), 4)
    block_r = max(1, min(triton.next_power_of_2(rows), 2048 // block_n))
    return SelectConfig(block_r, min(32, max(4, block_r * block_n // _SELECT_ELEMENTS_PER_WARP)))


def tiled_select_heuristic(shape: EvictShape) -> TiledSelectConfig:
    """`_TILED_BLOCK_N`-slot tiles, 8 warps, bisection."""
    return TiledSelectConfig(_TILED_BLOCK_N, 8)


def compact_heuristic(shape: EvictShape) -> CompactConfig:
    """One row per program on GPU ([128, 64] key and value tiles); many rows under the interpreter."""
    block_d = triton.next_power_of_2(shape.head_dim)
    if interpreter_enabled():
        block_m = min(triton.next_power_of_2(shape.budget), 4096)
        rows = shape.batch * shape.kv_heads
        block_r = max(1, min(triton.next_power_of_2(rows), _INTERPRETER_TILE * 16 // (block_m * block_d)))
        return CompactConfig(block_r, block_m, block_d, 4)
    # [128, 64] tiles of keys and values in flight per program, 2 programs per row at D=128.
    return CompactConfig(1, 128, min(block_d, 64), 8)


def _evict_shape(cache: CacheTensors, budget: int, window: int) -> EvictShape:
    batch, num_heads, num_slots, head_dim = cache.keys.shape
    return EvictShape(batch, num_heads, num_slots, budget, window, head_dim, dtype_name(cache.keys.dtype))


def select_survivors_(
    cache: CacheTensors,
    importance: torch.Tensor,
    sources: torch.Tensor,
    flags: torch.Tensor,
    *,
    budget: int,
    window: int,
    n_sink: int,
    n_protect: int,
    temperature: float,
    seed: int,
    eviction_index: torch.Tensor,
    trigger_length: int,
    noise: Optional[torch.Tensor],
    config: Union[SelectConfig, TiledSelectConfig, None] = None,
) -> None:
    """Selection launch: write each row's survivor slots into `sources` and its eviction flag into `flags`.

    Args:
        cache: validated `[B, Hkv, N, D]` buffers (only lengths and magnitudes are read).
        importance: `[B, Hkv, N]` float32; noise: `[B, Hkv, N]` float32 uniforms or None (philox).
        seed: philox key; eviction_index: `[1]` int64 philox counter word, read (not advanced).
        sources: `[B * Hkv, budget]` int32; flags: `[B * Hkv]` int8; both written.
        config: a `SelectConfig` (in-register kernel) or a `TiledSelectConfig` (tiled kernel);
            None takes the kernel rows of `N` slots need, tuned for this shape or heuristic.
        Other arguments as `vase_triton.ops.evict_`.
    """
    keys, magnitudes, lengths = cache.keys, cache.magnitudes, cache.lengths
    batch, num_heads, num_slots, _ = keys.shape
    num_rows = batch * num_heads
    shape = _evict_shape(cache, budget, window)
    if config is None:
        if uses_tiled_selection(num_slots, window):
            tuned = tuned_params("evict_select_tiled", shape, keys.device)
            config = TiledSelectConfig(**tuned) if tuned is not None else tiled_select_heuristic(shape)
        else:
            tuned = tuned_params("evict_select", shape, keys.device)
            config = SelectConfig(**tuned) if tuned is not None else select_heuristic(shape)
    stochastic = temperature >= MIN_TEMPERATURE
    noise_arg = noise if noise is not None else importance
    n_large = max(0, n_protect - n_sink)
    shared = (
        budget, window, n_sink, n_large, trigger_length, (1.0 / temperature) if stochastic else 1.0, seed,
        importance.stride(0), importance.stride(1), importance.stride(2),
        magnitudes.stride(0), magnitudes.stride(1), magnitudes.stride(2),
        noise_arg.stride(0), noise_arg.stride(1), noise_arg.stride(2),
    )

    if isinstance(config, SelectConfig):
        _evict_select_kernel[(triton.cdiv(num_rows, config.block_r),)](
            importance, magnitudes, noise_arg, lengths, sources, flags, eviction_index,
            num_rows, num_heads, num_slots, *shared,
            STOCHASTIC=stochastic, HAS_NOISE=noise is not None, BLOCK_R=config.block_r,
            BLOCK_N=candidate_block(shape), BLOCK_W=triton.next_power_of_2(window), PROBES=config.probes,
            num_warps=config.num_warps,
        )  # fmt: skip
    else:
        bits = torch.empty((num_rows, num_slots), dtype=torch.int32, device=keys.device)
        state = torch.empty((num_rows, num_slots), dtype=torch.int8, device=keys.device)
        _evict_select_tiled_kernel[(num_rows,)](
            importance, magnitudes, noise_arg, lengths, sources, flags, eviction_index, bits, state,
            num_heads, num_slots, *shared,
            STOCHASTIC=stochastic, HAS_NOISE=noise is not None, BLOCK_N=config.block_n, PROBES=config.probes,
            num_warps=config.num_warps,
        )  # fmt: skip


def compact_survivors_(
    cache: CacheTensors,
    sources: torch.Tensor,
    flags: torch.Tensor,
    *,
    budget: int,
    window: int,
    keep_scores: bool,
    config: Optional[CompactConfig] = None,
) -> None:
    """Compaction launch: move each flagged row's survivors (`sources`) to slots `[0, budget)`, in place.

    Also moves (or, without `keep_scores`, resets) the scores. `config`: launch parameters;
    None picks the tuned configuration of this shape, else the heuristic.
    """
    keys, values, scores, magnitudes, positions, lengths, _ = cache
    batch, num_heads, num_slots, head_dim = keys.shape
    num_rows = batch * num_heads
    if config is None:
        shape = _evict_shape(cache, budget, window)
        tuned = tuned_params("evict_compact", shape, keys.device)
        config = CompactConfig(**tuned) if tuned is not None else compact_heuristic(shape)
    _evict_compact_kernel[(triton.cdiv(num_rows, config.block_r), triton.cdiv(head_dim, config.block_d))](
        keys, values, scores, magnitudes, positions, lengths, sources, flags,
        num_rows, num_heads, num_slots, head_dim, budget,
        keys.stride(0), keys.stride(1), keys.stride(2), keys.stride(3),
        values.stride(0), values.stride(1), values.stride(2), values.stride(3),
        scores.stride(0), scores.stride(1), scores.stride(2),
        magnitudes.stride(0), magnitudes.stride(1), magnitudes.stride(2),
        positions.stride(0), positions.stride(1), positions.stride(2),
        KEEP_SCORES=keep_scores,
        BLOCK_R=config.block_r,
        BLOCK_M=config.block_m,
        BLOCK_D=config.block_d,
        num_warps=config.num_warps,
    )
    if not keep_scores:
        scores.zero_()


def evict_triton(
    cache: CacheTensors,
    importance: torch.Tensor,
    *,
    budget: int,
    window: int,
    n_sink: int,
    n_protect: int,
    temperature: float,
    seed: int,
    eviction_index: torch.Tensor,
    keep_scores: bool,
    trigger_length: int,
    noise: Optional[torch.Tensor],
) -> None:
    """Launch selection then compaction on validated cache tensors (`[B, Hkv, N, D]`), in place.

    Arguments as `vase_triton.ops.evict_` (`eviction_index` is read, the op advances it).
    """
    batch, num_heads = cache.keys.shape[:2]
    num_rows = batch * num_heads
    if num_rows == 0:
        return
    device = cache.keys.device
    sources = torch.empty((num_rows, budget), dtype=torch.int32, device=device)
    flags = torch.empty((num_rows,), dtype=torch.int8, device=device)
    select_survivors_(
        cache, importance, sources, flags, budget=budget, window=window, n_sink=n_sink, n_protect=n_protect,
        temperature=temperature, seed=seed, eviction_index=eviction_index, trigger_length=trigger_length, noise=noise,
    )
    compact_survivors_(cache, sources, flags, budget=budget, window=window, keep_scores=keep_scores)
