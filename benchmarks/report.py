"""Turn the suites' pytest-benchmark JSON into a markdown report, a CSV of every row and PNG plots.

    python -m benchmarks.report RESULTS.json [RESULTS.json ...] --out DIR [--compare OLD.json ...] [--threshold 5]

Writes `DIR/report.md`, `DIR/results.csv` and, when end-to-end rows are present,
`DIR/decode_step_latency.png` and `DIR/memory.png`. Every kernel row states its run (device,
versions, commit: the "Runs" table), shape, median, interquartile range and p20–p80 of its
samples, the achieved TFLOP/s or GB/s and its percentage of the roofline that the same
run measured (copy bandwidth, bf16 matmul rate), and its speed-up over each alternative
provider of the same shape ("absent" when that alternative has no timed row). With
`--compare`, each row's median is compared with the same row of the earlier run(s); the
exit status is 1 when any row is slower by more than `--threshold` percent (default 5).
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from benchmarks.records import MATMUL, CurvePoint, Record, is_count, is_number
from benchmarks.shapes import BATCH_SIZES, QWEN3, CacheShape, PrefillShape

ABSENT = "absent"
NOT_APPLICABLE = "—"
DEFAULT_THRESHOLD_PERCENT = 5.0
KERNEL_SUITES = ("prefill", "prompt", "decode", "eviction", "score-mode")
CURVE_SUITE = "end-to-end"
PAPER_SUITE = "paper-throughput"


@dataclass(frozen=True)
class Run:
    """One input file: where and when it was measured."""

    id: str
    source: str
    device: str
    profile: str
    versions: dict
    commit: str
    date: str
    roofline: Optional[dict]
    timing: str
    backend: str = "auto"  # VASE_BACKEND of the run (older records: not stated, taken as auto)

    @property
    def is_measurement(self) -> bool:
        return self.profile != "smoke"


@dataclass(frozen=True)
class Row:
    """One benchmark row: its record, its run and the statistics of its samples (seconds)."""

    run: Run
    record: Record
    median_s: Optional[float]
    iqr_s: Optional[float]
    p20_s: Optional[float]
    p80_s: Optional[float]
    rounds: Optional[int]  # None for a row without a timing

    @property
    def tflops(self) -> Optional[float]:
        return _rate(self.record.flops, self.median_s, 1e12)

    @property
    def gbs(self) -> Optional[float]:
        return _rate(self.record.bytes_moved, self.median_s, 1e9)

    @property
    def roofline_percent(self) -> Optional[float]:
        """Achieved rate as a percentage of the run's measured copy bandwidth or matmul rate."""
        roofline = self.run.roofline
        if roofline is None or self.record.roofline is None:
            return None
        achieved, peak = (self.tflops, "matmul_tflops") if self.record.roofline == MATMUL else (self.gbs, "copy_gbs")
        if achieved is None or roofline.get(peak) is None:
            return None
        return 100.0 * achieved / roofline[peak]

    @property
    def per_step_s(self) -> Optional[float]:
        if self.median_s is None or self.record.per_step is None:
            return None
        return self.median_s / self.record.per_step


