"""Decode attention over a static KV cache: flash-decoding split-K with score emission.

Stage 1, `_decode_partial_kernel`, runs one program per (batch x KV head, split):
it streams its chunk of cache slots once and attends with all the group's query
heads together (the group padded to at least 16 rows for `tl.dot`), writing a
partial output, a partial log-sum-exp and, when scores are requested, the
scaled logits of its chunk to an fp32 workspace.

Stage 2, `_decode_combine_kernel`, has the same grid: each program rebuilds the
group's global log-sum-exp from the partials; split 0 writes the combined output,
reading the partials several splits at a time, and every split adds
`exp(logit - lse)`, summed over the group, into the score buffer for the valid
slots of its chunk. Slots at or past `cache_lens[b]` are never read and never
written. Log-sum-exps and logits are kept in base 2.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from vase_triton.autotune.lookup import tuned_params
from vase_triton.autotune.shapes import DecodeShape, dtype_name
from vase_triton.backend import interpreter_enabled
from vase_triton.kernels.online_softmax import online_softmax_step

_LOG2E = 1.4426950408889634
_MIN_GROUP_ROWS = 16
_MAX_SPLITS = 128
# fp32 partial-output elements a thread of the combine stage holds per step of its loop over
# splits: the tile of `[group, splits, D]` it loads at once. One split a step put B = 1 at
# C = 4160 (65 splits) through 65 loads one after another.
COMBINE_TILE_REGISTERS = 16


@triton.jit
def _split_slots(cache_lens_ptr, batch, split, chunk):
    """Valid slots `[start, end)` of this split's chunk of sequence `batch` (empty past its length)."""
    start = split * chunk
    end = tl.minimum(start + chunk, tl.load(cache_lens_ptr + batch).to(tl.int32))
    return start, end


@triton.jit
def _decode_partial_kernel(
    # pointers
    q_ptr,
    k_ptr,
    v_ptr,
    cache_lens_ptr,
    part_out_ptr,
    part_lse_ptr,
    logits_ptr,
    # sizes
    q_heads,
    kv_heads,
    group,
    capacity,
    chunk,
    num_splits,
    qk_scale,
    # strides
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_vd,
    # meta-parameters
    HEAD_DIM: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EMIT_LOGITS: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_bh = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    batch = pid_bh // kv_heads
    kv_head = pid_bh % kv_heads
    start, end = _split_slots(cache_lens_ptr, batch, split, chunk)

    offs_g = tl.arange(0, BLOCK_G)  # [BLOCK_G]
    offs_n = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    offs_d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    row_valid = offs_g < group
    heads = kv_head * group + offs_g  # [BLOCK_G]

    q = tl.load(
        q_ptr + batch * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
        mask=row_valid[:, None],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)  # [BLOCK_G, HEAD_DIM]
    k_base = k_ptr + batch * stride_kb + kv_head * stride_kh
    v_base = v_ptr + batch * stride_vb + kv_head * stride_vh
    logits_rows = logits_ptr + (batch * q_heads + heads) * capacity  # [BLOCK_G]

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        col_valid = cols < end
        k = tl.load(
            k_base + cols[:, None] * stride_kt + offs_d[None, :] * stride_kd, mask=col_valid[:, None], other=0.0
        )  # [BLOCK_N, HEAD_DIM]
        v = tl.load(
            v_base + cols[:, None] * stride_vt + offs_d[None, :] * stride_vd, mask=col_valid[:, None], other=0.0
        )  # [BLOCK_N, HEAD_DIM]
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_G, BLOCK_N]
        s = tl.where(col_valid[None, :], s, float("-inf"))
        if EMIT_LOGITS:
            tl.store(logits_rows[:, None] + cols[None, :], s, mask=row_valid[:, None] & col_valid[None, :])
        m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, DOT_PRECISION)

    seen = l_i > 0.0
    safe_l = tl.where(seen, l_i, 1.0)
    part_out = acc / safe_l[:, None]
    part_lse = tl.where(seen, m_i + tl.log2(safe_l), float("-inf"))
    part_rows = (batch * q_heads + heads) * num_splits + split  # [BLOCK_G]
    tl.store(part_out_ptr + part_rows[:, None] * HEAD_DIM + offs_d[None, :], part_out, mask=row_valid[:, None])
    tl.store(part_lse_ptr + part_rows, part_lse, mask=row_valid)


