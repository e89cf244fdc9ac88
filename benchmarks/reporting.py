"""Shared helpers of the benchmark suites: environment, timing statistics, rooflines, reports.

A suite times its target with `run_timed` (pytest-benchmark rounds of `Timing.calls`
calls) and records one `Row` per call (`per_call(row_from_benchmark(...), calls)`);
`benchmarks/conftest.py` collects the rows, prints them and writes them as a markdown
record under `benchmarks/results/` (`write_report`).
"""

from __future__ import annotations

import dataclasses
import datetime
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch
import triton

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Roofline:
    """Measured peaks of one GPU model: copy bandwidth and dense bf16 matmul throughput."""

    bandwidth_gbs: float
    bf16_tflops: float


ROOFLINES = {
    "H200": Roofline(bandwidth_gbs=4300.0, bf16_tflops=790.0),
}


@dataclass(frozen=True)
class Timing:
    """pytest-benchmark rounds; each round runs the target `calls` times, then synchronises."""

    rounds: int
    warmup_rounds: int
    calls: int


@dataclass(frozen=True)
class Row:
    """One measurement: what ran, on which shape, its timing and the work it did.

    `flops` and `bytes_moved` are the nominal work of one call (None when not meaningful);
    `median_s` and `iqr_s` are None when timing was disabled (`--benchmark-disable`).
    """

    suite: str
    name: str
    shape: str
    median_s: Optional[float]
    iqr_s: Optional[float]
    flops: Optional[float] = None
    bytes_moved: Optional[float] = None


def device_name(device: torch.device) -> str:
    """The GPU's marketing name, or the host processor for CPU runs."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()})"


def versions() -> dict[str, str]:
    """Versions that a benchmark record must state."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda or "none",
    }


def roofline_for(name: str) -> Optional[Roofline]:
    """The roofline of a GPU whose name contains a known model, else None."""
    for model, roofline in ROOFLINES.items():
        if model in name:
            return roofline
    return None


def timing(benchmark) -> tuple[Optional[float], Optional[float]]:
    """(median, interquartile range) in seconds from a pytest-benchmark fixture after it ran."""
    metadata = getattr(benchmark, "stats", None)
    if metadata is None:
        return None, None
    stats = metadata.stats
    return stats.median, stats.iqr


def row_from_benchmark(benchmark, suite: str, name: str, shape: str, *, flops=None, bytes_moved=None) -> Row:
    """A `Row` from a pytest-benchmark fixture; `shape` describes the inputs, e.g. `B1 Hq32 Hkv8 T8192 D128`."""
    median, iqr = timing(benchmark)
    return Row(suite, name, shape, median, iqr, flops, bytes_moved)


def run_timed(benchmark, timing: Timing, target):
    """Benchmark `target` with `timing`; returns the result of its last call."""

    def round_of_calls():
        for _ in range(timing.calls):
            result = target()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return result

    return benchmark.pedantic(round_of_calls, rounds=timing.rounds, warmup_rounds=timing.warmup_rounds)


def per_call(row: Row, calls: int) -> Row:
    """`row` with the timing of one round divided among its `calls` calls."""
    if row.median_s is None:
        return row
    return dataclasses.replace(row, median_s=row.median_s / calls, iqr_s=row.iqr_s / calls)


def _rate(amount: Optional[float], seconds: Optional[float], unit: float) -> Optional[float]:
    if amount is None or seconds is None or seconds <= 0:
        return None
    return amount / seconds / unit


def _fmt(value: Optional[float], digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def render_markdown(title: str, rows: Sequence[Row], device: torch.device) -> str:
    """A markdown record: header with GPU and versions, then one table per suite."""
    name = device_name(device)
    roofline = roofline_for(name)
    lines = [f"# {title}", ""]
    lines.append(f"- device: {name}")
    lines.extend(f"- {key}: {value}" for key, value in versions().items())
    lines.append(f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
    if roofline is not None:
        lines.append(f"- roofline: {roofline.bandwidth_gbs:.0f} GB/s copy, {roofline.bf16_tflops:.0f} TFLOP/s bf16")
    for suite in dict.fromkeys(row.suite for row in rows):
        lines += ["", f"## {suite}", ""]
        lines.append("| benchmark | shape | median (µs) | IQR (µs) | TFLOP/s | GB/s | % of roofline |")
        lines.append("|---|---|---:|---:|---:|---:|---:|")
        for row in (r for r in rows if r.suite == suite):
            tflops = _rate(row.flops, row.median_s, 1e12)
            gbs = _rate(row.bytes_moved, row.median_s, 1e9)
            percent = None
            if roofline is not None and gbs is not None:
                percent = 100.0 * gbs / roofline.bandwidth_gbs
            elif roofline is not None and tflops is not None:
                percent = 100.0 * tflops / roofline.bf16_tflops
            median_us = None if row.median_s is None else row.median_s * 1e6
            iqr_us = None if row.iqr_s is None else row.iqr_s * 1e6
            lines.append(
                f"| {row.name} | {row.shape} | {_fmt(median_us)} | {_fmt(iqr_us)} | {_fmt(tflops)} | "
                f"{_fmt(gbs)} | {_fmt(percent)} |"
            )
    return "\n".join(lines) + "\n"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def write_report(title: str, rows: Sequence[Row], device: torch.device, directory: Path = RESULTS_DIR) -> Path:
    """Write `render_markdown` to `<directory>/<device>-<suites>.md` and return the path."""
    directory.mkdir(parents=True, exist_ok=True)
    suites = "-".join(dict.fromkeys(row.suite for row in rows))
    path = directory / f"{_slug(device_name(device))}-{_slug(suites)}.md"
    path.write_text(render_markdown(title, rows, device))
    return path
