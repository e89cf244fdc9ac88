"""Prefill attention: FlashAttention-2-style forward plus window importance scores.

`_prefill_forward_kernel` runs one program per (query block, batch x query head),
or, non-causal, per (row block, batch x KV head) with the group's query heads packed
into the rows: an online softmax in fp32 over key blocks, writing the output and the
log-sum-exp. `_prefill_scores_kernel` runs one program per (key block, batch x KV
head): it recomputes the logits of the last `score_window` queries of every query
head of the group against its keys and sums `exp(logit - lse)` with the final
log-sum-exp, so no attention matrix is stored and no atomics are needed.

Queries are end-aligned: query `i` of sequence `b` sits at position
`kv_lens[b] - Tq + i`, sees keys `j < kv_lens[b]` and, when causal, `j <= position`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from vase_triton.autotune.lookup import fitted_heuristic, tuned_params
from vase_triton.autotune.shapes import PrefillShape, ScoresShape, dtype_name
from vase_triton.backend import interpreter_enabled
from vase_triton.kernels.online_softmax import online_logsumexp_step, online_softmax_step

_LOG2E = 1.4426950408889634


@triton.jit
def _sequence_length(kv_lens_ptr, batch, k_len, HAS_KV_LENS: tl.constexpr):
    """Valid keys of sequence `batch`: `kv_lens[batch]`, or all `k_len` without lengths."""
    if HAS_KV_LENS:
        seq_len = tl.load(kv_lens_ptr + batch).to(tl.int32)
    else:
        seq_len = k_len
    return seq_len


@triton.jit
def _attend_key_block(
    # tiles and running state
    q, k_base, v_base, cols, offs_d, q_pos, seq_len, qk_scale, m_i, l_i, acc,
    # strides
    stride_kt, stride_vt,
    # meta-parameters
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, WRITE_OUT: tl.constexpr, UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Attend the query block `q` [BLOCK_M, HEAD_DIM] to keys `cols` [BLOCK_N]; returns `(m_i, l_i, acc)`.

    An unmasked block lies wholly inside every row's visible range; a masked one hides keys
    at or past `seq_len` and, when causal, those after each row's position `q_pos` [BLOCK_M].
    Without `WRITE_OUT` only the log-sum-exp state advances (values are not read).
    """
    k_ptrs = k_base + cols[:, None] * stride_kt + offs_d[None, :]
    col_valid = cols < seq_len
    if MASKED:
        k = tl.load(k_ptrs, mask=col_valid[:, None], other=0.0)  # [BLOCK_N, HEAD_DIM]
    else:
        k = tl.load(k_ptrs)  # [BLOCK_N, HEAD_DIM]
    if UPCAST:
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
    if MASKED:
        visible = col_valid[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= q_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
    if WRITE_OUT:
        v_ptrs = v_base + cols[:, None] * stride_vt + offs_d[None, :]
        if MASKED:
            v = tl.load(v_ptrs, mask=col_valid[:, None], other=0.0)  # [BLOCK_N, HEAD_DIM]
        else:
            v = tl.load(v_ptrs)  # [BLOCK_N, HEAD_DIM]
        if UPCAST:
            v = v.to(tl.float32)
        m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, DOT_PRECISION)
    else:
        m_i, l_i = online_logsumexp_step(s, m_i, l_i)
    return m_i, l_i, acc