def _rate(amount: Optional[float], seconds: Optional[float], unit: float) -> Optional[float]:
    if amount is None or seconds is None or seconds <= 0:
        return None
    return amount / seconds / unit


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of an ascending sequence (numpy's default)."""
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


# ----------------------------------------------------------------------------- loading


def _commit(commit_info: dict) -> str:
    commit = commit_info.get("id")
    if not commit:
        return "unknown"
    return commit[:12] + ("+dirty" if commit_info.get("dirty") else "")


def load_runs(paths: Sequence[Path], prefix: str = "#") -> list[Row]:
    """Rows of every benchmark in `paths` (pytest-benchmark JSON written by the suites).

    ValueError naming the file when one cannot be read, is not such a JSON, or holds a
    malformed record (a hand-edited field of the wrong type, say).
    """
    rows = []
    for index, (path, label) in enumerate(zip(paths, source_labels(paths)), start=1):
        data = _read_json(Path(path))
        machine_info = data.get("machine_info") if isinstance(data, dict) else None
        info = machine_info.get("vase_bench") if isinstance(machine_info, dict) else None
        if not isinstance(info, dict) or not isinstance(data.get("benchmarks"), list):
            raise ValueError(f"{path}: expected a pytest-benchmark JSON written by the vase_triton suites "
                             "(machine_info.vase_bench and benchmarks)")  # fmt: skip
        try:
            rows.extend(_rows_of_run(data, info, run_id=f"{prefix}{index}", source=label))
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
        except (KeyError, TypeError, AttributeError) as error:
            problem = f"no field {error}" if isinstance(error, KeyError) else str(error)
            raise ValueError(f"{path}: malformed record ({type(error).__name__}: {problem})") from None
    return rows


def source_labels(paths: Sequence[Path]) -> list[str]:
    """Each path's file name, with as many of its folders as tell it from the others' (two runs'
    `attention.json` are `a/attention.json` and `b/attention.json`)."""
    parts = [Path(path).resolve().parts for path in paths]
    labels = []
    for own in parts:
        depth = 1
        while depth < len(own) and any(other != own and other[-depth:] == own[-depth:] for other in parts):
            depth += 1
        labels.append("/".join(own[-depth:]))
    return labels


def _rows_of_run(data: dict, info: dict, *, run_id: str, source: str) -> list[Row]:
    """The rows of one file's run; KeyError, TypeError or AttributeError when a field is malformed."""
    roofline = info.get("roofline")
    if roofline is not None and not isinstance(roofline, dict):
        raise ValueError(f"roofline: expected an object or null; got {roofline!r}")
    for name in ("copy_gbs", "matmul_tflops"):
        value = (roofline or {}).get(name)
        if value is not None and not (is_number(value) and 0 < value < math.inf):
            raise ValueError(f"roofline.{name} must be a positive number; got {value!r}")
    for name in ("device", "profile", "versions"):
        if name not in info:
            raise ValueError(f"machine_info.vase_bench.{name}: missing (the suites' conftest records it)")
    for name, kind in (("device", str), ("profile", str), ("versions", dict), ("timing", str), ("backend", str)):
        if name in info and not isinstance(info[name], kind):
            raise ValueError(f"machine_info.vase_bench.{name}: expected {'a string' if kind is str else 'an object'}; "
                             f"got {info[name]!r}")  # fmt: skip
    for name, version in info.get("versions", {}).items():
        if version is not None and not isinstance(version, str):
            raise ValueError(f"machine_info.vase_bench.versions.{name}: expected a string or null; got {version!r}")
    run = Run(
        id=run_id,
        source=source,
        device=info["device"],
        profile=info["profile"],
        versions=dict(info["versions"]),
        commit=_commit(data.get("commit_info") or {}),
        date=(data.get("datetime") or ABSENT)[:19].replace("T", " "),
        roofline=roofline,
        timing=info.get("timing", ""),
        backend=info.get("backend", "auto"),
    )
    rows, seen = [], set()
    for bench in data["benchmarks"]:
        if not all(name in (bench.get("extra_info") or {}) for name in ("suite", "kernel", "provider", "shape")):
            raise ValueError(f"benchmark {bench.get('name')!r} has no vase_triton record (extra_info)")
        row = _row(run, bench)
        if row.record.key in seen:
            raise ValueError(f"the row {' / '.join(row.record.key)} appears twice")
        seen.add(row.record.key)
        rows.append(row)
    return rows


def _read_json(path: Path):
    """The JSON value in `path`; ValueError naming the file when it cannot be read or parsed."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"{path}: cannot read it ({error.strerror})") from None
    except ValueError as error:
        raise ValueError(f"{path}: not JSON ({error})") from None


def _row(run: Run, bench: dict) -> Row:
    """One benchmark's row. A NaN, infinite, zero or negative median is no timing (untimed). The
    IQR and p20–p80 are linear-interpolation quantiles of the samples (pytest-benchmark's own IQR,
    another method, only when the samples are not recorded); one sample has no IQR, and a NaN or
    negative IQR or a non-finite sample leaves the IQR or the percentiles absent."""
    record = Record.from_extra_info(bench["extra_info"])
    stats = bench.get("stats")
    if not stats:
        return Row(run, record, None, None, None, None, None)
    for name in ("median", "iqr"):
        if not is_number(stats[name]):
            raise ValueError(f"stats.{name}: expected a number; got {stats[name]!r}")
    samples = stats.get("data") or []
    if not isinstance(samples, list) or not all(is_number(sample) for sample in samples):
        raise ValueError(f"stats.data: expected a list of numbers; got {samples!r}"[:200])
    if not is_count(stats["rounds"]):
        raise ValueError(f"stats.rounds: expected a count; got {stats['rounds']!r}")
    if not 0 < stats["median"] < math.inf:
        return Row(run, record, None, None, None, None, None)
    data = sorted(float(sample) for sample in samples)
    finite = bool(data) and all(math.isfinite(sample) for sample in data)
    p20 = quantile(data, 0.2) if finite else None
    p80 = quantile(data, 0.8) if finite else None
    if data:
        iqr = quantile(data, 0.75) - quantile(data, 0.25) if finite and len(data) > 1 else None
    else:
        iqr = stats["iqr"] if stats["rounds"] > 1 and 0 <= stats["iqr"] < math.inf else None
    return Row(run, record, stats["median"], iqr, p20, p80, stats["rounds"])


# ----------------------------------------------------------------------------- lookups


class RowIndex:
    """Rows by `(device, suite, kernel, provider, shape)`; a row's own run is preferred on lookup."""

    def __init__(self, rows: Iterable[Row]):
        self._rows: dict[tuple, list[Row]] = {}
        for row in rows:
            self._rows.setdefault((row.run.device, *row.record.key), []).append(row)

    def timed(self, device: str, key: tuple) -> list[Row]:
        """The timed rows of `key` on `device`, in the order their runs were given."""
        return [row for row in self._rows.get((device, *key), []) if row.median_s is not None]

    def find(self, device: str, key: tuple, prefer_run: Optional[str] = None) -> Optional[Row]:
        candidates = self.timed(device, key)
        for row in candidates:
            if row.run.id == prefer_run:
                return row
        return candidates[0] if candidates else None


def provider_row(index: RowIndex, row: Row, provider: str) -> Optional[Row]:
    """The timed row of `provider` on `row`'s device, suite, kernel and shape: `row`'s run's, else
    the first other run's that has one (`other_run_note` says which)."""
    suite, kernel, _, shape = row.record.key
    return index.find(row.run.device, (suite, kernel, provider, shape), row.run.id)


def relative_row(index: RowIndex, row: Row) -> Optional[Row]:
    """The timed `relative_to` row of `row` (e.g. one decode step), chosen as `provider_row` does."""
    if row.record.relative_to is None:
        return None
    return index.find(row.run.device, row.record.relative_to, row.run.id)


def other_run_note(index: RowIndex, row: Row, other: Optional[Row]) -> str:
    """` (against run #k)` when `other`, the row `row` is compared with, comes from another run and
    more than one run has such a row (which one was taken is then worth saying)."""
    if other is None or other.run.id == row.run.id or len(index.timed(other.run.device, other.record.key)) < 2:
        return ""
    return f" (against run {other.run.id})"


def speedup(index: RowIndex, row: Row, provider: str) -> Optional[float]:
    """How many times faster `row` is than `provider` on the same shape; None when either is untimed."""
    other = provider_row(index, row, provider)
    if other is None or row.median_s is None:
        return None
    return other.median_s / row.median_s


def relative_percent(index: RowIndex, row: Row) -> Optional[float]:
    """`row`'s per-step time as a percentage of its `relative_to` row (e.g. one decode step)."""
    other = relative_row(index, row)
    if row.per_step_s is None or other is None:
        return None
    return 100.0 * row.per_step_s / other.median_s


# ----------------------------------------------------------------------------- comparison


MEDIAN = "median"  # a kernel row's median time
SUMMED_STEPS = "summed steps"  # an end-to-end row's step latencies summed over the lengths both runs reached


@dataclass(frozen=True)
class Change:
    """One row's median now against an earlier run; `change` is `new / old - 1`. An end-to-end row
    compares the summed step latencies at the generated lengths both runs reached (`comparable`
    is False when they share none: its median over steps depends on how far the run got)."""

    key: tuple
    old_s: Optional[float]
    new_s: Optional[float]
    threshold: float
    comparable: bool = True
    in_new_run: bool = False  # the row is in the new run (untimed there when `new_s` is None)
    measure: str = MEDIAN  # what `old_s` and `new_s` are: `MEDIAN` or `SUMMED_STEPS`

    @property
    def change(self) -> Optional[float]:
        if self.old_s is None or self.new_s is None or not self.comparable:
            return None
        return self.new_s / self.old_s - 1.0

    @property
    def verdict(self) -> str:
        if self.old_s is None:
            return "new"
        if self.new_s is None:
            return "untimed now" if self.in_new_run else "not in this run"
        if not self.comparable:
            return "not comparable (no generated length in common)"
        if self.new_s > self.old_s * (1.0 + self.threshold):  # a product, so that exactly 5 % slower is not over 5 %
            return "REGRESSION"
        if self.new_s < self.old_s * (1.0 - self.threshold):
            return "faster"
        return "unchanged"


def _timed_rows(rows: Sequence[Row], side: str) -> dict[tuple, Row]:
    """Timed rows by device and `(suite, kernel, provider, shape)`; ValueError when two files of
    one side hold the same row (which one to compare would be a guess)."""
    timed = {}
    for row in rows:
        if row.median_s is None:
            continue
        key = (row.run.device, *row.record.key)
        if key in timed:
            raise ValueError(f"argument {side}: the row {' / '.join(key)} is in both {timed[key].run.source} and "
                             f"{row.run.source}; compare one run of it at a time")  # fmt: skip
        timed[key] = row
    return timed


def _change(key: tuple, new: Optional[Row], old: Optional[Row], threshold: float, in_new_run: bool) -> Change:
    if new is None or old is None or not (new.record.curve or old.record.curve):
        return Change(key, old and old.median_s, new and new.median_s, threshold, in_new_run=in_new_run)
    new_steps = {point.generated: point.step_s for point in new.record.curve}
    old_steps = {point.generated: point.step_s for point in old.record.curve}
    common = sorted(new_steps.keys() & old_steps.keys())
    if not common:
        return Change(key, old.median_s, new.median_s, threshold, comparable=False, in_new_run=True)
    return Change(key, sum(old_steps[n] for n in common), sum(new_steps[n] for n in common), threshold, in_new_run=True,
                  measure=SUMMED_STEPS)


def compare(new_rows: Sequence[Row], old_rows: Sequence[Row], threshold: float) -> list[Change]:
    """Every timed row of either side, matched by device and `(suite, kernel, provider, shape)`.

    ValueError when one side holds a row twice (in two of its files)."""
    new, old = _timed_rows(new_rows, "results"), _timed_rows(old_rows, "--compare")
    in_new_run = {(row.run.device, *row.record.key) for row in new_rows}
    keys = dict.fromkeys([*new, *old])
    return [_change(key, new.get(key), old.get(key), threshold, key in in_new_run) for key in keys]


# ----------------------------------------------------------------------------- formatting


def format_time(seconds: Optional[float]) -> str:
    if seconds is None:
        return ABSENT
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def format_number(value: Optional[float], unit: str = "", digits: int = 1) -> str:
    """`value` with `digits` decimals, or three significant digits below 1 (never rounded to 0)."""
    if value is None:
        return ABSENT
    if 0 < abs(value) < 1:
        return f"{value:.3g}{unit}"
    return f"{value:,.{digits}f}{unit}"


def format_gbs(value: Optional[float]) -> str:
    """A bandwidth in GB/s: whole numbers from 100 (GPU rates), a decimal below (CPU smoke rates)."""
    return format_number(value, digits=0 if value is not None and abs(value) >= 100 else 1)


def format_bytes(value: Optional[float]) -> str:
    if value is None:
        return ABSENT
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.1f} MiB"


