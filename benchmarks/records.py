"""What a benchmark row records next to pytest-benchmark's timing (`extra_info`), and how it is read back.

Suites attach one `Record` to their `benchmark` fixture; pytest-benchmark stores it in the
JSON as `extra_info`, and `benchmarks.report` reads it back with `Record.from_extra_info`.
A row's identity is `(suite, kernel, provider, shape)`; rows of one `(suite, kernel, shape)`
are compared with each other.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Optional

MATMUL = "matmul"  # compute bound: achieved TFLOP/s against the measured bf16 matmul rate
COPY = "copy"  # memory bound: achieved GB/s against the measured copy bandwidth
ROOFLINES = (MATMUL, COPY)

# The decode suite's rows, which the eviction suite's amortised cost is a percentage of.
DECODE_SUITE = "decode"
DECODE_KERNEL = "decode attention (one step)"


def is_number(value) -> bool:
    """A JSON number (NaN and infinities included), not a boolean."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_count(value) -> bool:
    """An int, not a boolean."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value) -> bool:
    return is_number(value) and math.isfinite(value)


def _check(name: str, ok: bool, expected: str, value) -> None:
    if not ok:
        raise ValueError(f"{name}: expected {expected}; got {value!r}")


# The `Record.details` entries the report formats: name -> (the kind it must be, absent or null aside; its
# description). Checked on load, so that a hand-edited record is refused, not a traceback mid-report.
_DETAIL_KINDS = {
    **{name: (lambda v: isinstance(v, str), "a string") for name in
       ("timing", "score_mode", "method", "curve_measure", "weights", "prompt_fill")},
    **{name: (lambda v: is_count(v) and v >= 0, "a count >= 0") for name in ("generated", "kv_bytes", "peak_bytes")},
    **{name: (lambda v: is_count(v) and v > 0, "a positive count") for name in ("weight_bytes", "batch")},
    **{name: (lambda v: _is_finite(v) and v > 0, "a positive number") for name in
       ("tokens_per_s", "paper_tokens_per_s", "paper_peak_gib")},
    **{name: (lambda v: isinstance(v, bool), "true, false") for name in ("sampled", "time_limited")},
    "estimated_from": (lambda v: isinstance(v, list) and all(is_count(n) for n in v), "a list of token counts"),
}


@dataclass(frozen=True)
class CurvePoint:
    """Decoding after `generated` new tokens: median step latency around that length and memory.

    `kv_bytes` is the KV cache the method holds at that length; `peak_bytes` the device's
    peak allocated memory so far (None on CPU); `steps` how many steps, ending with the one
    that produced token `generated`, the latency and tokens/s are over (None in records
    written before it was kept).
    """

    generated: int
    step_s: float
    tokens_per_s: float
    kv_bytes: int
    peak_bytes: Optional[int] = None
    steps: Optional[int] = None

    def __post_init__(self) -> None:
        _check("curve.generated", is_count(self.generated) and self.generated >= 0, "a token count", self.generated)
        for name in ("step_s", "tokens_per_s"):
            value = getattr(self, name)
            _check(f"curve.{name}", _is_finite(value) and value > 0, "a finite number > 0", value)
        for name in ("kv_bytes", "peak_bytes", "steps"):
            value = getattr(self, name)
            if name == "kv_bytes" or value is not None:
                _check(f"curve.{name}", is_count(value) and value >= 0, "a count >= 0", value)

    @property
    def centre(self) -> float:
        """The mean length of the steps measured: the point's place on a curve of mean step time."""
        return self.generated - (self.steps - 1) / 2 if self.steps else float(self.generated)


@dataclass(frozen=True)
class Record:
    """The identity and work of one benchmark row.

    flops / bytes_moved: nominal work of one timed call; roofline: which measured peak the
    achieved rate is a percentage of (`MATMUL` or `COPY`), None when no roofline applies.
    compare_to: providers of the same `(suite, kernel, shape)` this row's speed-up is shown
    against. per_step: the timed call serves this many decode steps (an eviction every
    `window` steps), so the report also shows the time divided by it. relative_to: the
    `(suite, kernel, provider, shape)` of a row that the per-step time is a percentage of.
    curve: decoding measured against generated length (end-to-end suites). details: anything
    else worth stating (backend, dtype, layers, limits).
    """

    suite: str
    kernel: str
    provider: str
    shape: str
    flops: Optional[float] = None
    bytes_moved: Optional[float] = None
    roofline: Optional[str] = None
    compare_to: tuple[str, ...] = ()
    per_step: Optional[int] = None
    relative_to: Optional[tuple[str, str, str, str]] = None
    curve: tuple[CurvePoint, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("suite", "kernel", "provider", "shape"):
            value = getattr(self, name)
            _check(name, isinstance(value, str) and value != "", "a non-empty string", value)
        for name in ("flops", "bytes_moved"):
            value = getattr(self, name)
            _check(name, value is None or (_is_finite(value) and value > 0), "a positive number or None", value)
        if self.roofline is not None and self.roofline not in ROOFLINES:
            raise ValueError(f"roofline: expected one of {ROOFLINES} or None; got {self.roofline!r}")
        _check("compare_to", all(isinstance(p, str) and p for p in self.compare_to), "provider names",
               self.compare_to)  # fmt: skip
        _check("per_step", self.per_step is None or (is_count(self.per_step) and self.per_step > 0),
               "a positive count or None", self.per_step)  # fmt: skip
        relative = self.relative_to
        _check("relative_to", relative is None or (len(relative) == 4 and all(isinstance(p, str) for p in relative)),
               "(suite, kernel, provider, shape) or None", relative)  # fmt: skip
        for name, (valid, expected) in _DETAIL_KINDS.items():
            value = self.details.get(name)
            _check(f"details.{name}", value is None or valid(value), f"{expected} or null", value)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.suite, self.kernel, self.provider, self.shape)

    @property
    def group(self) -> tuple[str, str, str]:
        return (self.suite, self.kernel, self.shape)

    def to_extra_info(self) -> dict[str, Any]:
        info = dataclasses.asdict(self)
        info["compare_to"] = list(self.compare_to)
        info["relative_to"] = None if self.relative_to is None else list(self.relative_to)
        info["curve"] = [dataclasses.asdict(point) for point in self.curve]
        return info

    @classmethod
    def from_extra_info(cls, info: dict[str, Any]) -> "Record":
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {name: info[name] for name in fields if name in info}
        for name in ("compare_to", "relative_to", "curve"):
            _check(name, values.get(name) is None or isinstance(values[name], list), "a list or null", values.get(name))
        _check("details", isinstance(values.get("details") or {}, dict), "an object", values.get("details"))
        values["compare_to"] = tuple(values.get("compare_to") or ())
        relative = values.get("relative_to")
        values["relative_to"] = None if relative is None else tuple(relative)
        values["curve"] = tuple(CurvePoint(**point) for point in values.get("curve") or ())
        values["details"] = dict(values.get("details") or {})
        return cls(**values)
