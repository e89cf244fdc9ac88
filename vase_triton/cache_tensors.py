"""`CacheTensors`: the buffers of one static cache layer, handed as one value to every op.

The append and eviction ops, their kernels, their PyTorch twins and the policies all
read (and the ops mutate) the same set of per-slot buffers; this named tuple is that
set, so no function spells the list out again.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class CacheTensors(NamedTuple):
    """Static buffers of one cache layer with `N` slots per (sequence, KV head).

    keys, values: `[B, Hkv, N, D]` (keys after RoPE).
    scores: `[B, Hkv, N]` float32 attention accumulated by the policy's observation queries.
    magnitudes: `[B, Hkv, N]` float32 value magnitude of each stored token.
    positions: `[B, Hkv, N]` int32 token positions, -1 in empty slots.
    lengths: `[B]` int32 valid slots per sequence (slots `[0, lengths[b])`).
    next_positions: `[B]` int32 position of each sequence's next token.
    """

    keys: torch.Tensor
    values: torch.Tensor
    scores: torch.Tensor
    magnitudes: torch.Tensor
    positions: torch.Tensor
    lengths: torch.Tensor
    next_positions: torch.Tensor

    @classmethod
    def empty(
        cls, batch: int, kv_heads: int, slots: int, head_dim: int, *, dtype: torch.dtype, device
    ) -> "CacheTensors":
        """Zeroed buffers (positions -1) for `slots` slots per row."""
        rows = (batch, kv_heads, slots)
        keys = torch.zeros(rows + (head_dim,), dtype=dtype, device=device)
        return cls(
            keys=keys,
            values=torch.zeros_like(keys),
            scores=torch.zeros(rows, dtype=torch.float32, device=keys.device),
            magnitudes=torch.zeros(rows, dtype=torch.float32, device=keys.device),
            positions=torch.full(rows, -1, dtype=torch.int32, device=keys.device),
            lengths=torch.zeros((batch,), dtype=torch.int32, device=keys.device),
            next_positions=torch.zeros((batch,), dtype=torch.int32, device=keys.device),
        )

    @property
    def num_slots(self) -> int:
        return self.keys.shape[2]

    def prefix(self, slots: int) -> "CacheTensors":
        """Views of the first `slots` slots of every row (counters shared)."""
        return CacheTensors(*(buffer if buffer.dim() == 1 else buffer[:, :, :slots] for buffer in self))

    def fill_(self, other: "CacheTensors") -> None:
        """Copy `other`'s first `N` slots (and counters) into these buffers, in place."""
        for mine, theirs in zip(self, other.prefix(self.num_slots)):
            mine.copy_(theirs)

    def load_(self, other: "CacheTensors") -> None:
        """Hold `other`'s rows (at most `N` slots) in the first slots; the slots after them are empty."""
        filled = other.num_slots
        self.prefix(filled).fill_(other)
        self.positions[:, :, filled:].fill_(-1)
        self.scores[:, :, filled:].zero_()

    def reset_(self) -> None:
        """Empty every row without reallocating."""
        for buffer in self:
            buffer.fill_(-1 if buffer is self.positions else 0)


def slot_mask(lengths: torch.Tensor, num_slots: int, offset: int) -> torch.Tensor:
    """`[B, 1, N]` bool: slot < min(lengths[b], N) - offset (the candidates when `offset` is the window)."""
    slot = torch.arange(num_slots, device=lengths.device).view(1, 1, num_slots)
    return slot < (lengths.to(torch.long).clamp_max(num_slots) - offset).view(-1, 1, 1)