@triton.jit
def _decode_combine_kernel(
    # pointers
    part_out_ptr,
    part_lse_ptr,
    logits_ptr,
    cache_lens_ptr,
    out_ptr,
    scores_ptr,
    # sizes
    q_heads,
    kv_heads,
    group,
    capacity,
    chunk,
    num_splits,
    # strides
    stride_ob,
    stride_oh,
    stride_sb,
    stride_sh,
    # meta-parameters
    HEAD_DIM: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_S: tl.constexpr,
    SPLIT_TILE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EMIT_SCORES: tl.constexpr,
):
    pid_bh = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    batch = pid_bh // kv_heads
    kv_head = pid_bh % kv_heads

    offs_g = tl.arange(0, BLOCK_G)  # [BLOCK_G]
    offs_s = tl.arange(0, BLOCK_S)  # [BLOCK_S]
    offs_d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    row_valid = offs_g < group
    heads = kv_head * group + offs_g  # [BLOCK_G]
    part_rows = (batch * q_heads + heads) * num_splits  # [BLOCK_G]

    part_lse = tl.load(
        part_lse_ptr + part_rows[:, None] + offs_s[None, :],
        mask=row_valid[:, None] & (offs_s[None, :] < num_splits),
        other=float("-inf"),
    )  # [BLOCK_G, BLOCK_S]
    lse_max = tl.max(part_lse, axis=1)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    total = tl.sum(tl.exp2(part_lse - lse_max[:, None]), axis=1)
    seen = total > 0.0
    lse = tl.where(seen, lse_max + tl.log2(tl.where(seen, total, 1.0)), float("-inf"))  # [BLOCK_G]
    lse_safe = tl.where(seen, lse, 0.0)

    if split == 0:
        # The partial outputs are read SPLIT_TILE splits at a time, so that a tile's loads are
        # in flight together; splits past the sequence's length hold nothing and are not read.
        cache_len = tl.load(cache_lens_ptr + batch).to(tl.int32)
        offs_t = tl.arange(0, SPLIT_TILE)  # [SPLIT_TILE]
        acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)
        for first in range(0, num_splits, SPLIT_TILE):
            splits = first + offs_t  # [SPLIT_TILE]
            tile_mask = row_valid[:, None] & ((splits < num_splits) & (splits * chunk < cache_len))[None, :]
            tile_rows = part_rows[:, None] + splits[None, :]  # [BLOCK_G, SPLIT_TILE]
            weight = tl.exp2(tl.load(part_lse_ptr + tile_rows, mask=tile_mask, other=float("-inf")) - lse_safe[:, None])
            part = tl.load(
                part_out_ptr + tile_rows[:, :, None] * HEAD_DIM + offs_d[None, None, :],
                mask=tile_mask[:, :, None],
                other=0.0,
            )  # [BLOCK_G, SPLIT_TILE, HEAD_DIM]
            acc += tl.sum(weight[:, :, None] * part, axis=1)
        tl.store(
            out_ptr + batch * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=row_valid[:, None],
        )

    if EMIT_SCORES:
        start, end = _split_slots(cache_lens_ptr, batch, split, chunk)
        logits_rows = logits_ptr + (batch * q_heads + heads) * capacity  # [BLOCK_G]
        scores_row = scores_ptr + batch * stride_sb + kv_head * stride_sh
        offs_n = tl.arange(0, BLOCK_N)  # [BLOCK_N]
        for start_n in range(start, end, BLOCK_N):
            cols = start_n + offs_n
            col_valid = cols < end
            mask = row_valid[:, None] & col_valid[None, :]
            logits = tl.load(logits_rows[:, None] + cols[None, :], mask=mask, other=float("-inf"))
            p = tl.where(mask, tl.exp2(logits - lse_safe[:, None]), 0.0)  # [BLOCK_G, BLOCK_N]
            previous = tl.load(scores_row + cols, mask=col_valid, other=0.0)
            tl.store(scores_row + cols, previous + tl.sum(p, axis=0), mask=col_valid)