def format_speedup(value: Optional[float]) -> str:
    if value is None:
        return ABSENT
    return f"{value:.3g}x" if value < 0.1 else f"{value:.2f}x"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], right_from: int) -> list[str]:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"  # a `|` in a name ends no cell

    return [line(header), "|" + "|".join(align) + "|"] + [line(cells) for cells in rows]


def runs_section(runs: Sequence[Run]) -> list[str]:
    header = ["run", "device", "profile", "torch", "triton", "transformers", "CUDA", "commit", "date (UTC)",
              "copy GB/s (measured)", "bf16 matmul TFLOP/s (measured)", "file"]  # fmt: skip
    body = []
    for run in runs:
        roofline = run.roofline or {}
        versions = run.versions
        cuda = versions.get("cuda") or ("none" if "cuda" in versions else ABSENT)  # recorded as null: a CPU build
        body.append([
            run.id, run.device, run.profile, versions.get("torch") or ABSENT, versions.get("triton") or ABSENT,
            versions.get("transformers") or ABSENT, cuda, run.commit, run.date,
            format_gbs(roofline.get("copy_gbs")), format_number(roofline.get("matmul_tflops")), run.source,
        ])  # fmt: skip
    lines = ["## Runs", ""] + _table(header, body, right_from=len(header))
    timings = sorted({run.timing for run in runs if run.timing})
    if timings:
        lines += ["", "Timing: " + "; ".join(timings) + "."]
    for run in runs:
        if run.backend != "auto":
            lines += ["", f"Run {run.id} ran with VASE_BACKEND={run.backend}: its vase rows of the model-level suites "
                      "(eviction, score modes, end to end) ran that backend, not the default dispatch."]  # fmt: skip
    return lines


