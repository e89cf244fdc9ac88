"""Which sizes a benchmark session runs, chosen by `VASE_BENCH_PROFILE`.

- `smoke`: tiny shapes, each suite once; the default without CUDA (CI). Not a measurement.
- `gpu`: the headline shapes, sized for `benchmarks/gpu_check.sh` on one H100/H200; the
  default with CUDA.
- `deep`: end-to-end decoding only, at a whole model's depth (Qwen3-8B, 36 layers) at 16,384
  generated tokens: the setting of the end-to-end target, where the `gpu` profile's 4 layers
  let the output projection's weights dominate every step (sized for minutes on one H200;
  not yet timed there).
- `full`: every registry shape, end-to-end decoding to 32k tokens and the paper's
  throughput protocol at full model depth (about an hour on one GPU).
- `cpu`: the CPU measurements through the PyTorch reference: end-to-end decoding
  (thousands of tokens) and a prompt to its first token; the kernel suites skip.
"""

from __future__ import annotations

import os
from typing import Mapping, TypeVar

import pytest
import torch

PROFILES = ("smoke", "gpu", "deep", "full", "cpu")
ENVIRONMENT_VARIABLE = "VASE_BENCH_PROFILE"

T = TypeVar("T")


def active() -> str:
    """The session's profile: `VASE_BENCH_PROFILE`, else `gpu` with CUDA and `smoke` without."""
    default = "gpu" if torch.cuda.is_available() else "smoke"
    profile = os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower() or default
    if profile not in PROFILES:
        raise ValueError(f"{ENVIRONMENT_VARIABLE}: expected one of {', '.join(PROFILES)}; got {profile!r}")
    if profile in ("gpu", "deep", "full") and not torch.cuda.is_available():
        raise ValueError(f"{ENVIRONMENT_VARIABLE}={profile} needs a CUDA device; use smoke or cpu on this machine")
    return profile


def pick(choices: Mapping[str, T]) -> T:
    """The value for the active profile; skips the calling test module when the profile has none."""
    profile = active()
    if profile not in choices:
        pytest.skip(f"not part of the {profile} profile", allow_module_level=True)
    return choices[profile]