class _Tiles(NamedTuple):
    block_n: int
    num_warps: int
    num_stages: int


class DecodeConfig(NamedTuple):
    """Split-K stage launch: `[BLOCK_N]` key blocks, warps, pipeline stages, splits per (sequence, KV head)."""

    block_n: int
    num_warps: int
    num_stages: int
    num_splits: int


class CombineConfig(NamedTuple):
    """Combine stage launch: `[BLOCK_N]` slots per score block, and warps."""

    block_n: int
    num_warps: int


def _decode_config(head_dim: int, dtype: torch.dtype) -> _Tiles:
    """Key-block size, warps and pipeline stages of the split-K kernel."""
    if interpreter_enabled():
        return _Tiles(128, 4, 1)
    if dtype == torch.float32:
        return _Tiles(32, 4, 2)
    if head_dim <= 128:
        return _Tiles(64, 4, 3)
    return _Tiles(32, 4, 3)


@functools.lru_cache(maxsize=None)
def _multiprocessor_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _num_splits(
    batch: int, kv_heads: int, capacity: int, block_n: int, device: torch.device, multiprocessors: Optional[int] = None
) -> int:
    """Splits per (sequence, KV head): about four programs per SM, at most one per key block.

    multiprocessors: the CUDA device's SM count (queried from `device` when None).
    """
    key_blocks = triton.cdiv(capacity, block_n)
    if device.type != "cuda":
        return min(2, key_blocks)
    if multiprocessors is None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        multiprocessors = _multiprocessor_count(index)
    target = 4 * multiprocessors
    return max(1, min(triton.cdiv(target, batch * kv_heads), key_blocks, _MAX_SPLITS))


def decode_heuristic(shape: DecodeShape, device: torch.device, multiprocessors: Optional[int] = None) -> DecodeConfig:
    """The split-K launch chosen without tuning: tiles by head dim and dtype, splits by SM count
    (`multiprocessors`, else `device`'s)."""
    tiles = _decode_config(shape.head_dim, getattr(torch, shape.dtype))
    splits = _num_splits(shape.batch, shape.kv_heads, shape.capacity, tiles.block_n, device, multiprocessors)
    return DecodeConfig(*tiles, splits)


def combine_heuristic(shape: DecodeShape) -> CombineConfig:
    """The combine launch chosen without tuning: 4 warps, score blocks of 256 slots (128 interpreted).

    A split's score loop waits on each block's loads in turn. At the group's own rows (4 for
    Qwen3) a 256-slot block costs at most a few more registers than a 64-slot one
    (`benchmarks/audits`), and walks a split's slots in a quarter of the steps.
    """
    return CombineConfig(128 if interpreter_enabled() else 256, 4)


def _combine_split_tile(group_rows: int, head_dim: int, split_blocks: int, num_warps: int) -> int:
    """Splits the combine stage reads at once: a power of two, at most `split_blocks`, whose
    `[group_rows, splits, head_dim]` tile is `COMBINE_TILE_REGISTERS` a thread."""
    fitting = COMBINE_TILE_REGISTERS * 32 * num_warps // (group_rows * head_dim)
    return min(split_blocks, 1 << (max(1, fitting).bit_length() - 1))


class DecodeWorkspace(NamedTuple):
    """Scratch of one decode call, reusable across steps of the same shape.

    part_out: `[B, Hq, S, D]` fp32 partial outputs; part_lse: `[B, Hq, S]` fp32 partial
    log-sum-exps; logits: `[B, Hq, C]` fp32 scaled logits (`[B, Hq, 0]` without scores).
    """

    part_out: torch.Tensor
    part_lse: torch.Tensor
    logits: torch.Tensor