# The benchmark issue's GPU targets, as the report reads them from its rows.
PREFILL_TARGET = "prefill + window scores ≥ 0.9x SDPA (flash) TFLOP/s at 8k tokens, causal, D = 128"
EMISSION_TARGET = "score emission ≤ 10 % over no emission (prefill at 8k tokens)"
DECODE_TARGET = "decode ≥ 70 % of the measured copy bandwidth at batch 16, C = 4160"
EVICTION_TARGET = "eviction amortised ≤ 3 % of decode attention time (`vase`)"
END_TO_END_TARGET = "end to end at 16k generated tokens, budget 2048: ≥ 2.5x the full caches' tokens/s, flat memory"
# The registry shapes each kernel target is read at.
PREFILL_TARGET_SHAPES = frozenset(
    PrefillShape(layout, batch, 8192).name
    for layout in QWEN3.values() if layout.head_dim == 128
    for batch in BATCH_SIZES
)
DECODE_TARGET_SHAPES = frozenset(CacheShape(layout, 16, 4096).name for layout in QWEN3.values())
EVICTION_KERNELS = ("eviction vase", "eviction vase (emitted)")
END_TO_END_LENGTH = 16384
END_TO_END_PROVIDER = "vase-2048"
TARGETS = (PREFILL_TARGET, EMISSION_TARGET, DECODE_TARGET, EVICTION_TARGET, END_TO_END_TARGET)


@dataclass(frozen=True)
class TargetCheck:
    """One target at one shape: what the rows show, and whether that meets it (None: not measured)."""

    target: str
    shape: str
    measured: str
    met: Optional[bool]

    @property
    def status(self) -> str:
        return "not measured" if self.met is None else ("met" if self.met else "not met")


def _timed_as(row: Row) -> str:
    """`, <how the row was timed>` (`eager calls`, `CUDA graph replays`) when its record says, else ``."""
    timing = row.record.details.get("timing")
    return f", {timing.split(',')[0]}" if timing else ""


def _prefill_checks(rows: Sequence[Row], index: RowIndex) -> list[TargetCheck]:
    checks = []
    for row in rows:
        record = row.record
        if (record.suite, record.provider) != ("prefill", "vase+scores") or record.shape not in PREFILL_TARGET_SHAPES:
            continue
        shape = f"{record.shape} (run {row.run.id})"
        over_sdpa = speedup(index, row, "sdpa")
        measured = ABSENT if over_sdpa is None else (
            f"{over_sdpa:.2f}x SDPA ({format_number(row.tflops)} TFLOP/s)"
            f"{other_run_note(index, row, provider_row(index, row, 'sdpa'))}")
        checks.append(TargetCheck(PREFILL_TARGET, shape, measured, None if over_sdpa is None else over_sdpa >= 0.9))
        over_plain = speedup(index, row, "vase")
        overhead = None if over_plain is None else 100.0 * (1.0 / over_plain - 1.0)
        measured = ABSENT if overhead is None else (
            f"{overhead:+.1f} % ({format_time(row.median_s)}){other_run_note(index, row, provider_row(index, row, 'vase'))}")
        checks.append(TargetCheck(EMISSION_TARGET, shape, measured, None if overhead is None else overhead <= 10.0))
    return checks


def _decode_checks(rows: Sequence[Row]) -> list[TargetCheck]:
    checks = []
    for row in rows:
        record = row.record
        if (record.suite, record.provider) != ("decode", "vase") or record.shape not in DECODE_TARGET_SHAPES:
            continue
        percent = row.roofline_percent
        if row.median_s is None:
            measured = ABSENT
        elif percent is None:
            measured = f"no roofline ({format_time(row.median_s)})"
        else:
            measured = f"{percent:.1f} % ({format_gbs(row.gbs)} GB/s{_timed_as(row)})"
        checks.append(TargetCheck(DECODE_TARGET, f"{record.shape} (run {row.run.id})", measured,
                                  None if percent is None else percent >= 70.0))  # fmt: skip
    return checks


def _eviction_checks(rows: Sequence[Row], index: RowIndex) -> list[TargetCheck]:
    checks = []
    for row in rows:
        record = row.record
        if record.suite != "eviction" or record.provider != "vase" or record.kernel not in EVICTION_KERNELS:
            continue
        percent = relative_percent(index, row)
        mode = record.details.get("score_mode", "recompute")
        measured = ABSENT if percent is None else (
            f"{percent:.2f} % ({format_time(row.per_step_s)} a step{_timed_as(row)})"
            f"{other_run_note(index, row, relative_row(index, row))}")
        checks.append(TargetCheck(EVICTION_TARGET, f"{record.shape}, {mode} (run {row.run.id})", measured,
                                  None if percent is None else percent <= 3.0))  # fmt: skip
    return checks


def _end_to_end_checks(rows: Sequence[Row], index: RowIndex) -> list[TargetCheck]:
    checks = []
    for row in rows:
        record = row.record
        points = {point.generated: point for point in record.curve}
        if (record.suite, record.provider) != (CURVE_SUITE, END_TO_END_PROVIDER) or END_TO_END_LENGTH not in points:
            continue
        ours = points[END_TO_END_LENGTH]
        parts, ratios = [], []
        for base in record.compare_to:
            other = index.find(row.run.device, (record.suite, record.kernel, base, record.shape), row.run.id)
            theirs = None if other is None else {p.generated: p for p in other.record.curve}.get(END_TO_END_LENGTH)
            ratios.append(None if theirs is None else ours.tokens_per_s / theirs.tokens_per_s)
            part = f"vs {base} {format_speedup(ratios[-1])}{other_run_note(index, row, other) if theirs else ''}"
            their_bytes = None if theirs is None else step_bytes(other, theirs)
            if their_bytes and step_bytes(row, ours):
                part += f" (bytes allow {format_speedup(their_bytes / step_bytes(row, ours))})"
            parts.append(part)
        held = {point.kv_bytes for point in record.curve}
        flat = len(held) == 1
        memory = f"KV cache {format_bytes(ours.kv_bytes)} " + (
            f"at all {len(record.curve)} lengths" if flat else "varies with length")
        measured = "; ".join(parts + [memory])
        met = None if not ratios or None in ratios else flat and min(ratios) >= 2.5
        checks.append(TargetCheck(END_TO_END_TARGET, f"{record.shape} (run {row.run.id})", measured, met))
    return checks


