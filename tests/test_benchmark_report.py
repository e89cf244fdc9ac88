"""The benchmark report generator (`benchmarks.report`) on recorded pytest-benchmark JSON.

`tests/data/benchmarks_smoke_cpu.json` is a CPU smoke run of every suite there was when it
was recorded (`python -m pytest benchmarks --benchmark-json ...`; the `prompt` suite came later). The other inputs are that file with the rows
replaced by hand-made ones of known timings, on a made-up GPU with a known roofline, so
rates, roofline percentages, speed-ups and regressions can be checked exactly.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from pytest_benchmark.stats import Stats

from benchmarks import report
from benchmarks.records import COPY, MATMUL, CurvePoint, Record

RECORDED = Path(__file__).parent / "data" / "benchmarks_smoke_cpu.json"
SUITES = ("prefill", "decode", "eviction", "score-mode", "end-to-end", "paper-throughput")
ROOFLINE = {"copy_gbs": 4000.0, "matmul_tflops": 800.0, "method": "made up"}
PREFILL = ("prefill", "prefill attention (causal)")
DECODE = ("decode", "decode attention (one step)")
E2E = ("end-to-end", "greedy decode vs generated length")


def _entry(template: dict, record: Record, samples) -> dict:
    entry = copy.deepcopy(template)
    entry["extra_info"] = record.to_extra_info()
    stats = Stats()
    for sample in samples:
        stats.update(sample)
    entry["stats"] = {**stats.as_dict(), "data": list(samples), "iterations": 1}
    return entry


def _spread(median: float) -> list[float]:
    """Five samples of median m: p20 = 0.964 m, p80 = 1.036 m, IQR 0.04 m (linear interpolation;
    pytest-benchmark's own IQR, 0.08 m, would be wider than p20–p80)."""
    return [0.9 * median, 0.98 * median, median, 1.02 * median, 1.1 * median]


GRAPHED = "CUDA graph replays"
EAGER = "eager calls"


def synthetic_rows(decode_slowdown: float = 1.0) -> list[tuple[Record, list[float]]]:
    """Kernel and end-to-end rows with known medians (seconds)."""
    decode = DECODE + ("vase", "Qwen3-8B B16 C4160")
    return [
        (Record(*PREFILL, "vase", "Qwen3-8B B1 T8192", flops=4e11, roofline=MATMUL,
                compare_to=("sdpa", "flash-attn", "reference")), _spread(1e-3)),
        (Record(*PREFILL, "vase+scores", "Qwen3-8B B1 T8192", flops=4e11, roofline=MATMUL,
                compare_to=("sdpa", "flash-attn", "reference", "vase")), _spread(1.05e-3)),
        (Record(*PREFILL, "sdpa", "Qwen3-8B B1 T8192", flops=4e11, roofline=MATMUL), _spread(1.1e-3)),
        (Record(*decode, bytes_moved=2.8e8, roofline=COPY, compare_to=("sdpa",), details={"timing": GRAPHED}),
         _spread(1e-4 * decode_slowdown)),
        (Record(*DECODE, "sdpa", "Qwen3-8B B16 C4160", bytes_moved=2.8e8, roofline=COPY,
                details={"timing": GRAPHED}), _spread(1.5e-4)),
        (Record("eviction", "eviction vase", "vase", "Qwen3-8B B16 C4160", bytes_moved=1e8, roofline=COPY,
                compare_to=("reference",), per_step=64, relative_to=decode, details={"timing": GRAPHED}),
         _spread(1.28e-4)),
        (Record("eviction", "eviction vase", "reference", "Qwen3-8B B16 C4160", bytes_moved=1e8, roofline=COPY,
                per_step=64, relative_to=decode, details={"timing": EAGER}), _spread(6.4e-4)),
        (Record(*E2E, "hf-dynamic", "Qwen3-8B (2 layers) B16 P256",
                curve=(CurvePoint(1024, 0.010, 1600.0, 2**30), CurvePoint(2048, 0.020, 800.0, 2**31))),
         [0.010, 0.015, 0.020]),
        (Record(*E2E, "vase-2048", "Qwen3-8B (2 layers) B16 P256", compare_to=("hf-dynamic", "hf-static"),
                details={"sampled": True, "generated": 2048, "curve_measure": "127 steps ending at L"},
                # Evicting steps make its tokens/s (over all steps) lower than batch / median (2000).
                curve=(CurvePoint(1024, 0.008, 1920.0, 2**29), CurvePoint(2048, 0.008, 1920.0, 2**29))),
         [0.008, 0.008, 0.008]),
    ]  # fmt: skip


def write_synthetic(path: Path, rows, device: str = "NVIDIA H200") -> Path:
    data = json.loads(RECORDED.read_text())
    template = data["benchmarks"][0]
    data["machine_info"]["vase_bench"].update(device=device, profile="gpu", roofline=ROOFLINE)
    data["benchmarks"] = [_entry(template, record, samples) for record, samples in rows]
    path.write_text(json.dumps(data))
    return path


def by_key(rows: list[report.Row]) -> dict[tuple, report.Row]:
    return {row.record.key: row for row in rows}


def test_recorded_smoke_run_has_every_suite_and_renders_as_a_smoke(tmp_path):
    rows = report.load_runs([RECORDED])
    assert {row.record.suite for row in rows} == set(SUITES)
    assert all(row.median_s is not None and row.median_s > 0 for row in rows)
    assert report.main([str(RECORDED), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    assert "Smoke run — not a measurement" in text
    # Recorded before tokens/s counted every step: its curve says what its figures are.
    assert "tokens/s (batch / median step) of the 256 steps up to each length L:" in text
    for suite in ("## prefill", "## decode", "## eviction", "## score-mode", "## end-to-end", "## the paper"):
        assert suite in text
    assert (tmp_path / "decode_step_latency.png").stat().st_size > 0
    assert (tmp_path / "memory.png").stat().st_size > 0
    assert len((tmp_path / "results.csv").read_text().splitlines()) == len(rows) + 1


def test_rates_roofline_percentages_and_spread(tmp_path):
    rows = by_key(report.load_runs([write_synthetic(tmp_path / "new.json", synthetic_rows())]))
    prefill = rows[PREFILL + ("vase", "Qwen3-8B B1 T8192")]
    assert prefill.median_s == pytest.approx(1e-3)
    assert prefill.tflops == pytest.approx(400.0)
    assert prefill.roofline_percent == pytest.approx(50.0)
    assert prefill.p20_s == pytest.approx(0.964e-3) and prefill.p80_s == pytest.approx(1.036e-3)
    assert prefill.iqr_s == pytest.approx(0.04e-3)
    decode = rows[DECODE + ("vase", "Qwen3-8B B16 C4160")]
    assert decode.gbs == pytest.approx(2800.0)
    assert decode.roofline_percent == pytest.approx(70.0)
    assert decode.tflops is None


def test_speedups_and_absent_baselines(tmp_path):
    rows = report.load_runs([write_synthetic(tmp_path / "new.json", synthetic_rows())])
    index, keyed = report.RowIndex(rows), by_key(rows)
    vase = keyed[PREFILL + ("vase", "Qwen3-8B B1 T8192")]
    scores = keyed[PREFILL + ("vase+scores", "Qwen3-8B B1 T8192")]
    assert report.speedup(index, vase, "sdpa") == pytest.approx(1.1)
    assert report.speedup(index, scores, "vase") == pytest.approx(1 / 1.05)
    assert report.speedup(index, vase, "flash-attn") is None
    assert report.speedup(index, vase, "reference") is None
    eviction = keyed[("eviction", "eviction vase", "vase", "Qwen3-8B B16 C4160")]
    assert eviction.per_step_s == pytest.approx(2e-6)
    assert report.relative_percent(index, eviction) == pytest.approx(2.0)

    text = report.render(rows, None, 0.05, [])
    prefill_line = next(line for line in text.splitlines() if "| Qwen3-8B B1 T8192 | vase |" in line)
    cells = [cell.strip() for cell in prefill_line.strip("|").split("|")]
    assert cells[2:] == ["vase", "1.00 ms", "40.0 µs", "964.0 µs – 1.04 ms", "5", "400.0", "50.0 %",
                         "1.10x", "absent", "absent", "—"]  # fmt: skip
    assert "0.00x" not in text and "| 0.0 |" not in text
    assert "Smoke run" not in text
    decode_section = text.split("## decode")[1].split("## ")[0]
    assert f"Timing: {GRAPHED}." in decode_section
    assert "Timing" not in text.split("## prefill")[1].split("## ")[0]


def test_prompt_rows_have_a_section_of_their_own_with_the_speedup_over_the_full_cache(tmp_path):
    prompt = ("prompt", "prompt to first token (generate, 1 new token)")
    rows = report.load_runs([write_synthetic(tmp_path / "new.json", [
        (Record(*prompt, "hf-dynamic", "small-qwen3 B1 P4096"), _spread(2.0)),
        (Record(*prompt, "vase-256", "small-qwen3 B1 P4096", compare_to=("hf-dynamic",)), _spread(2.5)),
    ])])  # fmt: skip
    section = report.render(rows, None, 0.05, []).split("## prompt")[1].split("## ")[0]
    assert "Kernel: prompt to first token (generate, 1 new token)." in section
    vase_line = next(line for line in section.splitlines() if "| vase-256 |" in line)
    cells = [cell.strip() for cell in vase_line.strip("|").split("|")]
    assert cells[1:] == ["small-qwen3 B1 P4096", "vase-256", "2.50 s", "100.00 ms", "2.41 s – 2.59 s", "5", "0.80x"]


def test_rows_timed_differently_name_their_timing(tmp_path):
    rows = report.load_runs([write_synthetic(tmp_path / "new.json", synthetic_rows())])
    section = report.render(rows, None, 0.05, []).split("## eviction")[1].split("## ")[0]
    assert f"Timing (column `timing`): [1] {GRAPHED}; [2] {EAGER}." in section
    header = next(line for line in section.splitlines() if line.startswith("| run |"))
    column = [cell.strip() for cell in header.strip("|").split("|")].index("timing")
    for provider, label in (("vase", "[1]"), ("reference", "[2]")):
        line = next(line for line in section.splitlines() if f"| Qwen3-8B B16 C4160 | {provider} |" in line)
        assert [cell.strip() for cell in line.strip("|").split("|")][column] == label
    decode = report.render(rows, None, 0.05, []).split("## decode")[1]
    assert "timing" not in next(line for line in decode.splitlines() if line.startswith("| run |"))


def test_end_to_end_ratios_per_length(tmp_path):
    """Speed-ups are ratios of tokens/s (evicting steps included), not of median steps (1.25x, 2.50x)."""
    rows = report.load_runs([write_synthetic(tmp_path / "new.json", synthetic_rows())])
    text = report.render(rows, None, 0.05, [])
    ratio_line = next(line for line in text.splitlines() if line.startswith("| vase-2048 | hf-dynamic |"))
    assert [cell.strip() for cell in ratio_line.strip("|").split("|")][2:] == ["1.20x", "2.40x", "1,024 tokens"]
    static_line = next(line for line in text.splitlines() if line.startswith("| vase-2048 | hf-static |"))
    assert [cell.strip() for cell in static_line.strip("|").split("|")][2:] == ["absent", "absent", "not within the run"]
    growth_line = next(line for line in text.splitlines() if line.startswith("| hf-dynamic | 10.00 ms"))
    assert growth_line.rstrip("| ").endswith("2.00x")
    assert "- vase-2048: ; 2 lengths sampled, the longest 2,048 tokens" in text
    assert "tokens/s (batch x steps / their total time) of 127 steps ending at L:" in text


def test_end_to_end_roofline_and_the_speedup_the_bytes_allow(tmp_path):
    """At 4,000 GB/s a step reading 2 GB of weights and 6 GB of static cache takes 2 ms (20 % of a
    10 ms mean step: 16 sequences at 1,600 tok/s); VaSE's 2 + 1 GB take 0.75 ms (15 % of 5 ms),
    so its bytes allow 8 / 3 = 2.67x. A full cache recorded without its weights' size is absent."""
    shape = "Qwen3-8B B16 P256"
    sized = {"batch": 16, "weight_bytes": 2 * 10**9}
    rows = [
        (Record(*E2E, "hf-static", shape, details=sized,
                curve=(CurvePoint(1024, 0.010, 1600.0, 6 * 10**9), CurvePoint(2048, 0.010, 1600.0, 6 * 10**9))),
         [0.010] * 3),
        (Record(*E2E, "hf-dynamic", shape, details={"batch": 16},
                curve=(CurvePoint(1024, 0.010, 1600.0, 10**9), CurvePoint(2048, 0.020, 800.0, 2 * 10**9))),
         [0.010, 0.020]),
        (Record(*E2E, "vase-2048", shape, compare_to=("hf-dynamic", "hf-static"), details=sized,
                # A median step of 4 ms, a mean of 5 ms (16 / 3,200 tok/s): the share is of the mean.
                curve=(CurvePoint(1024, 0.004, 3200.0, 10**9), CurvePoint(2048, 0.004, 3200.0, 10**9))),
         [0.004, 0.004, 0.007]),
    ]  # fmt: skip
    lines = report.render(report.load_runs([write_synthetic(tmp_path / "e2e.json", rows)]), None, 0.05, []).splitlines()

    def cells(prefix: str, after: str) -> list[str]:
        start = next(i for i, line in enumerate(lines) if line.startswith(after))
        line = next(line for line in lines[start:] if line.startswith(prefix))
        return [cell.strip() for cell in line.strip("|").split("|")]

    roofline = "Bandwidth roofline: reading the weights (1.86 GiB a step"
    assert next(line for line in lines if line.startswith(roofline)).count("(4,000 GB/s)") == 1
    assert cells("| hf-static |", roofline)[1:] == ["2.00 ms · 20.0 %"] * 2
    assert cells("| vase-2048 |", roofline)[1:] == ["750.0 µs · 15.0 %"] * 2
    assert cells("| hf-dynamic |", roofline)[1:] == ["absent"] * 2
    allowed = "Speed-up the bytes allow"
    assert cells("| vase-2048 | hf-static |", allowed)[2:] == ["2.67x"] * 2
    assert cells("| vase-2048 | hf-dynamic |", allowed)[2:] == ["absent"] * 2
    # The measured speed-up over the StaticCache (2.00x) sits in its own table, above.
    assert cells("| vase-2048 | hf-static |", "Speed-up over the full caches")[2:4] == ["2.00x"] * 2


def test_end_to_end_without_the_weights_size_shows_no_roofline(tmp_path):
    text = report.render(report.load_runs([write_synthetic(tmp_path / "new.json", synthetic_rows())]), None, 0.05, [])
    assert "## end-to-end decoding" in text
    assert "Bandwidth roofline" not in text and "Speed-up the bytes allow" not in text


def _targets(text: str) -> list[list[str]]:
    """The cells of the targets table's rows."""
    section = text[text.index("## Targets (GPU)"):].split("\n\n")[1]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()[2:]]


def test_targets_read_from_the_kernel_rows(tmp_path):
    """Prefill 1.1 / 1.05 ms = 1.05x SDPA with +5 % for the scores; decode 2.8e8 B in 0.2 ms =
    1,400 GB/s, 35 % of 4,000; eviction 0.128 ms / 64 = 2 µs a step, 1 % of that decode step."""
    rows = report.load_runs([write_synthetic(tmp_path / "new.json", synthetic_rows(decode_slowdown=2.0))])
    targets = _targets(report.render(rows, None, 0.05, []))
    assert [row[3] for row in targets] == ["met", "met", "not met", "met", "not measured"]
    assert targets[0][1:3] == ["Qwen3-8B B1 T8192 (run #1)", "1.05x SDPA (381.0 TFLOP/s)"]
    assert targets[1][2] == "+5.0 % (1.05 ms)"
    assert targets[2][1:3] == ["Qwen3-8B B16 C4160 (run #1)", "35.0 % (1,400 GB/s, CUDA graph replays)"]
    assert targets[3][1:3] == ["Qwen3-8B B16 C4160, recompute (run #1)", "1.00 % (2.0 µs a step, CUDA graph replays)"]
    assert targets[4][1:3] == ["absent", "no row of these runs measures it"]


@pytest.mark.parametrize(
    "static_tps, dynamic_tps, vase_kv, status",
    [(1000.0, 500.0, (2**29, 2**29), "met"), (1300.0, 500.0, (2**29, 2**29), "not met"),
     (1000.0, 500.0, (2**29, 2**30), "not met"), (1000.0, None, (2**29, 2**29), "not measured")],
    ids=["met", "slower-than-2.5x-the-static-cache", "memory-grows", "a-full-cache-absent"],
)  # fmt: skip
def test_end_to_end_target_at_16k_needs_every_full_cache_and_flat_memory(
    tmp_path, static_tps, dynamic_tps, vase_kv, status
):
    shape = "Qwen3-8B B16 P256"
    sized = {"batch": 16, "weight_bytes": 2 * 10**9}

    def full(name, tps):
        curve = (CurvePoint(8192, 0.01, 2 * tps, 4 * 10**9), CurvePoint(16384, 0.02, tps, 8 * 10**9))
        return Record(*E2E, name, shape, details=sized, curve=curve), [0.01, 0.02]

    rows = [full("hf-static", static_tps)] + ([full("hf-dynamic", dynamic_tps)] if dynamic_tps else [])
    vase = (CurvePoint(8192, 0.005, 3200.0, vase_kv[0]), CurvePoint(16384, 0.005, 3200.0, vase_kv[1]))
    rows.append((Record(*E2E, "vase-2048", shape, compare_to=("hf-static", "hf-dynamic"), details=sized, curve=vase),
                 [0.005, 0.005]))  # fmt: skip
    targets = _targets(report.render(report.load_runs([write_synthetic(tmp_path / "e2e.json", rows)]), None, 0.05, []))
    line = targets[-1]
    assert line[1] == "Qwen3-8B B16 P256 (run #1)" and line[3] == status
    # 10 GB of the static cache's step against 2.5 GB of ours (2 GB of weights + 0.5 GiB).
    assert line[2].startswith(f"vs hf-static {3200.0 / static_tps:.2f}x (bytes allow {10e9 / (2e9 + vase_kv[1]):.2f}x)")
    if dynamic_tps is None:
        assert "vs hf-dynamic absent" in line[2]
    assert line[2].endswith("at all 2 lengths" if vase_kv[0] == vase_kv[1] else "varies with length")


def test_a_cpu_report_has_no_gpu_targets():
    assert "## Targets (GPU)" not in report.render(report.load_runs([RECORDED]), None, 0.05, [])


def test_comparison_flags_a_slowed_row_and_passes_an_unchanged_one(tmp_path, capsys):
    old = write_synthetic(tmp_path / "old.json", synthetic_rows())
    same = write_synthetic(tmp_path / "same.json", synthetic_rows())
    slower = write_synthetic(tmp_path / "slower.json", synthetic_rows(decode_slowdown=1.10))
    within = write_synthetic(tmp_path / "within.json", synthetic_rows(decode_slowdown=1.04))

    assert report.main([str(same), "--out", str(tmp_path / "a"), "--compare", str(old)]) == 0
    assert report.main([str(within), "--out", str(tmp_path / "b"), "--compare", str(old)]) == 0
    assert report.main([str(slower), "--out", str(tmp_path / "c"), "--compare", str(old)]) == 1
    assert ("regression: NVIDIA H200 / decode / decode attention (one step) / vase / Qwen3-8B B16 C4160: +10.0 % "
            "on the median") in capsys.readouterr().err
    assert report.main([str(slower), "--out", str(tmp_path / "d"), "--compare", str(old), "--threshold", "15"]) == 0

    changes = report.compare(report.load_runs([slower]), report.load_runs([old]), 0.05)
    verdicts = {change.key[1:4]: change.verdict for change in changes}
    assert verdicts[DECODE + ("vase",)] == "REGRESSION"
    assert verdicts[PREFILL + ("vase",)] == "unchanged"
    assert "1 regression(s)." in (tmp_path / "c" / "report.md").read_text()


def test_rows_of_another_device_are_not_compared_and_a_comparison_of_nothing_is_an_error(tmp_path, capsys):
    old = write_synthetic(tmp_path / "old.json", synthetic_rows(), device="NVIDIA H100 80GB HBM3")
    slower = write_synthetic(tmp_path / "slower.json", synthetic_rows(decode_slowdown=2.0))
    verdicts = {change.verdict for change in report.compare(report.load_runs([slower]), report.load_runs([old]), 0.05)}
    assert verdicts == {"new", "not in this run"}
    with pytest.raises(SystemExit) as exit_info:
        report.main([str(slower), "--out", str(tmp_path / "r"), "--compare", str(old)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "python -m benchmarks.report: error: argument --compare: no timed row matches one of this run by device, "
        "suite, kernel, provider and shape, with a generated length in common for end-to-end rows "
        "(this run: NVIDIA H200); nothing was compared\n"
    )


def _edited(tmp_path: Path, edit) -> Path:
    data = json.loads(write_synthetic(tmp_path / "good.json", synthetic_rows()).read_text())
    edit(data)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    return path


def _end_to_end(data: dict) -> dict:
    """The `extra_info` of the first end-to-end row of a pytest-benchmark JSON."""
    return next(bench["extra_info"] for bench in data["benchmarks"] if bench["extra_info"]["suite"] == "end-to-end")


def _drop(mapping: dict, key: str) -> None:
    del mapping[key]


@pytest.mark.parametrize(
    "edit, problem",
    [(lambda d: _drop(d["machine_info"]["vase_bench"], "device"), "machine_info.vase_bench.device: missing"),
     (lambda d: d["machine_info"].update(vase_bench="x"), "expected a pytest-benchmark JSON"),
     (lambda d: d["machine_info"]["vase_bench"].update(versions=None),
      "machine_info.vase_bench.versions: expected an object; got None"),
     (lambda d: d["machine_info"]["vase_bench"].update(device=7), "machine_info.vase_bench.device: expected a string"),
     (lambda d: d.update(benchmarks=[1]), "malformed record (AttributeError"),
     (lambda d: _drop(d["benchmarks"][0]["stats"], "median"), "malformed record (KeyError: no field 'median')"),
     (lambda d: d["benchmarks"][0]["stats"].update(median="0.001"), "stats.median: expected a number; got '0.001'"),
     (lambda d: d["benchmarks"][0]["stats"].update(median=True), "stats.median: expected a number; got True"),
     (lambda d: d["benchmarks"][0]["stats"].update(data=[1e-3, "x"]), "stats.data: expected a list of numbers"),
     (lambda d: d["benchmarks"][0]["extra_info"].update(flops="5"), "flops: expected a positive number or None; got '5'"),
     (lambda d: d["benchmarks"][0]["extra_info"].update(flops=-5), "flops: expected a positive number or None; got -5"),
     (lambda d: d["benchmarks"][0]["extra_info"].update(shape=5), "shape: expected a non-empty string; got 5"),
     (lambda d: d["benchmarks"][0]["extra_info"].update(provider=None),
      "provider: expected a non-empty string; got None"),
     (lambda d: d["benchmarks"][0]["extra_info"].update(compare_to="sdpa"),
      "compare_to: expected a list or null; got 'sdpa'"),
     (lambda d: d["benchmarks"].append(copy.deepcopy(d["benchmarks"][0])),
      "the row prefill / prefill attention (causal) / vase / Qwen3-8B B1 T8192 appears twice"),
     (lambda d: d["benchmarks"][0]["extra_info"].update(curve=[{"x": 1}]), "malformed record (TypeError"),
     (lambda d: d["machine_info"]["vase_bench"]["roofline"].update(copy_gbs=0),
      "roofline.copy_gbs must be a positive number; got 0"),
     (lambda d: d["machine_info"]["vase_bench"]["roofline"].update(copy_gbs=True),
      "roofline.copy_gbs must be a positive number; got True"),
     (lambda d: _end_to_end(d)["curve"][0].update(step_s=0), "curve.step_s: expected a finite number > 0; got 0"),
     (lambda d: _end_to_end(d)["curve"][0].update(tokens_per_s=0.0),
      "curve.tokens_per_s: expected a finite number > 0; got 0.0"),
     (lambda d: _end_to_end(d)["details"].update(weight_bytes="2e9"),
      "details.weight_bytes: expected a positive count or null; got '2e9'"),
     (lambda d: _end_to_end(d)["details"].update(batch=0), "details.batch: expected a positive count or null; got 0"),
     (lambda d: _end_to_end(d)["details"].update(timing=5), "details.timing: expected a string or null; got 5"),
     (lambda d: _end_to_end(d).update(details="x"), "details: expected an object; got 'x'"),
     (lambda d: _end_to_end(d)["details"].update(generated="4096"),
      "details.generated: expected a count >= 0 or null; got '4096'"),
     (lambda d: _end_to_end(d)["details"].update(tokens_per_s="9"),
      "details.tokens_per_s: expected a positive number or null; got '9'"),
     (lambda d: _end_to_end(d)["details"].update(sampled="yes"), "details.sampled: expected true, false or null"),
     (lambda d: _end_to_end(d)["details"].update(estimated_from=[64, "x"]),
      "details.estimated_from: expected a list of token counts or null"),
     (lambda d: d["machine_info"]["vase_bench"]["versions"].update(torch=5),
      "machine_info.vase_bench.versions.torch: expected a string or null; got 5")],
    ids=["no-device", "record-not-a-dict", "versions-null", "device-a-number", "row-not-a-dict", "no-median",
         "median-a-string", "median-a-boolean", "a-sample-a-string", "flops-a-string", "negative-flops",
         "shape-a-number", "no-provider", "compare-to-a-string", "a-row-twice", "curve-point-fields",
         "zero-bandwidth", "boolean-bandwidth", "zero-step", "zero-tokens-per-s", "weights-a-string", "zero-batch",
         "timing-a-number", "details-a-list", "generated-a-string", "tokens-per-s-a-string", "sampled-a-string",
         "estimated-from-a-string", "version-a-number"],
)  # fmt: skip
def test_a_hand_edited_record_is_a_one_line_error_naming_the_file(tmp_path, capsys, edit, problem):
    path = _edited(tmp_path, edit)
    with pytest.raises(SystemExit) as exit_info:
        report.main([str(path), "--out", str(tmp_path / "r")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"python -m benchmarks.report: error: argument results: {path}: ") and problem in error
    assert error.count("\n") == 1


def test_an_end_to_end_run_without_a_copy_bandwidth_has_no_roofline_shares(tmp_path):
    def edit(data):
        del data["machine_info"]["vase_bench"]["roofline"]["copy_gbs"]
        for bench in data["benchmarks"]:
            if bench["extra_info"]["suite"] == "end-to-end":
                bench["extra_info"]["details"].update(batch=16, weight_bytes=2 * 10**9)

    assert report.main([str(_edited(tmp_path, edit)), "--out", str(tmp_path / "r")]) == 0
    text = (tmp_path / "r" / "report.md").read_text()
    # The bytes a step reads are known, the bandwidth they would take is not.
    assert "Speed-up the bytes allow" in text and "Bandwidth roofline" not in text


@pytest.mark.parametrize(
    "argv, message",
    [(["{good}", "{good}"], "argument results: {good}: given twice"),
     (["{empty}"], "argument results: no benchmark in {empty}"),
     (["{good}", "--compare", "{good}", "--threshold", "-5"], "argument --threshold: expected a finite percentage"),
     (["{good}", "--compare", "{good}", "--threshold", "nan"], "argument --threshold: expected a finite percentage"),
     (["{good}", "--compare", "{good}", "--threshold", "abc"], "percentage >= 0; got abc"),
     (["{good}", "--threshold", "7"], "argument --threshold: only means something with --compare"),
     (["{good}", "--out="], "argument --out: expected a directory path; got an empty string")],
    ids=["twice", "no-rows", "negative-threshold", "nan-threshold", "text-threshold", "threshold-alone", "empty-out"],
)  # fmt: skip
def test_arguments_that_would_mislead_are_refused(tmp_path, capsys, argv, message):
    names = dict(good=str(write_synthetic(tmp_path / "good.json", synthetic_rows())),
                 empty=str(_edited(tmp_path, lambda d: d.update(benchmarks=[]))))
    argv = [arg.format(**names) for arg in argv]
    if not any(arg.startswith("--out") for arg in argv):
        argv += ["--out", str(tmp_path / "r")]
    with pytest.raises(SystemExit) as exit_info:
        report.main(argv)
    assert exit_info.value.code == 2
    assert message.format(**names) in capsys.readouterr().err


def test_an_output_directory_that_cannot_be_written_is_a_one_line_error(tmp_path, capsys):
    out = tmp_path / "r"
    (out / "report.md").mkdir(parents=True)
    with pytest.raises(SystemExit) as exit_info:
        report.main([str(write_synthetic(tmp_path / "good.json", synthetic_rows())), "--out", str(out)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        f"python -m benchmarks.report: error: argument --out: {out / 'report.md'}: Is a directory\n"
    )


def test_quantile_interpolates_linearly():
    assert report.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.2) == pytest.approx(1.8)
    assert report.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.8) == pytest.approx(4.2)
    assert report.quantile([7.0], 0.8) == 7.0


def test_paper_rows_say_when_they_are_estimated(tmp_path):
    kernel = ("paper-throughput", "paper protocol: greedy, decode time only")
    shape = "Qwen3-14B B16 P256"
    sampled = {"generated": 16384, "estimated_from": [64, 8192, 16384]}
    full = "hf-dynamic-no-cudnn"  # the row the VaSE row compares with is its full cache, whatever its name
    rows = [
        (Record(*kernel, "hf-dynamic", shape, details={**sampled, "tokens_per_s": 60.0}), [0.2, 0.2, 0.2]),
        (Record(*kernel, full, shape, details={**sampled, "tokens_per_s": 120.0, "paper_tokens_per_s": 132.9}),
         [0.1, 0.1, 0.1]),
        (Record(*kernel, "vase-4096", shape, compare_to=(full,),
                details={**sampled, "tokens_per_s": 300.0, "paper_tokens_per_s": 333.4, "paper_peak_gib": 39.6,
                         "peak_bytes": int(39.6 * 2**30)}), [0.05, 0.05, 0.05]),
    ]  # fmt: skip
    text = report.render(report.load_runs([write_synthetic(tmp_path / "paper.json", rows)]), None, 0.05, [])
    line = next(line for line in text.splitlines() if "| vase-4096 |" in line)
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[1] == f"{shape} · 16,384 new tokens (estimated from step times at 64, 8,192, 16,384 tokens)"
    assert cells[3] == "300.0" and cells[6] == "2.50x" and cells[9] == "2.51x"
    # The paper's memory is in GiB, as the authors' script divides by 1024³: the same unit as ours.
    header = next(line for line in text.splitlines() if "| paper tok/s |" in line)
    assert [cell.strip() for cell in header.strip("|").split("|")][4::4] == ["peak memory", "paper GiB"]
    assert cells[4] == "39.60 GiB" and cells[8] == "39.6"
    full_line = next(line for line in text.splitlines() if f"| {full} |" in line)
    assert [cell.strip() for cell in full_line.strip("|").split("|")][6] == "—"


@pytest.mark.parametrize(
    "content, problem",
    [(None, "cannot read it (No such file or directory)"), ("directory", "cannot read it (Is a directory)"),
     ("{not json", "not JSON"), ("[1, 2]", "expected a pytest-benchmark JSON"),
     ('{"benchmarks": []}', "expected a pytest-benchmark JSON"), ("no extra_info", "has no vase_triton record")],
    ids=["missing", "directory", "not-json", "a-list", "not-the-suites", "a-row-without-its-record"],
)  # fmt: skip
@pytest.mark.parametrize("argument", ["results", "--compare"])
def test_an_unusable_input_is_a_one_line_error_naming_its_argument(tmp_path, capsys, content, problem, argument):
    path = tmp_path / "input.json"
    if content == "directory":
        path.mkdir()
    elif content == "no extra_info":
        data = json.loads(RECORDED.read_text())
        data["benchmarks"][3]["extra_info"] = {}
        path.write_text(json.dumps(data))
    elif content is not None:
        path.write_text(content)
    good = str(write_synthetic(tmp_path / "good.json", synthetic_rows()))
    argv = [str(path), "--out", str(tmp_path / "r")] if argument == "results" else [
        good, "--out", str(tmp_path / "r"), "--compare", str(path)]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        report.main(argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    assert error.startswith(f"python -m benchmarks.report: error: argument {argument}: {path}: ") and problem in error


def test_an_output_path_that_is_a_file_is_a_one_line_error(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        report.main([str(write_synthetic(tmp_path / "new.json", synthetic_rows())), "--out", str(taken)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"python -m benchmarks.report: error: argument --out: {taken}: File exists\n"


def _with_median(path: Path, provider: str, median: float) -> Path:
    """`path` with the median of its prefill `provider` row set to `median`."""
    data = json.loads(path.read_text())
    for bench in data["benchmarks"]:
        if bench["extra_info"]["suite"] == "prefill" and bench["extra_info"]["provider"] == provider:
            bench["stats"]["median"] = median
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("median", [0.0, float("nan")], ids=["zero", "nan"])
def test_a_zero_or_nan_median_is_absent_not_a_crash_or_nan(tmp_path, median):
    path = _with_median(write_synthetic(tmp_path / "new.json", synthetic_rows()), "vase", median)
    rows = report.load_runs([path])
    text = report.render(rows, None, 0.05, [])
    line = next(line for line in text.splitlines() if "| Qwen3-8B B1 T8192 | vase |" in line)
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[3:7] == ["absent"] * 4  # median, IQR, p20–p80, samples
    assert "nan" not in text.lower()
    scores = next(line for line in text.splitlines() if "| Qwen3-8B B1 T8192 | vase+scores |" in line)
    assert scores.rstrip("| ").endswith("absent")  # its speed-up over `vase`
    old = write_synthetic(tmp_path / "old.json", synthetic_rows())
    for new_rows, old_rows, verdict in ((rows, report.load_runs([old]), "untimed now"),
                                        (report.load_runs([old]), rows, "new")):  # fmt: skip
        verdicts = {c.key[1:4]: c.verdict for c in report.compare(new_rows, old_rows, 0.05)}
        assert verdicts[PREFILL + ("vase",)] == verdict
    assert report.main([str(path), "--out", str(tmp_path / "r"), "--compare", str(old)]) == 0


def test_plots_of_a_gpu_run_beside_a_cpu_run(tmp_path):
    """The CPU run records no peak memory: its curves are left out of the peak-memory plot, not a crash."""
    shape = "Qwen3-8B B16 P256"
    gpu = [(Record(*E2E, "hf-static", shape, curve=(CurvePoint(1024, 0.01, 1600.0, 2**30, 2**32),)), [0.01])]
    cpu = [(Record(*E2E, "hf-static", "tiny-qwen3 B2 P16", curve=(CurvePoint(1024, 0.1, 20.0, 2**20),)), [0.1])]
    paths = [write_synthetic(tmp_path / "gpu.json", gpu), write_synthetic(tmp_path / "cpu.json", cpu, device="CPU (x)")]
    assert report.main([str(path) for path in paths] + ["--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "memory.png").stat().st_size > 0
    assert (tmp_path / "r" / "decode_step_latency.png").stat().st_size > 0


def test_cpu_rows_are_not_read_against_the_gpu_targets(tmp_path):
    paths = [write_synthetic(tmp_path / "gpu.json", synthetic_rows()),
             write_synthetic(tmp_path / "cpu.json", synthetic_rows(), device="CPU (Intel(R) Xeon(R) Processor)")]  # fmt: skip
    targets = _targets(report.render(report.load_runs(paths), None, 0.05, []))
    assert all("(run #2)" not in row[1] for row in targets)
    assert [row[1] for row in targets if row[0] == report.EVICTION_TARGET] == ["Qwen3-8B B16 C4160, recompute (run #1)"]


def test_per_step_percentages_are_under_the_row_they_are_of(tmp_path):
    """An `emitted` eviction is a percentage of the scores-emitting decode step: 0.128 ms / 64 / 0.16 ms = 1.25 %."""
    emitting = DECODE + ("vase+scores", "Qwen3-8B B16 C4160")
    rows = synthetic_rows() + [
        (Record(*emitting, bytes_moved=2.8e8, roofline=COPY, details={"timing": GRAPHED}), _spread(1.6e-4)),
        (Record("eviction", "eviction vase (emitted)", "vase", "Qwen3-8B B16 C4160", bytes_moved=1e8, roofline=COPY,
                per_step=64, relative_to=emitting, details={"timing": GRAPHED}), _spread(1.28e-4)),
    ]  # fmt: skip
    section = report.render(report.load_runs([write_synthetic(tmp_path / "new.json", rows)]), None, 0.05, [])
    section = section.split("## eviction")[1].split("## ")[0]
    header = next(line for line in section.splitlines() if line.startswith("| run |"))
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    assert columns[-2:] == ["% of decode (vase)", "% of decode (vase+scores)"]
    for kernel, cells in (("eviction vase", ["2.00 %", "—"]), ("eviction vase (emitted)", ["—", "1.25 %"])):
        line = next(line for line in section.splitlines() if f"| {kernel} | Qwen3-8B B16 C4160 | vase |" in line)
        assert [cell.strip() for cell in line.strip("|").split("|")][-2:] == cells


@pytest.mark.parametrize(
    "gbs, shown", [(3412.6, "3,413"), (100.0, "100"), (99.94, "99.9"), (1.44, "1.4"), (0.0123, "0.0123"), (None, report.ABSENT)]
)
def test_bandwidths_under_100_gbs_keep_a_decimal(gbs, shown):
    assert report.format_gbs(gbs) == shown


def _edit_run(path: Path, edit) -> Path:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path


def test_a_nan_iqr_or_sample_and_a_missing_peak_are_absent_not_nan(tmp_path):
    """pytest-benchmark's IQR counts only where the samples are not recorded."""
    def edit(data):
        data["benchmarks"][0]["stats"].update(iqr=float("nan"), data=[])
        data["benchmarks"][1]["stats"]["data"][2] = float("nan")
        data["benchmarks"][2]["stats"]["iqr"] = float("nan")
        del data["machine_info"]["vase_bench"]["roofline"]["copy_gbs"]

    rows = report.load_runs([_edit_run(write_synthetic(tmp_path / "r.json", synthetic_rows()), edit)])
    text = report.render(rows, None, 0.05, [])
    assert "nan" not in text.lower()
    first, second, third = (by_key(rows)[PREFILL + (provider, "Qwen3-8B B1 T8192")]
                            for provider in ("vase", "vase+scores", "sdpa"))  # fmt: skip
    assert first.iqr_s is None and first.p20_s is None
    assert second.iqr_s is None and second.p20_s is None and second.p80_s is None
    assert third.iqr_s == pytest.approx(0.04 * 1.1e-3) and third.p20_s is not None
    decode = by_key(rows)[DECODE + ("vase", "Qwen3-8B B16 C4160")]
    assert decode.roofline_percent is None and decode.gbs == pytest.approx(2.8e8 / 1e-4 / 1e9)
    assert first.roofline_percent == pytest.approx(100 * 4e11 / 1e-3 / 1e12 / 800.0)  # the matmul peak is still there
    target = next(row for row in _targets(text) if row[0].startswith("decode"))
    assert target[2] == "no roofline (100.0 µs)" and target[3] == "not measured"


def test_an_untimed_decode_row_is_absent_in_the_targets(tmp_path):
    rows = report.load_runs([_edit_run(write_synthetic(tmp_path / "r.json", synthetic_rows()),
                                       lambda data: data["benchmarks"][3].update(stats=None))])  # fmt: skip
    target = next(row for row in _targets(report.render(rows, None, 0.05, [])) if row[0].startswith("decode"))
    assert target[2:] == ["absent", "not measured"]


def test_a_row_in_two_files_of_one_side_of_a_comparison_is_an_error(tmp_path, capsys):
    """Which of the two to compare would be a guess (it hid a regression when the last one won)."""
    old = write_synthetic(tmp_path / "old.json", synthetic_rows())
    slower = write_synthetic(tmp_path / "slower.json", synthetic_rows(decode_slowdown=1.10))
    same = write_synthetic(tmp_path / "same.json", synthetic_rows())
    for argv, side in (([slower, same, "--compare", old], "results"), ([same, "--compare", old, slower], "--compare")):
        with pytest.raises(SystemExit) as exit_info:
            report.main([*map(str, argv), "--out", str(tmp_path / "r")])
        assert exit_info.value.code == 2
        error = capsys.readouterr().err
        assert error.startswith(f"python -m benchmarks.report: error: argument {side}: the row NVIDIA H200 / ")
        assert "compare one run of it at a time" in error and error.count("\n") == 1


def test_an_end_to_end_regression_names_its_measure_and_small_rates_are_not_rounded_to_zero(tmp_path, capsys):
    def end_to_end(step_s, tokens_per_s, details):
        return [(Record(*E2E, "vase-2048", "Qwen3-8B (2 layers) B16 P256", details=details,
                        curve=(CurvePoint(1024, step_s, tokens_per_s, 2**29),)), [step_s])]  # fmt: skip

    old = write_synthetic(tmp_path / "old.json", end_to_end(1.0, 16.0, {"generated": 1024}))
    slow = write_synthetic(tmp_path / "slow.json", end_to_end(53.3, 0.3, {"tokens_per_s": 0.04}))
    assert report.main([str(slow), "--out", str(tmp_path / "r"), "--compare", str(old)]) == 1
    assert "+5230.0 % on the step latencies summed over common lengths" in capsys.readouterr().err
    text = (tmp_path / "r" / "report.md").read_text()
    assert "53.30 s · 0.3 tok/s" in text
    assert "tokens generated: absent, 0.04 tok/s over the whole decode" in text


def test_a_file_compared_with_itself_is_an_error(tmp_path, capsys):
    old = write_synthetic(tmp_path / "old.json", synthetic_rows())
    with pytest.raises(SystemExit) as exit_info:
        report.main([str(old), "--out", str(tmp_path / "r"), "--compare", str(tmp_path / "." / "old.json")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "argument --compare: " in error and "also given as a result" in error and error.count("\n") == 1


def test_several_runs_of_a_baseline_name_the_one_a_row_is_compared_with(tmp_path):
    """The eviction rows' share of a decode step, with the decode rows in two other runs: the
    first one given is taken, and the cell says so (the order of the files decides it)."""
    def of_suite(suite, slowdown=1.0):
        return [(record, samples) for record, samples in synthetic_rows(slowdown) if record.suite == suite]

    files = [write_synthetic(tmp_path / "eviction.json", of_suite("eviction")),
             write_synthetic(tmp_path / "decode.json", of_suite("decode")),
             write_synthetic(tmp_path / "slow.json", of_suite("decode", 2.0))]
    loaded = report.load_runs(files)
    index = report.RowIndex(loaded)
    eviction = next(row for row in loaded if row.record.key[2] == "vase" and row.record.suite == "eviction")
    chosen = report.relative_row(index, eviction)
    assert chosen.run.id == "#2" and report.relative_percent(index, eviction) == pytest.approx(2.0)
    assert report.other_run_note(index, eviction, chosen) == " (against run #2)"
    assert report.main([*map(str, files), "--out", str(tmp_path / "r")]) == 0
    assert "2.00 % (against run #2)" in (tmp_path / "r" / "report.md").read_text()
    alone = report.RowIndex(report.load_runs(files[:2]))
    assert report.other_run_note(alone, eviction, report.relative_row(alone, eviction)) == ""


def test_a_median_exactly_at_the_threshold_is_not_a_regression(tmp_path):
    def scaled(factor):
        return report.load_runs([write_synthetic(tmp_path / f"{factor}.json", synthetic_rows(decode_slowdown=factor))])

    verdicts = {factor: {c.key[1:4]: c.verdict for c in report.compare(scaled(factor), scaled(1.0), 0.05)}
                for factor in (1.05, 1.0501, 0.95, 0.9499)}  # fmt: skip
    assert [verdicts[f][DECODE + ("vase",)] for f in (1.05, 1.0501, 0.95, 0.9499)] == [
        "unchanged", "REGRESSION", "unchanged", "faster"]


def test_a_bar_in_a_name_does_not_split_its_cell_and_the_report_is_utf8_in_any_locale(tmp_path):
    rows = [(Record(*PREFILL, "vase", "Qwen3 | B1 ⚡", flops=4e11, roofline=MATMUL), _spread(1e-3))]
    path = write_synthetic(tmp_path / "r.json", rows)
    ascii_locale = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
                    "PYTHONPATH": str(Path(report.__file__).parents[1])}  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "benchmarks.report", str(path), "--out", str(tmp_path / "out")],
                            env=ascii_locale, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "out" / "report.md").read_text(encoding="utf-8").splitlines()
    row = next(index for index, line in enumerate(lines) if "B1 ⚡" in line)
    header = next(index for index in range(row, 0, -1) if lines[index].startswith("|-")) - 1
    assert "Qwen3 \\| B1 ⚡" in lines[row]
    assert lines[row].replace("\\|", "").count("|") == lines[header].count("|")


def test_a_run_with_the_reference_backend_says_so_under_runs(tmp_path):
    data = json.loads(RECORDED.read_text())
    data["machine_info"]["vase_bench"]["backend"] = "torch"
    path = tmp_path / "torch_backend.json"
    path.write_text(json.dumps(data))
    assert report.main([str(path), str(RECORDED), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert text.count("ran with VASE_BACKEND=") == 1 and "ran with VASE_BACKEND=torch: its vase rows" in text
    data["machine_info"]["vase_bench"]["backend"] = 3
    path.write_text(json.dumps(data))
    with pytest.raises(SystemExit) as refused:
        report.main([str(path), "--out", str(tmp_path / "bad")])
    assert refused.value.code == 2


def test_an_end_to_end_row_is_compared_at_the_lengths_both_runs_reached(tmp_path, capsys):
    """A run 20 % slower per step that stopped at half the length (a time limit) is a regression, though its
    median over steps is lower; with no length in common the row is not comparable, and not a pass or a fail."""
    recorded = Path(__file__).parents[1] / "benchmarks" / "results" / "cpu-2026-12-03" / "end_to_end.json"
    data = json.loads(recorded.read_text())
    for bench in data["benchmarks"]:
        info = bench["extra_info"]
        kept = info["curve"][: len(info["curve"]) // 2]
        info["curve"] = [{**point, "step_s": point["step_s"] * 1.2} for point in kept]
        bench["stats"]["data"] = [t * 1.2 for t in bench["stats"]["data"][: len(bench["stats"]["data"]) // 2]]
        bench["stats"]["median"] = statistics.median(bench["stats"]["data"])
    short = tmp_path / "short.json"
    short.write_text(json.dumps(data))
    changes = report.compare(report.load_runs([short]), report.load_runs([recorded]), 0.05)
    assert {change.verdict for change in changes} == {"REGRESSION"}
    assert all(abs(change.change - 0.2) < 1e-9 for change in changes)
    assert report.main([str(short), "--out", str(tmp_path / "out"), "--compare", str(recorded)]) == 1
    for bench in data["benchmarks"]:
        bench["extra_info"]["curve"] = [{**point, "generated": point["generated"] + 1}
                                        for point in bench["extra_info"]["curve"]]  # fmt: skip
    short.write_text(json.dumps(data))
    changes = report.compare(report.load_runs([short]), report.load_runs([recorded]), 0.05)
    assert {change.verdict for change in changes} == {"not comparable (no generated length in common)"}
    assert all(change.change is None for change in changes)
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:  # rows that match but compare nothing are no pass
        report.main([str(short), "--out", str(tmp_path / "out"), "--compare", str(recorded)])
    assert refused.value.code == 2 and "nothing was compared" in capsys.readouterr().err


def test_one_sample_has_no_interquartile_range(tmp_path):
    rows = [(Record(*PREFILL, "vase", "Qwen3-8B B1 T8192", flops=4e11, roofline=MATMUL), [1e-3])]
    (row,) = report.load_runs([write_synthetic(tmp_path / "one.json", rows)])
    assert row.median_s == 1e-3 and row.iqr_s is None and row.p20_s == row.p80_s == 1e-3 and row.rounds == 1


def test_a_file_without_benchmarks_beside_others_is_noted_not_dropped(tmp_path, capsys):
    good = write_synthetic(tmp_path / "good.json", synthetic_rows())
    empty = _edited(tmp_path, lambda data: data.update(benchmarks=[]))
    assert report.main([str(good), str(empty), "--out", str(tmp_path / "r")]) == 0
    note = "edited.json (results) holds no benchmark: it adds no row"
    assert f"note: {note}" in capsys.readouterr().err
    assert f"Note: {note}." in (tmp_path / "r" / "report.md").read_text()


def test_files_of_one_name_are_told_apart_by_their_folders(tmp_path):
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
    paths = [write_synthetic(tmp_path / run / "attention.json", synthetic_rows()) for run in ("a", "b")]
    assert report.source_labels(paths) == ["a/attention.json", "b/attention.json"]
    assert report.source_labels([paths[0], tmp_path / "other.json"]) == ["attention.json", "other.json"]
    with pytest.raises(ValueError, match="is in both a/attention.json and b/attention.json"):
        report.compare(report.load_runs([paths[0]]), report.load_runs(paths), 0.05)


def test_machine_fields_not_recorded_are_absent(tmp_path):
    def edit(data):
        del data["datetime"]
        data["machine_info"]["vase_bench"]["versions"].pop("cuda", None)

    text = report.render(report.load_runs([_edited(tmp_path, edit)]), None, 0.05, [])
    run_line = next(line for line in text.splitlines() if line.startswith("| #1 |"))
    cells = [cell.strip() for cell in run_line.strip("|").split("|")]
    assert cells[6] == "absent" and cells[8] == "absent"  # CUDA, date


def test_plot_ticks_of_nearby_lengths_are_one_tick():
    assert report._spaced_ticks([256, 1019, 1024, 2048, 4096]) == [256, 1024, 2048, 4096]
    assert report._spaced_ticks([1000, 1100, 1190, 4096]) == [1190, 4096]
