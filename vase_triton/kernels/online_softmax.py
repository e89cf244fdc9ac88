"""Online-softmax update shared by the attention kernels (Triton inlines it into each kernel)."""

import triton
import triton.language as tl


@triton.jit
def online_softmax_step(s, v, m_i, l_i, acc, DOT_PRECISION: tl.constexpr):
    """Fold one key block into the running softmax of a block of query rows.

    `s`: [ROWS, BLOCK_N] base-2 logits, -inf on hidden keys; `v`: [BLOCK_N, HEAD_DIM] values;
    `m_i`, `l_i`: [ROWS] running max and sum of `exp2(s - m_i)`; `acc`: [ROWS, HEAD_DIM]
    unnormalised output. Returns the updated `(m_i, l_i, acc)`.
    """
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # A row that has seen only hidden keys keeps m = -inf: shift it by 0 so exp2 gives 0, not NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])  # [ROWS, BLOCK_N]
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def online_logsumexp_step(s, m_i, l_i):
    """`online_softmax_step` without values: fold key block logits `s` [ROWS, BLOCK_N] into `(m_i, l_i)`."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    l_i = l_i * tl.exp2(m_i - m_safe) + tl.sum(tl.exp2(s - m_safe[:, None]), axis=1)
    return m_new, l_i