def targets_section(rows: Sequence[Row], index: RowIndex) -> list[str]:
    """The GPU targets, one line per target and shape; a target without rows says so."""
    checks = _prefill_checks(rows, index) + _decode_checks(rows) + _eviction_checks(rows, index)
    checks += _end_to_end_checks(rows, index)
    covered = {check.target for check in checks}
    checks += [TargetCheck(target, ABSENT, "no row of these runs measures it", None)
               for target in TARGETS if target not in covered]  # fmt: skip
    checks.sort(key=lambda check: TARGETS.index(check.target))
    body = [[check.target, check.shape, check.measured, check.status] for check in checks]
    return ["## Targets (GPU)", ""] + _table(["target", "shape", "measured", "status"], body, right_from=4)


def kernel_section(suite: str, rows: Sequence[Row], index: RowIndex) -> list[str]:
    """One table for a kernel suite: one row per kernel x shape x provider."""
    alternatives = list(dict.fromkeys(p for row in rows for p in row.record.compare_to))
    with_flops = any(row.record.flops for row in rows)
    with_bytes = any(row.record.bytes_moved for row in rows)
    with_steps = any(row.record.per_step for row in rows)
    # The rows each per-step time is a percentage of, by suite, kernel and provider (one column each).
    relatives = list(dict.fromkeys(row.record.relative_to[:3] for row in rows if row.record.relative_to))
    # Rows timed by different methods (graph replays beside eager calls) each name theirs.
    timings = list(dict.fromkeys(row.record.details["timing"] for row in rows if row.record.details.get("timing")))
    mixed_timing = len(timings) > 1
    kernels = list(dict.fromkeys(row.record.kernel for row in rows))
    header = ["run"] + (["kernel"] if len(kernels) > 1 else []) + ["shape", "provider", "median", "IQR", "p20–p80"]
    header += ["samples"] + (["timing"] if mixed_timing else [])
    header += (["TFLOP/s"] if with_flops else []) + (["GB/s"] if with_bytes else [])
    header += ["% of roofline"] if (with_flops or with_bytes) else []
    header += [f"vs {provider}" for provider in alternatives]
    if with_steps:
        header += ["per decode step"] + [f"% of {relative[0]} ({relative[2]})" for relative in relatives]
    body = []
    for row in rows:
        record = row.record
        cells = [row.run.id] + ([record.kernel] if len(kernels) > 1 else []) + [record.shape, record.provider]
        spread = ABSENT if row.p20_s is None else f"{format_time(row.p20_s)} – {format_time(row.p80_s)}"
        samples = ABSENT if row.rounds is None else str(row.rounds)
        cells += [format_time(row.median_s), format_time(row.iqr_s), spread, samples]
        if mixed_timing:
            timing = record.details.get("timing")
            cells.append(f"[{timings.index(timing) + 1}]" if timing else ABSENT)
        if with_flops:
            cells.append(format_number(row.tflops) if record.flops else NOT_APPLICABLE)
        if with_bytes:
            cells.append(format_gbs(row.gbs) if record.bytes_moved else NOT_APPLICABLE)
        if with_flops or with_bytes:
            cells.append(format_number(row.roofline_percent, " %") if row.run.roofline else "no roofline")
        for provider in alternatives:
            if provider not in record.compare_to:
                cells.append(NOT_APPLICABLE)
                continue
            faster = speedup(index, row, provider)
            note = "" if faster is None else other_run_note(index, row, provider_row(index, row, provider))
            cells.append(format_speedup(faster) + note)
        if with_steps:
            cells.append(format_time(row.per_step_s) if record.per_step else NOT_APPLICABLE)
            percent = relative_percent(index, row)
            for relative in relatives:
                of_it = record.relative_to is not None and record.relative_to[:3] == relative
                note = other_run_note(index, row, relative_row(index, row)) if percent is not None else ""
                cells.append(format_number(percent, " %", digits=2) + note if of_it else NOT_APPLICABLE)
        body.append(cells)
    first_number = header.index("median")
    lines = [f"## {suite}", ""]
    if len(kernels) == 1:
        lines += [f"Kernel: {kernels[0]}.", ""]
    if mixed_timing:
        lines += ["Timing (column `timing`): " + "; ".join(f"[{i}] {t}" for i, t in enumerate(timings, 1)) + ".", ""]
    elif timings:
        lines += [f"Timing: {timings[0]}.", ""]
    return lines + _table(header, body, right_from=first_number)


def curve_section(rows: Sequence[Row], index: RowIndex) -> list[str]:
    """End-to-end decoding: step latency, tokens/s, speed-up over the full caches and memory, per length."""
    lines = ["## end-to-end decoding against generated length", ""]
    for group in dict.fromkeys((row.run.id, row.record.shape) for row in rows):
        members = [row for row in rows if (row.run.id, row.record.shape) == group]
        lengths = sorted({point.generated for row in members for point in row.record.curve})
        first = members[0]
        lines += [f"### {first.record.shape} — run {first.run.id} ({first.run.device})", ""]
        lines += [f"- {row.record.provider}: {row.record.details.get('method', '')}; {_run_summary(row)}" for row in members]
        measures = [row.record.details["curve_measure"] for row in members if "curve_measure" in row.record.details]
        if measures:
            lines += ["", f"Median step latency and tokens/s (batch x steps / their total time) of {measures[0]}:", ""]
        else:  # records written before tokens/s counted every step
            lines += ["", "Median step latency and tokens/s (batch / median step) of the 256 steps up to each "
                      "length L:", ""]  # fmt: skip
        header = ["method"] + [f"{length:,} tokens" for length in lengths] + ["cost growth (last / first)"]
        body = []
        for row in members:
            steps = [point.step_s for point in row.record.curve]
            body.append(
                [row.record.provider]
                + _cells_by_length(row, lengths, lambda p: f"{format_time(p.step_s)} · {format_number(p.tokens_per_s, ' tok/s', 0)}")
                + [format_speedup(steps[-1] / steps[0]) if len(steps) > 1 else ABSENT]
            )
        lines += _table(header, body, right_from=1) + [""]
        baselines = [p for p in dict.fromkeys(p for row in members for p in row.record.compare_to)]
        pairs = [(row, base) for row in members for base in baselines if base in row.record.compare_to]
        if pairs:
            lines += ["Speed-up over the full caches (our tokens/s / theirs) at each length:", ""]
            header = ["method", "vs"] + [f"{length:,} tokens" for length in lengths] + ["faster from"]
            body = []
            for row, base in pairs:
                other = index.find(row.run.device, (row.record.suite, row.record.kernel, base, row.record.shape), row.run.id)
                ratios = _curve_ratios(row, other, lengths)
                pays = next((f"{length:,} tokens" for length in lengths if (ratios[length] or 0) > 1.0), "not within the run")
                vs = base + other_run_note(index, row, other)
                body.append([row.record.provider, vs] + [format_speedup(ratios[length]) for length in lengths] + [pays])
            lines += _table(header, body, right_from=2) + [""]
        lines += _bytes_section(members, pairs, lengths, index)
        lines += ["Memory at each length: KV cache held · peak allocated device memory (CUDA only):", ""]
        header = ["method"] + [f"{length:,} tokens" for length in lengths]
        body = [[row.record.provider] + _cells_by_length(row, lengths, _memory_cell) for row in members]
        lines += _table(header, body, right_from=1) + [""]
    return lines


