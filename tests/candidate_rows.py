"""Hostile cache rows for the ops that score a layer's candidate slots, and their tolerance.

`Rows` names one case: a `[B, Hkv, N, D]` buffer shape, per-row lengths (ragged, past `N`,
leaving no or one candidate) and the window; `poison_past_candidates` fills every slot past
a row's candidates with NaN, which must not leak; `assert_near_twin` applies the shared
error allowance: four times what PyTorch's float32 reference reaches against the float64
twin, with a floor at float32's resolution, relative to the twin's largest magnitude;
`poison_allocations` makes the buffers a kernel launcher allocates start as NaN, so that an
element the kernel forgets to write shows.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class Rows:
    batch: int
    kv_heads: int
    slots: int
    head_dim: int
    window: int
    lengths: tuple[int, ...]
    dtype: torch.dtype

    @property
    def id(self) -> str:
        lengths = "_".join(map(str, self.lengths))
        return f"B{self.batch}H{self.kv_heads}N{self.slots}D{self.head_dim}W{self.window}L{lengths}-{DTYPE_NAMES[self.dtype]}"

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.kv_heads, self.slots, self.head_dim)

    def past_candidates(self) -> torch.Tensor:
        """`[B, 1, N]` bool: the slots of each row that are not candidates."""
        n_candidates = (torch.tensor(self.lengths).clamp_max(self.slots) - self.window).clamp_min(0)
        return torch.arange(self.slots).view(1, 1, -1) >= n_candidates.view(-1, 1, 1)


def poison_past_candidates(buffer: torch.Tensor, rows: Rows) -> torch.Tensor:
    """`buffer` (`[B, Hkv, N, D]`, CPU) with NaN in every slot past its row's candidates."""
    return buffer.masked_fill(rows.past_candidates().unsqueeze(-1), float("nan"))


def assert_near_twin(got: torch.Tensor, truth: torch.Tensor, torch_float32: torch.Tensor) -> None:
    """`got` within the allowance of the float64 `truth` (`torch_float32`: PyTorch's float32 result)."""
    scale = truth.abs().amax().clamp_min(1e-30)
    allowed = max(4 * float((torch_float32.double() - truth).abs().max() / scale), 4 * torch.finfo(torch.float32).eps)
    error = float((got.cpu().double() - truth).abs().max() / scale)
    assert error <= allowed, (error, allowed)


class _PoisonedTorch(types.ModuleType):
    """`torch`, except that `empty` fills floating tensors with NaN and integer ones with -7."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs) -> torch.Tensor:
        tensor = torch.empty(*args, **kwargs)
        return tensor.fill_(float("nan") if tensor.is_floating_point() else -7)


def poison_allocations(monkeypatch, module) -> None:
    """Make every `torch.empty` of `module` (a kernel launcher's outputs and scratch) NaN-poisoned."""
    monkeypatch.setattr(module, "torch", _PoisonedTorch("torch"))
