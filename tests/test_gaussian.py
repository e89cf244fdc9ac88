"""The Gaussian draw of an eviction (`vase_triton.ops.gaussian.standard_normal_`), on both backends.

Checked against exact expectations of N(0, 1): mean, variance and the probabilities of
three intervals, at a 1e-6 false-alarm level; the same (key, index) gives the same draw,
and another key or index an unrelated one (correlation within noise); the Triton path
reads its index on the device and does not advance it.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest
import torch

from vase_triton.ops.gaussian import standard_normal_

SAMPLES = 1 << 16
Z_LIMIT = 5.3  # two-sided 1e-7 per check


def draw(device, *, seed: int = 5, index: int = 0, numel: int = SAMPLES) -> torch.Tensor:
    out = torch.full((numel,), float("nan"), device=device)
    counter = torch.tensor([index], dtype=torch.int64, device=device)
    standard_normal_(out, seed=seed, eviction_index=counter)
    assert int(counter.item()) == index
    return out.cpu().double()


@pytest.fixture(params=["triton", "torch"])
def backend(request, monkeypatch):
    if request.param == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    return request.param


def test_draws_follow_the_standard_normal(backend, device) -> None:
    z = draw(device)
    assert bool(torch.isfinite(z).all())
    n = z.numel()
    assert abs(float(z.mean())) * math.sqrt(n) <= Z_LIMIT
    # Var of the sample variance of N(0, 1) is 2 / n.
    assert abs(float(z.var()) - 1.0) / math.sqrt(2.0 / n) <= Z_LIMIT
    normal = NormalDist()
    for low, high in ((-math.inf, -1.5), (-0.5, 0.5), (2.0, math.inf)):
        p = normal.cdf(high) - normal.cdf(low)
        count = float(((z > low) & (z <= high)).sum())
        assert abs(count - n * p) / math.sqrt(n * p * (1 - p)) <= Z_LIMIT, (low, high, count / n, p)


def test_same_stream_same_draw_other_stream_unrelated(backend, device) -> None:
    first = draw(device, seed=5, index=3)
    assert torch.equal(first, draw(device, seed=5, index=3))
    for other in (draw(device, seed=6, index=3), draw(device, seed=5, index=4)):
        correlation = float(torch.corrcoef(torch.stack([first, other]))[0, 1])
        assert abs(correlation) * math.sqrt(SAMPLES) <= Z_LIMIT


def test_odd_sizes_are_filled_completely(backend, device) -> None:
    for numel in (1, 63, 1025):
        z = draw(device, numel=numel)
        assert bool(torch.isfinite(z).all())
    if backend == "triton":  # element i depends on i alone, not on the size of the draw
        assert torch.equal(draw(device, numel=63), draw(device, numel=1025)[:63])


def test_bad_arguments_name_the_argument(device) -> None:
    counter = torch.zeros(1, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="out: expected a contiguous float32"):
        standard_normal_(torch.empty(4, dtype=torch.float64, device=device), seed=1, eviction_index=counter)
    with pytest.raises(ValueError, match="seed: expected an int"):
        standard_normal_(torch.empty(4, device=device), seed=-1, eviction_index=counter)
    with pytest.raises(TypeError, match="eviction_index: expected dtype int64"):
        standard_normal_(torch.empty(4, device=device), seed=1, eviction_index=counter.int())


def test_the_reference_refuses_a_negative_counter(monkeypatch) -> None:
    monkeypatch.setenv("VASE_BACKEND", "torch")
    out = torch.full((4,), float("nan"))
    with pytest.raises(ValueError, match="eviction_index: expected an int >= 0; got -1"):
        standard_normal_(out, seed=1, eviction_index=torch.tensor([-1]))
    assert out.isnan().all()
