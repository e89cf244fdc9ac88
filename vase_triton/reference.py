"""Pure-PyTorch twin of every op: the specification, the CPU path and the test oracle.

Everything here favours clarity over speed: attention materialises its score
matrix (prefill one block of queries at a time, so that memory stays bounded),
eviction uses `sort` / `gather` / `scatter_`. The exceptions are on a CPU: a decode
step that keeps no scores, and a prefill's output and log-sum-exp outside float64,
which PyTorch's fused attention computes (tested against the explicit path, which
float64 always takes). Optimised code never imports this module; tests compare the
Triton kernels against it in float64.

Shapes use `B` batch, `Hq` query heads, `Hkv` key/value heads (`Hq % Hkv == 0`,
`group = Hq // Hkv`), `Tq` queries, `Tk` keys, `C` cache capacity, `D` head dim.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from vase_triton.cache_tensors import CacheTensors, slot_mask
from vase_triton.config import MIN_TEMPERATURE
from vase_triton.seeding import generator_seed


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _grouped_matmul(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """`q [B, Hq, M, X] @ kv [B, Hkv, X, Y]` with query head `h` using KV head `h // (Hq / Hkv)`: `[B, Hq, M, Y]`.

    The query heads of a group are stacked along `M`, so the keys/values are never copied
    per query head.
    """
    batch, q_heads, rows, inner = q.shape
    kv_heads = kv.shape[1]
    grouped = q.reshape(batch, kv_heads, (q_heads // kv_heads) * rows, inner)
    return torch.matmul(grouped, kv).view(batch, q_heads, rows, kv.shape[-1])


def projected_energy(
    keys: torch.Tensor, values: torch.Tensor, projection: torch.Tensor, lengths: torch.Tensor, *, window: int
) -> torch.Tensor:
    """`||k G||² · ||v G||²` of every candidate slot `[0, lengths[b] - window)`, 0 elsewhere.

    Args:
        keys, values: `[B, Hkv, N, D]`; projection: `[B, Hkv, D, R]`; lengths: `[B]`.

    Returns:
        `[B, Hkv, N]` float32 (float64 for float64 inputs), computed in float32 (float64).
    """
    dtype = _accumulation_dtype(keys.dtype)
    num_slots = keys.shape[2]
    candidates = slot_mask(lengths, num_slots, window)  # [B, 1, N]
    projection = projection.to(dtype)
    key_energy = (keys.to(dtype) @ projection).square().sum(dim=-1)  # [B, Hkv, N]
    value_energy = (values.to(dtype) @ projection).square().sum(dim=-1)
    return torch.where(candidates, key_energy * value_energy, 0.0)


def mean_key_similarity(keys: torch.Tensor, lengths: torch.Tensor, *, window: int) -> torch.Tensor:
    """Each candidate key's mean cosine similarity to the other candidates of its row, 0 elsewhere.

    Candidates of row `b` are slots `[0, lengths[b] - window)`; keys are normalised as
    `k / max(||k||, 1e-12)` (a zero key has similarity 0 to everything); the mean divides by
    `max(n_candidates - 1, 1)`.

    Args:
        keys: `[B, Hkv, N, D]`; lengths: `[B]`.

    Returns:
        `[B, Hkv, N]` float32 (float64 for float64 keys), computed in float32 (float64).
    """
    dtype = _accumulation_dtype(keys.dtype)
    candidates = slot_mask(lengths, keys.shape[2], window)  # [B, 1, N]
    unit = torch.nn.functional.normalize(keys.to(dtype), dim=-1)
    unit = torch.where(candidates.unsqueeze(-1), unit, 0.0)  # [B, Hkv, N, D]
    total = unit.sum(dim=2, keepdim=True)  # [B, Hkv, 1, D]
    self_similarity = unit.square().sum(dim=-1)  # [B, Hkv, N]
    similarity_sum = (unit @ total.transpose(-1, -2)).squeeze(-1)  # [B, Hkv, N]
    n_candidates = candidates.sum(dim=-1, keepdim=True).to(dtype)  # [B, 1, 1]
    return torch.where(candidates, (similarity_sum - self_similarity) / (n_candidates - 1).clamp_min(1), 0.0)


def pooled_candidates(attention: torch.Tensor, lengths: torch.Tensor, *, window: int, width: int) -> torch.Tensor:
    """Average pool of width `width` (odd) along each row's candidates `[0, min(lengths[b], N) - window)`.

    Slots outside the candidates count as 0 and the divisor is always `width` (zero padding,
    `count_include_pad`); slots outside the candidates score 0.

    Args:
        attention: `[B, Hkv, N]` float; lengths: `[B]`.

    Returns:
        `[B, Hkv, N]` float32 (float64 for float64 inputs).
    """
    batch, kv_heads, num_slots = attention.shape
    attention = attention.to(_accumulation_dtype(attention.dtype))
    candidates = slot_mask(lengths, num_slots, window)  # [B, 1, N]
    observed = torch.where(candidates, attention, 0.0)
    pooled = torch.nn.functional.avg_pool1d(
        observed.reshape(batch * kv_heads, 1, num_slots),
        kernel_size=width, stride=1, padding=width // 2, count_include_pad=True,
    ).view(batch, kv_heads, num_slots)  # fmt: skip
    return torch.where(candidates, pooled, 0.0)


def masked_logits(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    scale: Optional[float] = None,
    causal: bool = True,
    kv_lens: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Scaled attention logits with end-aligned queries; hidden keys get `-inf`.

    Query `i` of sequence `b` sits at position `L_b - Tq + i`, where `L_b = kv_lens[b]`
    (or `Tk`). It sees keys `j < L_b`, and with `causal` only `j <= L_b - Tq + i`.

    Args:
        q: `[B, Hq, Tq, D]`.
        k: `[B, Hkv, Tk, D]`.
        kv_lens: `[B]` int, valid keys per sequence, or None for all `Tk`.

    Returns:
        `[B, Hq, Tq, Tk]` in float32 (float64 for float64 inputs).
    """
    batch, _, q_len, head_dim = q.shape
    k_len = k.shape[2]
    acc = _accumulation_dtype(q.dtype)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    logits = _grouped_matmul(q.to(acc), k.to(acc).transpose(-1, -2)).mul_(scale)  # [B, Hq, Tq, Tk]

    if kv_lens is None:
        lens = torch.full((batch,), k_len, dtype=torch.long, device=q.device)
    else:
        lens = kv_lens.to(device=q.device, dtype=torch.long)
    visible = _visible_keys(q_len, k_len, lens, causal)  # [B, Tq, Tk]
    return logits.masked_fill_(~visible.unsqueeze(1), float("-inf"))