def step_bytes(row: Row, point: CurvePoint) -> Optional[int]:
    """Bytes a decode step at `point` reads, as the report counts them: the weights and the KV cache
    held, once each; None for records without the weights' size.

    A VaSE cache's held bytes are all its buffers (`memory_bytes`): its keys and values, of which
    a step reads the valid slots (budget to all of them, and every slot at an eviction, one step
    in `window`), and the rest (per-slot positions, value magnitudes and scores, the query ring,
    the decode workspace), of which it reads a part; at the H200 record's shape the rest is 8 %
    of the cache, so its floor is about 1.4 % high."""
    weights = row.record.details.get("weight_bytes")
    return None if weights is None else weights + point.kv_bytes


def roofline_share(row: Row, point: CurvePoint) -> tuple[Optional[float], Optional[float]]:
    """(the step time `step_bytes` takes at the run's copy bandwidth, that time as a percentage of
    the mean step at `point`); Nones where the run measured no bandwidth."""
    needed, batch = step_bytes(row, point), row.record.details.get("batch")
    copy_gbs = (row.run.roofline or {}).get("copy_gbs")
    if needed is None or copy_gbs is None or not batch:
        return None, None
    floor_s = needed / (copy_gbs * 1e9)
    return floor_s, 100.0 * floor_s * point.tokens_per_s / batch


def _roofline_cell(row: Row, point: CurvePoint) -> str:
    floor_s, share = roofline_share(row, point)
    return ABSENT if floor_s is None else f"{format_time(floor_s)} · {format_number(share, ' %')}"


def _bytes_section(
    members: Sequence[Row], pairs: Sequence[tuple[Row, str]], lengths: list[int], index: RowIndex
) -> list[str]:
    """Each method's bandwidth roofline per length, and the speed-up the bytes allow over each full
    cache; nothing for runs whose records lack the weights' size."""
    sized = [row for row in members if "weight_bytes" in row.record.details]
    if not sized:
        return []
    lines = []
    header = ["method"] + [f"{length:,} tokens" for length in lengths]
    copy_gbs = (sized[0].run.roofline or {}).get("copy_gbs")
    if copy_gbs is not None:
        lines += [
            f"Bandwidth roofline: reading the weights ({format_bytes(sized[0].record.details['weight_bytes'])} a "
            "step, the embedding table aside) and the KV cache held (all of a VaSE cache's buffers, its query "
            "ring, scores and workspace included), once each, at this run's copy bandwidth "
            f"({format_gbs(copy_gbs)} GB/s) takes the time shown; the share is that time over the mean step:",
            "",
        ]  # fmt: skip
        body = [[row.record.provider] + _cells_by_length(row, lengths, functools.partial(_roofline_cell, row))
                for row in members]  # fmt: skip
        lines += _table(header, body, right_from=1) + [""]
    body = []
    for row, base in pairs:
        other = index.find(row.run.device, (row.record.suite, row.record.kernel, base, row.record.shape), row.run.id)
        theirs = {} if other is None else {point.generated: step_bytes(other, point) for point in other.record.curve}
        ours = {point.generated: step_bytes(row, point) for point in row.record.curve}
        body.append([row.record.provider, base + other_run_note(index, row, other)] + [
            format_speedup(theirs[length] / ours[length]) if theirs.get(length) and ours.get(length) else ABSENT
            for length in lengths
        ])  # fmt: skip
    if body:
        lines += ["Speed-up the bytes allow (their step's bytes / ours): the speed-up when both run at the same "
                  "share of the roofline; a measured one above it means the full cache runs further from its "
                  "roofline:", ""]  # fmt: skip
        lines += _table(["method", "vs"] + header[1:], body, right_from=2) + [""]
    return lines


def _cells_by_length(row: Row, lengths: list[int], describe) -> list[str]:
    """`describe(point)` for `row`'s curve point at each of `lengths`; `ABSENT` where it has none."""
    points = {point.generated: point for point in row.record.curve}
    return [ABSENT if length not in points else describe(points[length]) for length in lengths]


def _memory_cell(point: CurvePoint) -> str:
    peak = "" if point.peak_bytes is None else f" · {format_bytes(point.peak_bytes)}"
    return f"{format_bytes(point.kv_bytes)}{peak}"


def _tokens(count: Optional[int], what: str) -> str:
    """`1,024 {what}`, or `{what}: absent` for a record without the count."""
    return f"{what}: {ABSENT}" if count is None else f"{count:,} {what}"


def _run_summary(row: Row) -> str:
    details = row.record.details
    if details.get("sampled"):
        summary = f"{len(row.record.curve)} lengths sampled, the longest {_tokens(details.get('generated'), 'tokens')}"
    else:
        summary = _tokens(details.get("generated"), "tokens generated")
    if details.get("time_limited"):
        summary += " (stopped at the time limit)"
    tokens_per_s = details.get("tokens_per_s")
    if tokens_per_s:
        summary += f", {format_number(tokens_per_s, ' tok/s')} over the whole decode"
    return summary


def _curve_ratios(row: Row, other: Optional[Row], lengths: Sequence[int]) -> dict[int, Optional[float]]:
    ours = {point.generated: point.tokens_per_s for point in row.record.curve}
    theirs = {} if other is None else {point.generated: point.tokens_per_s for point in other.record.curve}
    return {
        length: (ours[length] / theirs[length]) if length in ours and length in theirs else None for length in lengths
    }


