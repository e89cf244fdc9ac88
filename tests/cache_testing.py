"""Helpers shared by the `VaSECacheLayer` tests: buffer names, snapshots, slot invariants."""

from __future__ import annotations

import torch

from vase_triton.cache import VaSECacheLayer

BUFFERS = ("keys", "values", "scores", "magnitudes", "positions", "lengths", "next_positions")


def clone_buffers(layer: VaSECacheLayer) -> dict[str, torch.Tensor]:
    """A copy of every buffer of `layer`, by name."""
    return {name: getattr(layer, name).clone() for name in BUFFERS}


def check_row_order(layer: VaSECacheLayer) -> None:
    """Valid slots hold strictly increasing positions below next_positions; the rest is -1."""
    capacity = layer.capacity
    slot = torch.arange(capacity, device=layer.lengths.device).view(1, 1, capacity)
    valid = (slot < layer.lengths.long().view(-1, 1, 1)).expand_as(layer.positions)
    positions = layer.positions.long()
    assert bool((positions[~valid] == -1).all())
    assert bool((positions[valid] >= 0).all())
    increasing = positions[:, :, 1:] > positions[:, :, :-1]
    assert bool(increasing[valid[:, :, 1:]].all())
    assert bool((positions < layer.next_positions.long().view(-1, 1, 1)).all())