def _visible_keys(q_len: int, k_len: int, lens: torch.Tensor, causal: bool) -> torch.Tensor:
    """`[B, Tq, Tk]` bool: key `j < lens[b]` is seen by end-aligned query `i` (with `causal`, when
    `j <= lens[b] - Tq + i`), as `masked_logits` states."""
    batch = lens.shape[0]
    key_idx = torch.arange(k_len, device=lens.device)
    visible = key_idx.view(1, 1, k_len) < lens.view(batch, 1, 1)  # [B, 1, Tk]
    if not causal:
        return visible.expand(batch, q_len, k_len)
    q_pos = lens.view(batch, 1) - q_len + torch.arange(q_len, device=lens.device).view(1, q_len)
    return visible & (key_idx.view(1, 1, k_len) <= q_pos.view(batch, q_len, 1))


def _softmax_and_lse(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the last dim, computed in place of `logits`, and each row's log-sum-exp.

    A row of only `-inf` (or of no key) gives all-zero probabilities and a log-sum-exp of
    `-inf`. The log-sum-exp is the softmax's own max and sum, `max + log(sum(exp(x - max)))`:
    no second pass over the logits.

    Returns:
        probs: `logits.shape`, in `logits`' storage; lse: `logits.shape[:-1]`.
    """
    if logits.shape[-1] == 0:
        return torch.zeros_like(logits), logits.new_full(logits.shape[:-1], float("-inf"))
    row_max = logits.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = logits.sub_(row_max).exp_()
    total = weights.sum(dim=-1, keepdim=True)
    lse = (row_max + total.log()).squeeze(-1)
    return weights.div_(total.clamp_min(torch.finfo(logits.dtype).tiny)), lse


def _is_finite(tensor: torch.Tensor) -> bool:
    """Whether no element of `tensor` is NaN or inf, read on the host (free on a CPU).

    It checks the sum's finiteness, which NaN and inf anywhere reach: two ops, 5 µs at a small
    decode step's shape, where `isfinite(...).all()` takes 37. A sum that overflows only
    answers False, which sends the caller down its slower exact path.
    """
    return math.isfinite(tensor.sum().item())


def _readable_values(v: torch.Tensor, kv_lens: Optional[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """`v` `[B, Hkv, Tk, D]` (values, or keys) as `dtype`, the slots at or past `kv_lens[b]` zeroed: they are never
    read, and a zero probability times NaN or inf garbage there would still be NaN. One copy:
    the conversion's, when it makes one."""
    values = v.to(dtype)
    if kv_lens is None:
        return values
    past = torch.arange(v.shape[2], device=v.device).view(1, 1, -1, 1) >= kv_lens.view(-1, 1, 1, 1)
    return values.masked_fill_(past, 0) if values is not v else values.masked_fill(past, 0)


def _attend_values(probs: torch.Tensor, v: torch.Tensor, kv_lens: Optional[torch.Tensor]) -> torch.Tensor:
    """`probs [B, Hq, Tq, Tk] @ v [B, Hkv, Tk, D]` per KV group in `probs.dtype`, reading only
    the slots before `kv_lens[b]`: `[B, Hq, Tq, D]`.

    Unread slots have probability 0, and 0 times a finite value is 0, so the plain product
    is exact unless an unread slot holds NaN or inf. On a CPU the product is checked (a
    host read, free there) and redone over values zeroed past `kv_lens` only when it is not
    finite (`_is_finite`): zeroing copies the whole cache, which there takes several times
    the product. Elsewhere the values are always zeroed, as a check would wait for the device.
    """
    if kv_lens is not None and v.device.type == "cpu":
        out = _grouped_matmul(probs, v.to(probs.dtype))
        if _is_finite(out):
            return out
    return _grouped_matmul(probs, _readable_values(v, kv_lens, probs.dtype))


def attention_probabilities(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    scale: Optional[float] = None,
    causal: bool = True,
    kv_lens: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Softmax of `masked_logits`: `[B, Hq, Tq, Tk]`, all-zero for a query that sees no key."""
    return _softmax_and_lse(masked_logits(q, k, scale=scale, causal=causal, kv_lens=kv_lens))[0]


# Logits one block of prefill queries may hold (`[B, Hq, rows, Tk]` elements): 64 MiB in float32.
PREFILL_BLOCK_LOGITS = 1 << 24
# Queries one masked block of the fused CPU prefill takes at most: a block computes the keys
# past its first query's position too, which its mask then hides; 512 keeps that waste to
# about 512 / Tk of the causal work.
FUSED_PREFILL_ROWS = 512
# PyTorch's fused CPU attention that also returns each query's log-sum-exp (an ATen op).
_CPU_FLASH_ATTENTION = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: Optional[float] = None,
    causal: bool = True,
    kv_lens: Optional[torch.Tensor] = None,
    score_window: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Attention of `Tq` end-aligned queries over `Tk` keys, plus window importance scores.

    Queries are taken in blocks of rows whose logits fit in `PREFILL_BLOCK_LOGITS`
    elements, each block over the keys any of its queries can see (with `causal`, those
    before the last query's position in the longest row; reading `kv_lens` on the host):
    the same result in bounded memory and, causal, about half the work of one block. On a
    CPU, inputs other than float64 whose score window holds at most 3/4 of the queries take
    their output and log-sum-exp from PyTorch's fused attention (`_fused_prefill`), and only
    the score window's queries from the blocks.

    Args:
        q: `[B, Hq, Tq, D]`; k, v: `[B, Hkv, Tk, D]`; kv_lens: `[B]` int or None.
        score_window: number of last queries whose probabilities are summed into `scores`.

    Returns:
        out: `[B, Hq, Tq, D]` in `q.dtype` (zeros for a query that sees no key).
        lse: `[B, Hq, Tq]` float32 log-sum-exp of the scaled logits (`-inf` for such a query).
        scores: `[B, Hkv, Tk]` float32 when `score_window > 0`, else None: the probability
            mass each key receives from the last `score_window` queries of all query heads of
            its group. Each row sums to `score_window * Hq / Hkv` over the valid keys.
    """
    batch, q_heads, q_len, head_dim = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    group = q_heads // kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    lens = torch.full((batch,), k_len, device=q.device) if kv_lens is None else kv_lens.to(q.device, torch.long)
    longest = min(k_len, int(lens.max())) if batch > 0 else 0
    # A window of most queries needs their explicit probabilities anyway, and the blocks give
    # the output in the same pass: at 1,024 queries, 91-95 ms alone against 42-80 ms fused with
    # a window of up to 768 queries, 109 ms with all of them.
    fused = None
    if 4 * score_window <= 3 * q_len:
        fused = _fused_prefill(q, k[:, :, :longest], v[:, :, :longest], lens, scale=scale, causal=causal)
    if fused is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.empty((batch, q_heads, q_len), dtype=torch.float32, device=q.device)
    else:
        out, lse = fused
    window_sums = torch.zeros((batch, kv_heads, k_len), dtype=_accumulation_dtype(q.dtype), device=q.device)
    rows = max(1, PREFILL_BLOCK_LOGITS // max(1, batch * q_heads * k_len))
    # With a fused output, the blocks only give the score window's probabilities.
    first_query = 0 if fused is None else q_len - score_window
    for start in range(first_query, q_len, rows):
        stop = min(q_len, start + rows)
        block_lens, seen = _query_block_keys(lens, longest, q_len, stop, causal)
        logits = masked_logits(q[:, :, start:stop], k[:, :, :seen], scale=scale, causal=causal, kv_lens=block_lens)
        probs, block_lse = _softmax_and_lse(logits)  # [B, Hq, stop - start, seen]
        if fused is None:
            out[:, :, start:stop] = _attend_values(probs, v[:, :, :seen], block_lens)
            lse[:, :, start:stop] = block_lse
        first = max(start, q_len - score_window)  # the block's first query in the score window
        if score_window > 0 and first < stop:
            window = probs[:, :, first - start :].sum(dim=2)  # [B, Hq, seen]
            window_sums[:, :, :seen] += window.view(batch, kv_heads, group, seen).sum(dim=2)
    return out, lse, window_sums.to(torch.float32) if score_window > 0 else None


def _query_block_keys(
    lens: torch.Tensor, longest: int, q_len: int, stop: int, causal: bool
) -> tuple[torch.Tensor, int]:
    """(per-row key counts `[B]`, keys to read) of the block of end-aligned queries ending at `stop`.

    The block's queries are the last of keys `lens - (Tq - stop)`, whose causal masks leave
    them the same keys; without `causal` they see every valid key.
    """
    if not causal:
        return lens, longest
    return (lens - (q_len - stop)).clamp_min(0), max(0, longest - (q_len - stop))


def _fused_prefill(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor, *, scale: float, causal: bool
) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """`prefill_attention`'s output and log-sum-exp by PyTorch's fused CPU attention, or None
    where it does not apply (not a CPU, float64 inputs, no query or no key, or an ATen
    without the op).

    Computed in float32 over keys and values repeated per query head. Causal rows of one
    length with at least as many keys as queries run `_prefix_then_causal` (no mask read);
    any other case runs blocks of at most `FUSED_PREFILL_ROWS` queries, each over the keys
    its queries can see, with an additive mask. A query that sees no key gets a zero output and
    a log-sum-exp of `-inf`. As in `_fused_decode_output`, an output that is not finite is
    redone over keys and values zeroed past `lens` (a hidden slot's garbage reaches the
    product). At one 4,096-token prompt of Qwen3's head layout (8 query heads over 2 KV
    heads, D 128, float32, one thread) `prefill_attention` takes 465 ms a layer with it
    (a 64-query score window included) where the blocks take 748 and SDPA alone 432.

    Args:
        q: `[B, Hq, Tq, D]`; k, v: `[B, Hkv, L, D]` where L is the longest of `lens` `[B]`.

    Returns:
        out `[B, Hq, Tq, D]` in `q.dtype` and lse `[B, Hq, Tq]` float32, or None.
    """
    batch, q_heads, q_len, _ = q.shape
    longest = k.shape[2]
    usable = q.device.type == "cpu" and q.dtype in (torch.float32, torch.float16, torch.bfloat16)
    if _CPU_FLASH_ATTENTION is None or not usable or q_len == 0 or longest == 0:
        return None
    group = q_heads // k.shape[1]
    lengths = lens.tolist()  # a host read, free on a CPU
    unmasked = causal and q_len <= longest and min(lengths) == longest
    queries = q.float()

    def attend(keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = (tensor.repeat_interleave(group, dim=1) for tensor in (keys, values))  # [B, Hq, L, D]
        if unmasked:
            return _prefix_then_causal(queries, keys, values, scale)
        out = torch.empty(queries.shape, dtype=torch.float32)
        lse = torch.empty(q.shape[:3], dtype=torch.float32)
        for start in range(0, q_len, FUSED_PREFILL_ROWS):
            stop = min(q_len, start + FUSED_PREFILL_ROWS)
            block_lens, seen = _query_block_keys(lens, longest, q_len, stop, causal)
            visible = _visible_keys(stop - start, seen, block_lens, causal)  # [B, rows, seen]
            mask = torch.zeros(visible.shape, dtype=torch.float32).masked_fill_(~visible, float("-inf"))
            out[:, :, start:stop], lse[:, :, start:stop] = _CPU_FLASH_ATTENTION(
                queries[:, :, start:stop], keys[:, :, :seen], values[:, :, :seen], 0.0, False,
                attn_mask=mask.unsqueeze(1), scale=scale,
            )  # fmt: skip
        return out, lse

    out, lse = attend(k.float(), v.float())
    if not _is_finite(out):
        out, lse = attend(_readable_values(k, lens, torch.float32), _readable_values(v, lens, torch.float32))
    # A query's visible keys are a prefix: it sees none when it does not see key 0.
    sees_none = ~_visible_keys(q_len, 1, lens, causal).view(batch, 1, q_len)
    out.masked_fill_(sees_none.unsqueeze(-1), 0.0)
    lse.masked_fill_(sees_none, float("-inf"))
    return out.to(q.dtype), lse


def _prefix_then_causal(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of `Tq` end-aligned queries over `L >= Tq` keys by PyTorch's fused CPU
    op without a mask tensor: the last `Tq` keys with the op's own causal mask (square, so it
    is exact), the `L - Tq` keys before them, which every query sees, unmasked, and the two
    merged by their log-sum-exps. A chunk of a long prompt over a compressed cache (4,096
    queries over 256 + 4,096 keys, 8 query heads over 2 KV heads, D 128, one thread) takes
    511 ms so, where masked blocks take 661.

    Args:
        queries: `[B, Hq, Tq, D]`; keys, values: `[B, Hq, L, D]`, all float32.

    Returns:
        out `[B, Hq, Tq, D]` and lse `[B, Hq, Tq]`, float32.
    """
    prefix = keys.shape[2] - queries.shape[2]
    out, lse = _CPU_FLASH_ATTENTION(queries, keys[:, :, prefix:], values[:, :, prefix:], 0.0, True, scale=scale)
    if prefix == 0:
        return out, lse
    seen_out, seen_lse = _CPU_FLASH_ATTENTION(
        queries, keys[:, :, :prefix], values[:, :, :prefix], 0.0, False, scale=scale
    )
    total = torch.logaddexp(lse, seen_lse)
    out = out.mul_((lse - total).exp_().unsqueeze(-1)).add_(seen_out.mul_((seen_lse - total).exp_().unsqueeze(-1)))
    return out, total


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    *,
    scale: Optional[float] = None,
    scores: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One decode step over a static cache; optionally accumulates importance in place.

    Args:
        q: `[B, Hq, 1, D]`.
        k_cache, v_cache: `[B, Hkv, C, D]`; only the first `cache_lens[b]` slots are read.
        cache_lens: `[B]` int, valid slots per sequence.
        scores: `[B, Hkv, C]` float32 or None. This step's probabilities, summed over the
            query heads of each KV group, are added into it; slots at or past
            `cache_lens[b]` are left unchanged.

    Returns:
        `[B, Hq, 1, D]` in `q.dtype`.
    """
    batch, q_heads = q.shape[0], q.shape[1]
    kv_heads, capacity = k_cache.shape[1], k_cache.shape[2]
    if scores is None and q.device.type == "cpu" and capacity > 0:
        lengths = cache_lens.tolist()  # a host read, free on a CPU
        if lengths and min(lengths) > 0:  # the slots past the longest row are never read
            longest = max(lengths)
            full_rows = min(lengths) == longest
            return _fused_decode_output(
                q, k_cache[:, :, :longest], v_cache[:, :, :longest], cache_lens, scale, full_rows=full_rows
            )
    probs = attention_probabilities(q, k_cache, scale=scale, causal=False, kv_lens=cache_lens)
    out = _attend_values(probs, v_cache, cache_lens).to(q.dtype)
    if scores is not None:
        step = probs[:, :, 0, :].view(batch, kv_heads, q_heads // kv_heads, capacity).sum(dim=2)
        scores.add_(step.to(scores.dtype))
    return out


def _fused_decode_output(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    scale: Optional[float],
    *,
    full_rows: bool,
) -> torch.Tensor:
    """`decode_attention`'s output by PyTorch's fused attention, on a CPU, for rows of at least one slot.

    The query heads of a group are the rows of one attention over their KV head's slots,
    the slots at or past `cache_lens[b]` masked, computed in `decode_attention`'s precision
    (float32, float64 for float64). A masked slot still multiplies its zero probability by
    its key and value, so NaN or inf garbage there would reach the output: when the output
    is not finite (`_is_finite`), the attention is redone over keys
    and values zeroed past `cache_lens`, which gives rows without garbage bit for bit the
    same output. With `full_rows` (every `cache_lens[b]` equals C, as at batch 1) no slot is
    masked, so neither the mask nor the check is needed. At the CPU benchmark's decode shape
    (B 4, 8 query heads over 2 KV heads, D 128, C 320, float32, one thread) it takes 142 µs
    with full rows and 168 µs masked, where the explicit path takes 294.

    Args:
        q: `[B, Hq, 1, D]`; k_cache, v_cache: `[B, Hkv, C, D]`, C > 0; cache_lens: `[B]`, every entry
            in `[1, C]`.
        full_rows: whether every entry of `cache_lens` is C.

    Returns:
        `[B, Hq, 1, D]` in `q.dtype`.
    """
    batch, q_heads, _, head_dim = q.shape
    kv_heads, capacity = k_cache.shape[1], k_cache.shape[2]
    acc = _accumulation_dtype(q.dtype)
    grouped = q.to(acc).reshape(batch, kv_heads, q_heads // kv_heads, head_dim)  # [B, Hkv, group, D]
    attend = torch.nn.functional.scaled_dot_product_attention
    if full_rows:  # every slot is read: no mask, and no garbage to keep out
        out = attend(grouped, k_cache.to(acc), v_cache.to(acc), scale=scale)  # [B, Hkv, group, D]
        return out.view(batch, q_heads, 1, head_dim).to(q.dtype)
    visible = torch.arange(capacity).view(1, 1, 1, capacity) < cache_lens.view(batch, 1, 1, 1)  # [B, 1, 1, C]
    out = attend(grouped, k_cache.to(acc), v_cache.to(acc), attn_mask=visible, scale=scale)  # [B, Hkv, group, D]
    if not _is_finite(out):
        keys, values = (_readable_values(cache, cache_lens, acc) for cache in (k_cache, v_cache))
        out = attend(grouped, keys, values, attn_mask=visible, scale=scale)
    return out.view(batch, q_heads, 1, head_dim).to(q.dtype)


def candidate_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    candidate_lens: torch.Tensor,
    *,
    scale: float,
    q_valid: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Mean attention each candidate key gets from a window of queries, softmax over the candidates only.

    This is the paper's importance (`score_mode="recompute"`): every query's softmax runs
    over keys `[0, candidate_lens[b])` (not causal), then probabilities are averaged over
    the `W` queries and the query heads of each KV group. On a CPU, inputs other than float64
    whose rows all have the same number of candidates skip the mask
    (`_shared_candidate_attention`).

    Args:
        q: `[B, Hq, W, D]` window queries (after RoPE); k: `[B, Hkv, N, D]`.
        candidate_lens: `[B]` int, candidates per sequence.
        q_valid: `[B, W]` bool, queries that exist (others contribute nothing), or None for all.

    Returns:
        `[B, Hkv, N]` float32: the sum of valid queries' probabilities divided by `W * Hq / Hkv`;
        0 at non-candidate slots.
    """
    batch, q_heads, window, _ = q.shape
    kv_heads, num_slots = k.shape[1], k.shape[2]
    if window == 0:
        return torch.zeros((batch, kv_heads, num_slots), dtype=torch.float32, device=q.device)
    shared = _shared_candidate_count(q, candidate_lens, num_slots)
    if shared is not None:
        importance = _shared_candidate_attention(q, k[:, :, :shared], scale, q_valid)
        return torch.nn.functional.pad(importance, (0, num_slots - shared))  # 0 past the candidates
    probs = attention_probabilities(q, k, scale=scale, causal=False, kv_lens=candidate_lens)  # [B, Hq, W, N]
    if q_valid is not None:
        probs.masked_fill_(~q_valid.view(batch, 1, window, 1), 0.0)  # not a product: 0 * NaN is NaN
    group = q_heads // kv_heads
    total = probs.sum(dim=2).view(batch, kv_heads, group, num_slots).sum(dim=2)
    return (total / (window * group)).to(torch.float32)


def _shared_candidate_count(q: torch.Tensor, candidate_lens: torch.Tensor, num_slots: int) -> Optional[int]:
    """The candidates of every row when all rows have the same positive number, on a CPU and
    for inputs other than float64 (the test oracle keeps the masked path); else None."""
    if q.device.type != "cpu" or q.dtype == torch.float64:
        return None
    lengths = candidate_lens.tolist()  # a host read, free on a CPU
    if not lengths or min(lengths) != max(lengths) or lengths[0] <= 0:
        return None
    return min(lengths[0], num_slots)


def _shared_candidate_attention(
    q: torch.Tensor, candidates: torch.Tensor, scale: float, q_valid: Optional[torch.Tensor]
) -> torch.Tensor:
    """`candidate_attention` when every row's candidates are all of `candidates [B, Hkv, n, D]`,
    n > 0: no key is hidden, so no mask, and one buffer of logits turned into `exp(x - max)` in
    place. The valid queries' probabilities are summed by one product, each query weighted by
    1 over its sum (0 for an absent query), so the probabilities are never written out. An
    absent query may hold garbage; it is zeroed first, which keeps its row finite for its
    weight 0 to drop. At the CPU record's eviction (4 rows, 8 query heads over 2 KV heads, 64
    queries, 1,024 candidates of 1,088 slots, D 128, float32, one thread) `candidate_attention`
    takes 8.5 ms with it where the masked path takes 13.5.

    Returns:
        `[B, Hkv, n]` float32.
    """
    batch, q_heads, window, _ = q.shape
    kv_heads, shared = candidates.shape[1], candidates.shape[2]
    group = q_heads // kv_heads
    queries = q.float() * scale
    if q_valid is None:
        present = queries.new_ones((batch, 1, window, 1))
    else:
        present = q_valid.to(torch.float32).view(batch, 1, window, 1)
        queries.masked_fill_(present == 0, 0.0)
    logits = _grouped_matmul(queries, candidates.float().transpose(-1, -2))  # [B, Hq, W, n]
    weights = logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()
    per_query = present / weights.sum(dim=-1, keepdim=True)  # [B, Hq, W, 1]
    total = torch.matmul(per_query.transpose(-1, -2), weights)  # [B, Hq, 1, n]
    return total.view(batch, kv_heads, group, shared).sum(dim=2) / (window * group)


def value_magnitude(values: torch.Tensor, stat: str) -> torch.Tensor:
    """Magnitude of each value vector over its last dim.

    Args:
        values: `[..., D]`, e.g. `[B, Hkv, T, D]`.
        stat: `range` (max - min), `absmax`, `l2` (Euclidean norm) or `var` (population variance).

    Returns:
        `[...]` float32, computed in float32 (float64 for float64 inputs).
    """
    v = values.to(_accumulation_dtype(values.dtype))
    if stat == "range":
        magnitude = v.amax(dim=-1) - v.amin(dim=-1)
    elif stat == "absmax":
        magnitude = v.abs().amax(dim=-1)
    elif stat == "l2":
        magnitude = torch.linalg.vector_norm(v, dim=-1)
    elif stat == "var":
        magnitude = v.var(dim=-1, unbiased=False)
    else:
        raise ValueError(f"stat: expected one of range, absmax, l2, var; got {stat!r}")
    return magnitude.to(torch.float32)


def append_(cache: CacheTensors, new_keys: torch.Tensor, new_values: torch.Tensor, *, value_stat: str) -> None:
    """Append `T_new` tokens to every sequence of a static cache, in place.

    Sequence `b` receives the new tokens in slots `[lengths[b], lengths[b] + T_new)`, with
    their value magnitude and positions `next_positions[b] + t`; then `lengths[b]` and
    `next_positions[b]` advance by `T_new`. A sequence that would overflow the capacity is
    left untouched. Decided on device: nothing is read back to the host, except on a CPU
    (where a host read is free), which checks that every sequence fits and then writes the
    new tokens without reading what they replace: as one slice when every sequence has the
    same length (always at batch 1), else by scatter. Scores are not touched.

    Args:
        cache: the layer's buffers, `N` slots; new_keys, new_values: `[B, Hkv, T_new, D]`.
    """
    batch, kv_heads, capacity, head_dim = cache.keys.shape
    if capacity == 0:  # no slot to write: every row is left as it is
        return
    device = cache.keys.device
    new_len = new_keys.shape[2]
    arange = torch.arange(new_len, dtype=cache.next_positions.dtype, device=device)
    new_positions = (cache.next_positions.view(batch, 1, 1) + arange).expand(batch, kv_heads, new_len)
    magnitudes = value_magnitude(new_values, value_stat)  # [B, Hkv, T_new]
    if device.type == "cpu":
        starts = cache.lengths.tolist()
        if starts and min(starts) == max(starts) and 0 <= starts[0] <= capacity - new_len:
            start, stop = starts[0], starts[0] + new_len
            cache.keys[:, :, start:stop] = new_keys
            cache.values[:, :, start:stop] = new_values
            cache.magnitudes[:, :, start:stop] = magnitudes
            cache.positions[:, :, start:stop] = new_positions
            cache.lengths.add_(new_len)
            cache.next_positions.add_(new_len)
            return
    lengths = cache.lengths.to(torch.long)
    fits = (lengths >= 0) & (lengths + new_len <= capacity)  # [B]
    slots = lengths.view(batch, 1) + torch.arange(new_len, device=device)  # [B, T_new]
    slots = slots.clamp(0, capacity - 1).view(batch, 1, new_len).expand(batch, kv_heads, new_len)
    # Every row writes, so that the write stays one scatter: a row that does not fit writes
    # back what its (clamped) slots hold, unless a CPU has found that all rows fit.
    write = None if device.type == "cpu" and bool(fits.all()) else fits.view(batch, 1, 1)  # [B, 1, 1]

    def put(buffer: torch.Tensor, new: torch.Tensor) -> None:
        index = slots if buffer.dim() == 3 else slots.unsqueeze(-1).expand(-1, -1, -1, head_dim)
        new = new.to(buffer.dtype)
        if write is not None:
            new = torch.where(write if buffer.dim() == 3 else write.unsqueeze(-1), new, buffer.gather(2, index))
        buffer.scatter_(2, index, new)

    put(cache.keys, new_keys)
    put(cache.values, new_values)
    put(cache.magnitudes, magnitudes)
    put(cache.positions, new_positions)
    step = new_len if write is None else torch.where(fits, new_len, 0)
    cache.lengths.add_(step)
    cache.next_positions.add_(step)


# Uniforms are clamped into [GUMBEL_UNIFORM_MIN, GUMBEL_UNIFORM_MAX] (the smallest normal
# float32 and the largest float32 below 1) so that the Gumbel transform stays finite.
GUMBEL_UNIFORM_MIN = 1.1754943508222875e-38
GUMBEL_UNIFORM_MAX = 1.0 - 2.0**-24


def eviction_uniforms(shape: tuple[int, ...], device: torch.device, *, seed: int, eviction_index: int) -> torch.Tensor:
    """U(0, 1) float32 uniforms of shape `[B, Hkv, N]` for eviction `eviction_index` of stream key `seed`.

    Drawn by a generator seeded with `vase_triton.seeding.generator_seed(seed, eviction_index)`.
    This is the reference's own stream: the Triton kernel draws philox numbers instead, so
    the two agree only when the same `noise` tensor is passed to both.
    """
    generator = torch.Generator(device=device)
    generator.manual_seed(generator_seed(seed, eviction_index))
    return torch.rand(shape, generator=generator, device=device, dtype=torch.float32)


def standard_normal(shape: tuple[int, ...], device: torch.device, *, seed: int, eviction_index: int) -> torch.Tensor:
    """N(0, 1) float32 draws of `shape` for eviction `eviction_index` of stream key `seed`.

    The reference's own stream (a generator seeded like `eviction_uniforms`'s); the Triton
    kernel (`vase_triton.ops.gaussian`) draws philox numbers instead.
    """
    generator = torch.Generator(device=device)
    generator.manual_seed(generator_seed(seed, eviction_index))
    return torch.randn(shape, generator=generator, device=device, dtype=torch.float32)


def gumbel_keys(importance: torch.Tensor, uniforms: Optional[torch.Tensor], temperature: float) -> torch.Tensor:
    """Selection keys of Gumbel-top-k sampling, in float32.

    `log(w) / temperature + g` with `g = -log(-log(u))`; `w <= 0` gives `-inf` (taken only
    after every positive weight). With `temperature < MIN_TEMPERATURE` (0 included) the key
    is `w` itself (deterministic top-k) and `uniforms` may be None. NaN weights become `-inf`.

    Args:
        importance: `[B, Hkv, N]` weights `w`.
        uniforms: `[B, Hkv, N]` uniforms in [0, 1), clamped as documented above.

    Returns:
        `[B, Hkv, N]` float32.
    """
    weight = importance.to(torch.float32)
    if temperature < MIN_TEMPERATURE:
        return torch.where(torch.isnan(weight), float("-inf"), weight)
    uniform = uniforms.to(torch.float32).clamp(GUMBEL_UNIFORM_MIN, GUMBEL_UNIFORM_MAX)
    gumbel = -torch.log(-torch.log(uniform))
    positive = weight > 0
    log_weight = torch.log(torch.where(positive, weight, 1.0))
    inv_temperature = torch.tensor(1.0 / temperature, dtype=torch.float32, device=weight.device)
    return torch.where(positive, log_weight * inv_temperature + gumbel, float("-inf"))


def _largest_mask(values: torch.Tensor, eligible: torch.Tensor, count: int) -> torch.Tensor:
    """`[..., N]` mask of the `count` largest `values` among `eligible` (NaN lowest), ties to the earlier slot."""
    values = torch.where(torch.isnan(values), float("-inf"), values)
    order = torch.sort(values, dim=-1, descending=True, stable=True).indices
    eligible_first = torch.sort(eligible.gather(-1, order).to(torch.int8), dim=-1, descending=True, stable=True)
    order = order.gather(-1, eligible_first.indices)
    chosen = torch.zeros_like(eligible)
    chosen.scatter_(-1, order[..., :count], True)
    return chosen & eligible


class Survivors(NamedTuple):
    """The survivors of one eviction of every row by kind (`[B, Hkv, N]` bool each), and the
    values the protected and the sampled were ranked by (`[B, Hkv, N]` float32)."""

    sinks: torch.Tensor
    protected: torch.Tensor
    sampled: torch.Tensor
    recent: torch.Tensor
    magnitudes: torch.Tensor
    sampling_keys: torch.Tensor

    def mask(self) -> torch.Tensor:
        """`[B, Hkv, N]` bool: every survivor."""
        return self.sinks | self.protected | self.sampled | self.recent


def select_survivors(
    importance: torch.Tensor,
    magnitudes: torch.Tensor,
    lengths: torch.Tensor,
    *,
    budget: int,
    window: int,
    n_sink: int,
    n_protect: int,
    temperature: float,
    uniforms: Optional[torch.Tensor],
) -> Survivors:
    """Survivors of one eviction of every row, as if each row were evicted.

    With `n = lengths[b]`, candidates are slots `[0, n - window)`; kept are the window
    `[n - window, n)`, the sinks `[0, n_sink)`, the `n_protect` candidates of largest value
    magnitude with the sinks counted among them (sinks rank above every magnitude, so
    `max(0, n_protect - n_sink)` non-sink candidates are protected), and the remaining
    candidates of largest `gumbel_keys(importance, uniforms, temperature)` up to
    `budget - window` kept candidates; every tie goes to the earlier slot. A row with
    `n >= budget` keeps exactly `budget` slots.

    Args:
        importance, magnitudes: `[B, Hkv, N]` float32; lengths: `[B]` int (values above `N`
            act as `N`).
        uniforms: `[B, Hkv, N]` float32, used when `temperature >= MIN_TEMPERATURE`.
    """
    batch, _, num_slots = importance.shape
    slot = torch.arange(num_slots, device=importance.device).view(1, 1, num_slots)
    length = lengths.to(device=importance.device, dtype=torch.long).clamp_max(num_slots).view(batch, 1, 1)
    candidate = slot < length - window  # [B, 1, N]
    sink = candidate & (slot < n_sink)
    recent = (slot >= length - window) & (slot < length)
    shape = importance.shape
    n_large = max(0, n_protect - n_sink)
    magnitudes = magnitudes.to(torch.float32)
    protected = _largest_mask(magnitudes, (candidate & ~sink).expand(shape), n_large)
    keys = gumbel_keys(importance, uniforms, temperature)
    remaining = (candidate & ~sink).expand(shape) & ~protected
    sampled = _largest_mask(keys, remaining, budget - window - n_sink - n_large)
    return Survivors(sink.expand(shape), protected, sampled, recent.expand(shape), magnitudes, keys)


def survivor_slots(survivors: Survivors, budget: int) -> torch.Tensor:
    """`[B, Hkv, budget]` int64: the source slot of each destination slot, survivors in temporal order."""
    return torch.sort(survivors.mask().to(torch.int8), dim=-1, descending=True, stable=True).indices[..., :budget]


def evict_(
    cache: CacheTensors,
    importance: torch.Tensor,
    *,
    budget: int,
    window: int,
    n_sink: int,
    n_protect: int,
    temperature: float,
    seed: int,
    eviction_index: Optional[torch.Tensor] = None,
    keep_scores: bool = False,
    trigger_length: Optional[int] = None,
    noise: Optional[torch.Tensor] = None,
) -> None:
    """Evict every sequence with `lengths[b] >= trigger_length` down to `budget` slots, in place.

    Survivors are `select_survivors(...)` (uniforms: `noise`, else `eviction_uniforms` of stream
    key `seed` at the `[1]` int64 `eviction_index`, which is read, not advanced; None reads 0),
    moved to slots `[0, budget)` in temporal order with their keys, values, magnitudes,
    positions and (with `keep_scores`) scores. Without `keep_scores` the scores of every row
    are reset to 0 (the next observation starts empty); slots `[budget, N)` of evicted rows
    get position -1 and score 0, and their `lengths[b] = budget`. Other rows keep their slots.

    Args:
        cache: the layer's buffers (`N` slots); importance: `[B, Hkv, N]` float32.
        noise: `[B, Hkv, N]` float32 uniforms or None; trigger_length: default `N`.
    """
    keys = cache.keys
    batch, kv_heads, num_slots, _ = keys.shape
    trigger_length = num_slots if trigger_length is None else trigger_length
    uniforms = noise
    if temperature >= MIN_TEMPERATURE and noise is None:
        index = 0 if eviction_index is None else int(eviction_index.item())
        uniforms = eviction_uniforms((batch, kv_heads, num_slots), keys.device, seed=seed, eviction_index=index)
    selected = select_survivors(
        importance, cache.magnitudes, cache.lengths, budget=budget, window=window, n_sink=n_sink,
        n_protect=n_protect, temperature=temperature, uniforms=uniforms,
    )
    survivors = survivor_slots(selected, budget)  # [B, Hkv, budget]
    evicted = (cache.lengths >= trigger_length).to(keys.device).view(batch, 1, 1)  # [B, 1, 1]
    # On a CPU (where a host read is free) a batch whose rows all evict writes the moved slots
    # without reading what they replace.
    every_row = keys.device.type == "cpu" and bool(evicted.all())
    row_index = torch.arange(batch, device=keys.device).view(batch, 1, 1)
    head_index = torch.arange(kv_heads, device=keys.device).view(1, kv_heads, 1)

    def compact(buffer: torch.Tensor) -> None:
        moved = buffer[row_index, head_index, survivors]  # [B, Hkv, budget] + buffer.shape[3:]
        head = buffer[:, :, :budget]
        if every_row:
            head.copy_(moved)
        else:
            head.copy_(torch.where(evicted.view(batch, 1, 1, *([1] * (buffer.dim() - 3))), moved, head))

    for buffer in (cache.keys, cache.values, cache.magnitudes, cache.positions):
        compact(buffer)
    cache.positions[:, :, budget:].masked_fill_(evicted, -1)
    if keep_scores:
        compact(cache.scores)
        cache.scores[:, :, budget:].masked_fill_(evicted, 0.0)
    else:
        cache.scores.zero_()
    cache.lengths.masked_fill_(evicted.view(batch).to(cache.lengths.device), budget)