def _paper_setting(row: Row) -> str:
    details = row.record.details
    setting = f"{row.record.shape} · {_tokens(details.get('generated'), 'new tokens')}"
    sampled = details.get("estimated_from")
    if sampled:
        setting += f" (estimated from step times at {', '.join(f'{length:,}' for length in sampled)} tokens)"
    return setting


def paper_section(rows: Sequence[Row], index: RowIndex) -> list[str]:
    header = ["run", "setting", "method", "decode tok/s", "peak memory", "KV cache", "vs full cache",
              "paper tok/s", "paper GiB", "paper vs full cache"]  # fmt: skip
    body = []
    for row in rows:
        details = row.record.details
        # A row's full cache is the first provider it compares with; a row that compares with none is one.
        is_baseline = not row.record.compare_to
        baseline = None if is_baseline else row.record.compare_to[0]
        paper_base = next((r.record.details.get("paper_tokens_per_s") for r in rows
                           if r.record.provider == baseline and r.run.id == row.run.id), None)  # fmt: skip
        paper = details.get("paper_tokens_per_s")
        base = index.find(row.run.device, (row.record.suite, row.record.kernel, baseline, row.record.shape),
                          row.run.id)  # fmt: skip
        ours = details.get("tokens_per_s")
        theirs = None if base is None else base.record.details.get("tokens_per_s")
        vs_full = ours / theirs if ours and theirs and not is_baseline else None
        body.append([
            row.run.id, _paper_setting(row), row.record.provider,
            format_number(ours), format_bytes(details.get("peak_bytes")),
            format_bytes(details.get("kv_bytes")),
            NOT_APPLICABLE if is_baseline else format_speedup(vs_full) + (
                other_run_note(index, row, base) if vs_full else ""),
            format_number(paper), format_number(details.get("paper_peak_gib")),
            format_speedup(paper / paper_base) if paper and paper_base and not is_baseline else NOT_APPLICABLE,
        ])  # fmt: skip
    lines = ["## the paper's throughput protocol", ""]
    lines += ["The paper's setting is batch 16, 256 prompt tokens, 16,384 new tokens, greedy, decode time "
              "only, Qwen3-14B on one GPU; its figures are shown next to runs of that setting (its memory in GiB: "
              "the authors' throughput script divides the peak allocated bytes by 1024³). Weights: "
              f"{rows[0].record.details.get('weights', ABSENT)}.", ""]  # fmt: skip
    return lines + _table(header, body, right_from=3)


def comparison_section(changes: Sequence[Change], threshold: float) -> list[str]:
    header = ["device", "suite", "kernel", "provider", "shape", "before", "now", "change", "verdict"]
    body = []
    for change in changes:
        percent = ABSENT if change.change is None else f"{100 * change.change:+.1f} %"
        body.append([*change.key, format_time(change.old_s), format_time(change.new_s), percent, change.verdict])
    regressions = sum(change.verdict == "REGRESSION" for change in changes)
    lines = [f"## comparison with the earlier run (threshold {100 * threshold:.1f} % on the median)", ""]
    lines += [f"{regressions} regression(s). End-to-end rows compare their step latencies summed over the "
              "generated lengths both runs reached (their median over steps depends on how far a run got).", ""]
    return lines + _table(header, body, right_from=5)


