"""What a benchmark record says about where it ran: device, versions, profile, measured roofline."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

import torch

from vase_triton.autotune import lookup
from vase_triton.backend import requested_backend

COMMIT_VARIABLE = "VASE_BENCH_COMMIT"
PACKAGES = ("torch", "triton", "transformers", "pytest-benchmark", "flash-attn")


def device_name() -> str:
    """The GPU's name, or `CPU (<processor model>)`."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        model = names[0] if names else model
    return f"CPU ({model})"


def package_versions() -> dict[str, Optional[str]]:
    """Installed versions of the packages a record depends on (None when absent)."""
    versions: dict[str, Optional[str]] = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    versions["torch"] = torch.__version__
    versions["cuda"] = torch.version.cuda
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    versions["cudnn"] = None if cudnn is None else str(cudnn)
    return versions


def sdpa_backends() -> list[str]:
    """The backends PyTorch's scaled_dot_product_attention may pick (the baselines' attention)."""
    names = ("flash", "mem_efficient", "cudnn", "math")
    return [name for name in names if getattr(torch.backends.cuda, f"{name}_sdp_enabled")()]


def describe(profile: str, roofline: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The `machine_info["vase_bench"]` entry of a pytest-benchmark JSON."""
    info: dict[str, Any] = {
        "device": device_name(),
        "profile": profile,
        "versions": package_versions(),
        "timing": (
            "kernel suites: triton.testing.do_bench (CUDA events, L2 flushed before each call) around eager calls or "
            "CUDA graph replays (each section says which); end-to-end suites: a CUDA event at every generated token"
            if torch.cuda.is_available()
            else "kernel suites: time.perf_counter around each call; end-to-end suites: time.perf_counter at every "
            "generated token"
        ),
        "roofline": roofline,
        "backend": requested_backend(),  # VASE_BACKEND: `torch` makes the vase rows of the model suites the reference
        "autotune": lookup.mode(),
        "threads": torch.get_num_threads(),
        "sdpa_backends": sdpa_backends(),
    }
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        info["gpu_memory_bytes"] = properties.total_memory
        info["multiprocessors"] = properties.multi_processor_count
    return info


def commit_label() -> Optional[str]:
    """`VASE_BENCH_COMMIT`: the commit to state when the tree was copied without its git directory."""
    label = os.environ.get(COMMIT_VARIABLE, "").strip()
    return label or None