@triton.jit
def _prefill_forward_kernel(
    # pointers
    q_ptr,
    k_ptr,
    v_ptr,
    kv_lens_ptr,
    out_ptr,
    lse_ptr,
    # sizes
    q_heads,
    q_len,
    k_len,
    group,
    qk_scale,
    # strides
    stride_qb,
    stride_qh,
    stride_qt,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_ob,
    stride_oh,
    stride_ot,
    stride_lb,
    stride_lh,
    stride_lt,
    # meta-parameters
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_KV_LENS: tl.constexpr,
    WRITE_OUT: tl.constexpr,
    PACK_GQA: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    tl.static_assert(not (CAUSAL and PACK_GQA), "a packed block mixes query positions: causal launches do not pack")
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    if PACK_GQA:
        # Program per (row block, batch x KV head); row r is query head r // q_len of the
        # group, query r % q_len, so every key tile loaded serves the whole group.
        kv_heads = q_heads // group
        batch = pid_bh // kv_heads
        kv_head = pid_bh % kv_heads
        row_head = kv_head * group + offs_m // q_len  # [BLOCK_M]
        row_t = offs_m % q_len  # [BLOCK_M]
        row_valid = offs_m < group * q_len
    else:
        batch = pid_bh // q_heads
        row_head = pid_bh % q_heads
        kv_head = row_head // group
        row_t = offs_m
        row_valid = offs_m < q_len

    seq_len = _sequence_length(kv_lens_ptr, batch, k_len, HAS_KV_LENS)

    offs_n = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    offs_d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    q_pos = seq_len - q_len + row_t  # [BLOCK_M]

    # Keys in [0, full_end) are visible to every row of the block; [full_end, stop) need masks.
    if CAUSAL:
        first_pos = seq_len - q_len + pid_m * BLOCK_M
        last_pos = first_pos + BLOCK_M - 1
        stop = tl.maximum(tl.minimum(seq_len, last_pos + 1), 0)
        full_end = tl.maximum(tl.minimum(seq_len, first_pos + 1), 0)
    else:
        stop = seq_len
        full_end = seq_len
    full_end = (full_end // BLOCK_N) * BLOCK_N

    q_rows = q_ptr + batch * stride_qb + row_head * stride_qh + row_t * stride_qt  # [BLOCK_M]
    q = tl.load(q_rows[:, None] + offs_d[None, :], mask=row_valid[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)  # [BLOCK_M, HEAD_DIM]
    k_base = k_ptr + batch * stride_kb + kv_head * stride_kh
    v_base = v_ptr + batch * stride_vb + kv_head * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    for start_n in range(0, full_end, BLOCK_N):
        m_i, l_i, acc = _attend_key_block(
            q, k_base, v_base, start_n + offs_n, offs_d, q_pos, seq_len, qk_scale, m_i, l_i, acc,
            stride_kt, stride_vt,
            MASKED=False, CAUSAL=CAUSAL, WRITE_OUT=WRITE_OUT, UPCAST=UPCAST, DOT_PRECISION=DOT_PRECISION,
        )  # fmt: skip
    for start_n in range(full_end, stop, BLOCK_N):
        m_i, l_i, acc = _attend_key_block(
            q, k_base, v_base, start_n + offs_n, offs_d, q_pos, seq_len, qk_scale, m_i, l_i, acc,
            stride_kt, stride_vt,
            MASKED=True, CAUSAL=CAUSAL, WRITE_OUT=WRITE_OUT, UPCAST=UPCAST, DOT_PRECISION=DOT_PRECISION,
        )  # fmt: skip

    seen = l_i > 0.0
    inv_l = tl.where(seen, 1.0 / tl.where(seen, l_i, 1.0), 0.0)
    out = acc * inv_l[:, None]
    lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453, float("-inf"))

    if WRITE_OUT:
        out_rows = out_ptr + batch * stride_ob + row_head * stride_oh + row_t * stride_ot  # [BLOCK_M]
        tl.store(out_rows[:, None] + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])
    tl.store(lse_ptr + batch * stride_lb + row_head * stride_lh + row_t * stride_lt, lse, mask=row_valid)


@triton.jit
def _prefill_scores_kernel(
    # pointers
    q_ptr,
    k_ptr,
    lse_ptr,
    kv_lens_ptr,
    scores_ptr,
    # sizes
    kv_heads,
    q_len,
    k_len,
    group,
    window,
    qk_scale,
    # strides
    stride_qb,
    stride_qh,
    stride_qt,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_lb,
    stride_lh,
    stride_lt,
    stride_sb,
    stride_sh,
    stride_st,
    # meta-parameters
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_KV_LENS: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    batch = pid_bh // kv_heads
    kv_head = pid_bh % kv_heads

    seq_len = _sequence_length(kv_lens_ptr, batch, k_len, HAS_KV_LENS)

    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    offs_r = tl.arange(0, BLOCK_M)  # [BLOCK_M]
    offs_d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    col_valid = cols < seq_len
    total = tl.zeros([BLOCK_N], dtype=tl.float32)

    if pid_n * BLOCK_N < seq_len:
        k_base = k_ptr + batch * stride_kb + kv_head * stride_kh
        k = tl.load(k_base + cols[:, None] * stride_kt + offs_d[None, :], mask=col_valid[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)  # [BLOCK_N, HEAD_DIM]
        q_base = q_ptr + batch * stride_qb + kv_head * group * stride_qh
        l_base = lse_ptr + batch * stride_lb + kv_head * group * stride_lh
        # Rows enumerate (query head of the group, window query): row r is head r // window,
        # query q_len - window + r % window.
        for start_r in range(0, group * window, BLOCK_M):
            rows = start_r + offs_r
            row_valid = rows < group * window
            row_head = rows // window
            row_t = q_len - window + rows % window
            q = tl.load(
                q_base + row_head[:, None] * stride_qh + row_t[:, None] * stride_qt + offs_d[None, :],
                mask=row_valid[:, None],
                other=0.0,
            )
            if UPCAST:
                q = q.to(tl.float32)  # [BLOCK_M, HEAD_DIM]
            lse = tl.load(l_base + row_head * stride_lh + row_t * stride_lt, mask=row_valid, other=float("-inf"))
            row_seen = lse > float("-inf")
            lse2 = tl.where(row_seen, lse * 1.4426950408889634, 0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
            visible = row_seen[:, None] & col_valid[None, :]
            if CAUSAL:
                q_pos = seq_len - q_len + row_t
                visible = visible & (cols[None, :] <= q_pos[:, None])
            # A probability is at most 1, also where the recomputed logit rounds above the forward's max.
            p = tl.where(visible, tl.minimum(tl.exp2(s - lse2[:, None]), 1.0), 0.0)
            total += tl.sum(p, axis=0)

    tl.store(scores_ptr + batch * stride_sb + kv_head * stride_sh + cols * stride_st, total, mask=cols < k_len)


class TileConfig(NamedTuple):
    """Launch parameters of a prefill kernel: `[BLOCK_M, BLOCK_N]` tiles, warps and pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def _interpreter_block_m(rows: int) -> int:
    # Interpreted tl.dot costs the full padded tile: size row blocks to the rows there are.
    return min(128, max(16, triton.next_power_of_2(rows)))


def forward_heuristic(shape: PrefillShape) -> TileConfig:
    """Tiles of the forward kernel by head dim and dtype (interpreter: row blocks sized to the rows)."""
    if interpreter_enabled():
        return TileConfig(_interpreter_block_m(shape.rows()), 128, 4, 1)
    if shape.dtype == "float32":
        return TileConfig(64, 32, 4, 2) if shape.head_dim <= 128 else TileConfig(32, 32, 4, 1)
    if shape.head_dim <= 64:
        return TileConfig(128, 64, 4, 3)
    if shape.head_dim <= 128:
        return TileConfig(128, 64, 8, 3)
    return TileConfig(64, 32, 4, 2)


def scores_heuristic(shape: ScoresShape) -> TileConfig:
    """Tiles of the scores kernel (rows = group x window queries, by key columns)."""
    if interpreter_enabled():
        return TileConfig(_interpreter_block_m(shape.window * (shape.q_heads // shape.kv_heads)), 256, 4, 1)
    if shape.dtype == "float32":
        return TileConfig(32, 64, 4, 2)
    if shape.head_dim <= 128:
        return TileConfig(64, 128, 8, 3)
    return TileConfig(64, 64, 8, 2)


def _tuned_or_heuristic(kernel: str, shape, device: torch.device, heuristic) -> TileConfig:
    """The stored tiles of this launch, else the heuristic's, on CUDA with fewer stages or smaller
    tiles where the device has less shared memory than they need (`fitted_heuristic`)."""
    tuned = tuned_params(kernel, shape, device)
    if tuned is not None:
        return TileConfig(**tuned)
    config = heuristic(shape)
    if device.type != "cuda":
        return config
    return TileConfig(**fitted_heuristic(kernel, shape, device, config._asdict()))


def _dot_settings(dtype: torch.dtype) -> tuple[bool, str]:
    """(upcast loaded tiles to fp32, tl.dot input precision) for an input dtype."""
    upcast = interpreter_enabled()
    return upcast, ("ieee" if dtype == torch.float32 else "tf32")


def _unit_last_stride(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def _check_buffer(name: str, buffer: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, device) -> None:
    if tuple(buffer.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}; got {list(buffer.shape)}")
    if buffer.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}; got {buffer.dtype}")
    if buffer.device != device:
        raise ValueError(f"{name}: expected a tensor on {device}; got one on {buffer.device}")
    if buffer.numel() > 0 and buffer.stride(-1) != 1:
        raise ValueError(f"{name}: expected last-dim stride 1; got strides {buffer.stride()}")


def launch_forward(
    q, k, v, lens, out, lse, scale: float, causal: bool, write_out: bool, config: Optional[TileConfig] = None
) -> None:
    """Forward kernel over `[B, Hq, Tq, D]` queries: `lse` always, `out` when `write_out`.

    A non-causal launch packs the query heads of each KV group into its row blocks
    (`group * Tq` rows per KV head), so short query windows fill the tiles and every key tile
    is loaded once per group rather than once per query head.

    `config`: launch parameters; None picks the tuned configuration of this shape, else the heuristic.
    """
    batch, q_heads, q_len, head_dim = q.shape
    kv_heads = k.shape[1]
    upcast, precision = _dot_settings(q.dtype)
    shape = PrefillShape(batch, q_heads, kv_heads, q_len, k.shape[2], head_dim, dtype_name(q.dtype), causal, write_out)
    cfg = config if config is not None else _tuned_or_heuristic("prefill_forward", shape, q.device, forward_heuristic)
    pack_gqa = not causal  # a program column covers `shape.rows()` query rows: the group's when packed
    grid = (triton.cdiv(shape.rows(), cfg.block_m), batch * (kv_heads if pack_gqa else q_heads))
    _prefill_forward_kernel[grid](
        q, k, v, lens if lens is not None else q, out, lse,
        q_heads, q_len, k.shape[2], q_heads // kv_heads, float(scale) * _LOG2E,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0), lse.stride(1), lse.stride(2),
        HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        CAUSAL=causal, HAS_KV_LENS=lens is not None, WRITE_OUT=write_out, PACK_GQA=pack_gqa,
        UPCAST=upcast, DOT_PRECISION=precision, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def launch_scores(
    q, k, lse, lens, scores, scale: float, causal: bool, window: int, config: Optional[TileConfig] = None
) -> None:
    """Scores kernel: the probability mass of the last `window` queries of `q`, per key, into `scores`.

    `config`: launch parameters; None picks the tuned configuration of this shape, else the heuristic.
    """
    batch, q_heads, q_len, head_dim = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    group = q_heads // kv_heads
    upcast, precision = _dot_settings(q.dtype)
    cfg = config
    if cfg is None:
        shape = ScoresShape(batch, q_heads, kv_heads, window, k_len, head_dim, dtype_name(q.dtype), causal)
        cfg = _tuned_or_heuristic("prefill_scores", shape, q.device, scores_heuristic)
    _prefill_scores_kernel[(triton.cdiv(k_len, cfg.block_n), batch * kv_heads)](
        q, k, lse, lens if lens is not None else q, scores,
        kv_heads, q_len, k_len, group, window, float(scale) * _LOG2E,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        lse.stride(0), lse.stride(1), lse.stride(2),
        scores.stride(0), scores.stride(1), scores.stride(2),
        HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        CAUSAL=causal, HAS_KV_LENS=lens is not None, UPCAST=upcast, DOT_PRECISION=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def prefill_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_lens: Optional[torch.Tensor],
    scale: float,
    causal: bool,
    score_window: int,
    *,
    out: Optional[torch.Tensor] = None,
    lse: Optional[torch.Tensor] = None,
    scores: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the prefill forward (and, when `score_window > 0`, the scores kernel).

    Args:
        q: `[B, Hq, Tq, D]`; k, v: `[B, Hkv, Tk, D]`, any strides (last-dim stride 1 avoids a copy).
        kv_lens: `[B]` int32/int64 valid keys per sequence, or None for all `Tk`.
        scale: softmax scale; causal: mask keys after each query's position.
        score_window: number of last queries whose probabilities are summed into `scores`.
        out, lse, scores: optional preallocated outputs, written in place.

    Returns:
        out `[B, Hq, Tq, D]` in `q.dtype`, lse `[B, Hq, Tq]` float32, scores `[B, Hkv, Tk]`
        float32 (`[B, Hkv, 0]` when `score_window == 0`).
    """
    q, k, v = _unit_last_stride(q), _unit_last_stride(k), _unit_last_stride(v)
    batch, q_heads, q_len, head_dim = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    score_len = k_len if score_window > 0 else 0

    if out is None:
        out = torch.empty((batch, q_heads, q_len, head_dim), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((batch, q_heads, q_len), dtype=torch.float32, device=q.device)
    if scores is None:
        scores = torch.empty((batch, kv_heads, score_len), dtype=torch.float32, device=q.device)
    _check_buffer("out", out, (batch, q_heads, q_len, head_dim), q.dtype, q.device)
    _check_buffer("lse", lse, (batch, q_heads, q_len), torch.float32, q.device)
    _check_buffer("scores", scores, (batch, kv_heads, score_len), torch.float32, q.device)
    if out.numel() == 0:
        return out, lse, scores

    lens = kv_lens.contiguous() if kv_lens is not None else None
    launch_forward(q, k, v, lens, out, lse, scale, causal, write_out=True)
    if score_window > 0:
        launch_scores(q, k, lse, lens, scores, scale, causal, score_window)
    return out, lse, scores


def candidate_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    candidate_lens: torch.Tensor,
    scale: float,
    q_valid: Optional[torch.Tensor],
) -> torch.Tensor:
    """Mean attention of a query window over the candidate keys only (`vase_triton.ops.candidate_attention`).

    Two launches, no attention matrix: the forward kernel without values gives each query's
    log-sum-exp over keys `[0, candidate_lens[b])` (invalid queries then get `-inf`, so they
    contribute nothing), and the scores kernel sums `exp(logit - lse)` per key.

    Args:
        q: `[B, Hq, W, D]`; k: `[B, Hkv, N, D]`; candidate_lens: `[B]` int; q_valid: `[B, W]` bool or None.

    Returns:
        `[B, Hkv, N]` float32, the probability sums divided by `W * Hq / Hkv`.
    """
    q, k = _unit_last_stride(q), _unit_last_stride(k)
    batch, q_heads, window, _ = q.shape
    kv_heads, num_slots = k.shape[1], k.shape[2]
    scores = torch.zeros((batch, kv_heads, num_slots), dtype=torch.float32, device=q.device)
    if batch == 0 or window == 0 or num_slots == 0:
        return scores
    lens = candidate_lens.contiguous()
    lse = torch.empty((batch, q_heads, window), dtype=torch.float32, device=q.device)
    launch_forward(q, k, k, lens, q, lse, scale, causal=False, write_out=False)
    if q_valid is not None:
        lse.masked_fill_(~q_valid.view(batch, 1, window), float("-inf"))
    launch_scores(q, k, lse, lens, scores, scale, causal=False, window=window)
    return scores.div_(window * (q_heads // kv_heads))