def render(
    rows: Sequence[Row], changes: Optional[Sequence[Change]], threshold: float, plots: Sequence[str],
    plot_note: Optional[str] = None, notes: Sequence[str] = (),
) -> str:
    """The markdown report; `notes` (files that added no row) follow the Runs table."""
    runs = list({row.run.id: row.run for row in rows}.values())
    index = RowIndex(rows)
    lines = ["# vase_triton benchmark report", ""]
    if any(not run.is_measurement for run in runs):
        lines += ["> **Smoke run — not a measurement.** Tiny shapes, run once (on CPU through the Triton "
                  "interpreter) to check that every suite works. Do not quote these times.", ""]  # fmt: skip
    lines += runs_section(runs) + [""]
    lines += [f"Note: {note}." for note in notes] + ([""] if notes else [])
    gpu_rows = [row for row in rows if not row.run.device.startswith("CPU")]
    if gpu_rows:
        lines += targets_section(gpu_rows, index) + [""]
    for suite in KERNEL_SUITES:
        suite_rows = [row for row in rows if row.record.suite == suite]
        if suite_rows:
            lines += kernel_section(suite, suite_rows, index) + [""]
    curve_rows = [row for row in rows if row.record.suite == CURVE_SUITE]
    if curve_rows:
        lines += curve_section(curve_rows, index)
        lines += [f"![{name}]({name})" for name in plots] + ([plot_note] if plot_note else []) + [""]
    paper_rows = [row for row in rows if row.record.suite == PAPER_SUITE]
    if paper_rows:
        lines += paper_section(paper_rows, index) + [""]
    if changes is not None:
        lines += comparison_section(changes, threshold) + [""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CSV and plots

CSV_FIELDS = ("run", "device", "profile", "torch", "triton", "transformers", "commit", "date", "suite", "kernel",
              "provider", "shape", "median_s", "iqr_s", "p20_s", "p80_s", "rounds", "tflops", "gbs",
              "roofline_percent")  # fmt: skip


def write_csv(rows: Sequence[Row], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_FIELDS)
        for row in rows:
            run, record = row.run, row.record
            writer.writerow([
                run.id, run.device, run.profile, run.versions.get("torch"), run.versions.get("triton"),
                run.versions.get("transformers"), run.commit, run.date, record.suite, record.kernel, record.provider,
                record.shape, row.median_s, row.iqr_s, row.p20_s, row.p80_s, row.rounds, row.tflops, row.gbs,
                row.roofline_percent,
            ])  # fmt: skip


def _spaced_ticks(lengths: Sequence[int], min_ratio: float = 1.2) -> list[int]:
    """The ascending `lengths` less any within `min_ratio` of the last one kept (on a log axis, 1019
    and 1024 would print over each other); the largest is kept in place of its near neighbour."""
    ticks: list[int] = []
    for length in lengths:
        if ticks and length < ticks[-1] * min_ratio:
            ticks[-1] = length
        else:
            ticks.append(length)
    return ticks


def plot_curves(rows: Sequence[Row], directory: Path) -> list[str]:
    """`decode_step_latency.png` and `memory.png`: one line per method and run; returns the file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve_rows = [row for row in rows if row.record.suite == CURVE_SUITE and row.record.curve]
    if not curve_rows:
        return []
    gpu = any(point.peak_bytes is not None for row in curve_rows for point in row.record.curve)
    panels = (
        ("decode_step_latency.png", "decode step latency (ms)", lambda p: p.step_s * 1e3),
        ("memory.png", "peak allocated memory (GiB)" if gpu else "KV cache (GiB)",
         lambda p: None if gpu and p.peak_bytes is None else (p.peak_bytes if gpu else p.kv_bytes) / 2**30),
    )  # fmt: skip
    names = []
    for name, label, value in panels:
        figure, axis = plt.subplots(figsize=(7, 4.5))
        for row in curve_rows:
            # A point without the value (a CPU run's peak memory beside a GPU run's) is left out, not drawn as 0.
            points = [(point.generated, value(point)) for point in row.record.curve if value(point) is not None]
            xs, ys = [x for x, _ in points], [y for _, y in points]
            axis.plot(xs, ys, marker="o", label=f"{row.record.provider} ({row.run.id}, {row.record.shape})")
        axis.set_xscale("log", base=2)
        ticks = _spaced_ticks(sorted({point.generated for row in curve_rows for point in row.record.curve}))
        axis.set_xticks(ticks, [f"{length / 1024:g}k" if length >= 1024 else str(length) for length in ticks])
        axis.minorticks_off()
        axis.set_xlabel("generated tokens")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
        devices = ", ".join(dict.fromkeys(row.run.device for row in curve_rows))
        axis.set_title(f"{label.split(' (')[0]} vs generated length — {devices}", fontsize=9)
        figure.tight_layout()
        figure.savefig(directory / name, dpi=120)
        plt.close(figure)
        names.append(name)
    return names


# ----------------------------------------------------------------------------- command line


def _load_argument(
    parser: argparse.ArgumentParser, argument: str, paths: Sequence[Path], prefix: str
) -> tuple[list[Row], list[str]]:
    """`load_runs(paths)` and a note for each file that holds no benchmark (a suite stopped before
    its first row), or exit with status 2 and one line naming `argument` when a file is unusable or
    given twice, or when the files hold no benchmark at all."""
    seen = set()
    for path in paths:
        if path.resolve() in seen:
            parser.exit(2, f"{parser.prog}: error: argument {argument}: {path}: given twice\n")
        seen.add(path.resolve())
    try:
        rows = load_runs(paths, prefix)
    except ValueError as error:
        parser.exit(2, f"{parser.prog}: error: argument {argument}: {error}\n")
    if not rows:
        parser.exit(2, f"{parser.prog}: error: argument {argument}: no benchmark in {', '.join(map(str, paths))}\n")
    with_rows = {row.run.source for row in rows}
    empty = [label for label in source_labels(paths) if label not in with_rows]
    return rows, [f"{label} ({argument}) holds no benchmark: it adds no row" for label in empty]


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a finite percentage >= 0; got {text}")
    return value


def _directory(text: str) -> Path:
    if not text:
        raise argparse.ArgumentTypeError("expected a directory path; got an empty string")
    return Path(text)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="pytest-benchmark JSON files written by the suites")
    parser.add_argument("--out", type=_directory, required=True,
                        help="directory for report.md, results.csv and the plots")
    parser.add_argument("--compare", nargs="+", type=Path, help="earlier JSON file(s) to compare the medians with")
    parser.add_argument("--threshold", type=_percent,
                        help=f"with --compare: percent slower on the median that counts as a regression "
                             f"(default {DEFAULT_THRESHOLD_PERCENT:g})")  # fmt: skip
    args = parser.parse_args(argv)
    if args.threshold is not None and not args.compare:
        parser.exit(2, f"{parser.prog}: error: argument --threshold: only means something with --compare\n")
    rows, notes = _load_argument(parser, "results", args.results, "#")
    threshold = (DEFAULT_THRESHOLD_PERCENT if args.threshold is None else args.threshold) / 100.0
    changes = None
    if args.compare:
        results = {path.resolve() for path in args.results}
        for path in args.compare:
            if path.resolve() in results:
                parser.exit(2, f"{parser.prog}: error: argument --compare: {path}: also given as a result; "
                               "compare two different runs\n")  # fmt: skip
        old_rows, old_notes = _load_argument(parser, "--compare", args.compare, "old #")
        notes += old_notes
        try:
            changes = compare(rows, old_rows, threshold)
        except ValueError as error:
            parser.exit(2, f"{parser.prog}: error: {error}\n")
        if all(change.change is None for change in changes):
            devices = sorted({row.run.device for row in rows})
            parser.exit(2, f"{parser.prog}: error: argument --compare: no timed row matches one of this run by "
                           f"device, suite, kernel, provider and shape, with a generated length in common for "
                           f"end-to-end rows (this run: {', '.join(devices)}); nothing was compared\n")  # fmt: skip
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        try:
            plots, plot_note = plot_curves(rows, args.out), None
        except ImportError:
            plots, plot_note = [], "Plots not drawn: matplotlib is not installed (`pip install -e \".[bench]\"`)."
        text = render(rows, changes, threshold, plots, plot_note, notes)
        (args.out / "report.md").write_text(text, encoding="utf-8")
        write_csv(rows, args.out / "results.csv")
    except OSError as error:
        parser.exit(2, f"{parser.prog}: error: argument --out: {error.filename or args.out}: {error.strerror}\n")
    print(f"report written to {args.out / 'report.md'} ({len(rows)} rows)")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    regressions = [change for change in changes or () if change.verdict == "REGRESSION"]
    for change in regressions:
        measure = "on the median" if change.measure == MEDIAN else "on the step latencies summed over common lengths"
        print(f"regression: {' / '.join(change.key)}: {100 * change.change:+.1f} % {measure}", file=sys.stderr)
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