def _split_plan(
    shape: DecodeShape, device: torch.device, num_splits: Optional[int], config: Optional[DecodeConfig]
) -> tuple[DecodeConfig, int, int]:
    """Split-K config (given, tuned or heuristic), slots per split (`chunk`) and the non-empty splits."""
    cfg = config
    if cfg is None:
        tuned = tuned_params("decode", shape, device)
        cfg = DecodeConfig(**tuned) if tuned is not None else decode_heuristic(shape, device)
    if num_splits is not None:
        if not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 1:
            raise ValueError(f"num_splits: expected a positive int or None; got {num_splits!r}")
        cfg = cfg._replace(num_splits=num_splits)
    chunk = cfg.block_n * triton.cdiv(triton.cdiv(shape.capacity, cfg.block_n), cfg.num_splits)
    return cfg, chunk, triton.cdiv(shape.capacity, chunk)


def _decode_shape(q_heads: int, k_cache: torch.Tensor, dtype: torch.dtype, emit_scores: bool) -> DecodeShape:
    batch, kv_heads, capacity, head_dim = k_cache.shape
    return DecodeShape(batch, q_heads, kv_heads, max(capacity, 1), head_dim, dtype_name(dtype), emit_scores)


def decode_splits(
    q_heads: int,
    k_cache: torch.Tensor,
    dtype: torch.dtype,
    *,
    emit_scores: bool,
    num_splits: Optional[int] = None,
    config: Optional[DecodeConfig] = None,
) -> int:
    """Non-empty key splits per (sequence, KV head) a decode call over `k_cache` `[B, Hkv, C, D]`
    launches: `num_splits` (else the tuned or heuristic count) cut to whole key blocks, so that
    fewer may remain than asked for. Arguments as `decode_workspace`'s."""
    shape = _decode_shape(q_heads, k_cache, dtype, emit_scores)
    return _split_plan(shape, k_cache.device, num_splits, config)[2]


def decode_workspace(
    q_heads: int,
    k_cache: torch.Tensor,
    dtype: torch.dtype,
    *,
    emit_scores: bool,
    num_splits: Optional[int] = None,
    config: Optional[DecodeConfig] = None,
) -> DecodeWorkspace:
    """Allocate the scratch `decode_attention_triton` needs for queries of `q_heads` heads in `dtype`.

    Args:
        k_cache: `[B, Hkv, C, D]`, the cache the workspace will serve.
        num_splits, config: as the same arguments of `decode_attention_triton`.
    """
    batch, _, capacity, head_dim = k_cache.shape
    splits = decode_splits(q_heads, k_cache, dtype, emit_scores=emit_scores, num_splits=num_splits, config=config)
    f32 = dict(dtype=torch.float32, device=k_cache.device)
    return DecodeWorkspace(
        torch.empty((batch, q_heads, splits, head_dim), **f32),
        torch.empty((batch, q_heads, splits), **f32),
        torch.empty((batch, q_heads, capacity if emit_scores else 0), **f32),
    )


def decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    scale: float,
    scores: Optional[torch.Tensor],
    *,
    out: Optional[torch.Tensor] = None,
    num_splits: Optional[int] = None,
    workspace: Optional[DecodeWorkspace] = None,
    config: Optional[DecodeConfig] = None,
    combine_config: Optional[CombineConfig] = None,
) -> torch.Tensor:
    """Launch split-K decode attention; optionally add this step's probabilities into `scores`.

    Args:
        q: `[B, Hq, 1, D]`.
        k_cache, v_cache: `[B, Hkv, C, D]`, any strides (never copied).
        cache_lens: `[B]` int32/int64 valid slots per sequence.
        scale: softmax scale.
        scores: `[B, Hkv, C]` float32 contiguous or None; updated in place on valid slots.
        out: optional preallocated `[B, Hq, 1, D]` output in `q.dtype`.
        num_splits: force the number of key splits per (sequence, KV head).
        workspace: scratch from `decode_workspace` for this shape (same `num_splits` and
            `config`), used instead of allocating.
        config, combine_config: launch parameters of the two stages; None picks the tuned
            configuration of this shape, else the heuristic.

    Returns:
        `[B, Hq, 1, D]` in `q.dtype`.
    """
    if q.stride(-1) != 1:
        q = q.contiguous()
    cache_lens = cache_lens.contiguous()
    batch, q_heads, _, head_dim = q.shape
    kv_heads, capacity = k_cache.shape[1], k_cache.shape[2]
    group = q_heads // kv_heads
    if out is None:
        out = torch.empty((batch, q_heads, 1, head_dim), dtype=q.dtype, device=q.device)
    if tuple(out.shape) != (batch, q_heads, 1, head_dim) or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(
            f"out: expected a [B, Hq, 1, D] = {[batch, q_heads, 1, head_dim]} {q.dtype} tensor with last-dim "
            f"stride 1; got shape {list(out.shape)}, dtype {out.dtype}, strides {out.stride()}"
        )
    if out.numel() == 0:
        return out
    if capacity == 0:
        return out.zero_()

    emit = scores is not None
    shape = _decode_shape(q_heads, k_cache, q.dtype, emit)
    cfg, chunk, num_splits = _split_plan(shape, q.device, num_splits, config)
    if combine_config is None:
        tuned = tuned_params("decode_combine", shape, q.device)
        combine_config = CombineConfig(**tuned) if tuned is not None else combine_heuristic(shape)
    if workspace is None:
        workspace = decode_workspace(q_heads, k_cache, q.dtype, emit_scores=emit, num_splits=num_splits, config=cfg)
    part_out, part_lse, logits = workspace
    expected = (
        (batch, q_heads, num_splits, head_dim),
        (batch, q_heads, num_splits),
        (batch, q_heads, capacity if emit else logits.shape[2]),
    )
    for name, tensor, expected_shape in zip(DecodeWorkspace._fields, workspace, expected):
        if tuple(tensor.shape) != expected_shape or tensor.dtype != torch.float32 or not tensor.is_contiguous():
            raise ValueError(
                f"workspace.{name}: expected a contiguous float32 tensor of shape {list(expected_shape)} "
                f"(from decode_workspace for this call); got {tensor.dtype} {list(tensor.shape)}"
            )
    scores_arg = scores if emit else logits
    block_g = max(_MIN_GROUP_ROWS, triton.next_power_of_2(group))
    grid = (batch * kv_heads, num_splits)

    _decode_partial_kernel[grid](
        q, k_cache, v_cache, cache_lens, part_out, part_lse, logits,
        q_heads, kv_heads, group, capacity, chunk, num_splits, float(scale) * _LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(3),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3),
        HEAD_DIM=head_dim, BLOCK_G=block_g, BLOCK_N=cfg.block_n, EMIT_LOGITS=emit,
        UPCAST=interpreter_enabled(), DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    combine_rows = triton.next_power_of_2(group)  # no tl.dot here: the group unpadded
    split_blocks = triton.next_power_of_2(num_splits)
    _decode_combine_kernel[grid](
        part_out, part_lse, logits, cache_lens, out, scores_arg,
        q_heads, kv_heads, group, capacity, chunk, num_splits,
        out.stride(0), out.stride(1), scores_arg.stride(0), scores_arg.stride(1),
        HEAD_DIM=head_dim, BLOCK_G=combine_rows, BLOCK_S=split_blocks,
        SPLIT_TILE=_combine_split_tile(combine_rows, head_dim, split_blocks, combine_config.num_warps),
        BLOCK_N=combine_config.block_n, EMIT_SCORES=emit,
        num_warps=combine_config.num_warps, num_stages=1,
    )  # fmt: skip
    return out
