"""`benchmarks/gpu_check.sh` on a CPU machine: its step selection, its refusals, and the
`paper` step's dry run (the `smoke` profile) through to the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"


def _run(out: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), str(out)],
        env={**os.environ, "PYTHON": sys.executable, "VASE_BENCH_PROFILE": "smoke", "VASE_BENCH_COMMIT": "0" * 40, **env},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.parametrize(
    "env, message",
    [
        ({"VASE_GPU_CHECK_STEPS": "attention bogus"}, "VASE_GPU_CHECK_STEPS: expected names among tests autotune"),
        ({"VASE_GPU_CHECK_STEPS": "end_to_end paper"}, "end_to_end and paper each take the time left"),
        ({"VASE_GPU_CHECK_SECONDS": "59"}, "VASE_GPU_CHECK_SECONDS: expected a whole number of seconds >= 60; got '59'"),
        ({"VASE_GPU_CHECK_SECONDS": "1e3"}, "got '1e3'"),
    ],
)
def test_bad_settings_are_refused_before_anything_runs(tmp_path: Path, env: dict, message: str) -> None:
    result = _run(tmp_path / "out", **env)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_the_prompt_and_paper_steps_write_their_rows_and_the_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = _run(out, VASE_GPU_CHECK_STEPS="prompt paper", VASE_GPU_CHECK_SECONDS="300")
    assert result.returncode == 0, result.stdout + result.stderr
    steps = (out / "steps.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in steps] == ["== prompt", "== paper", "== report"], steps
    assert "commit: " + "0" * 40 in (out / "environment.txt").read_text()
    assert {"prompt.json", "paper.json", "paper.log", "report.md", "results.csv"} <= {path.name for path in out.iterdir()}
    assert not any((out / f"{name}.json").exists() for name in ("attention", "eviction", "end_to_end"))
    methods = [row["param"] for row in json.loads((out / "paper.json").read_text())["benchmarks"]]
    assert len(methods) == 3 and "hf-dynamic-no-cudnn" in methods and any("dkv" in name for name in methods)
    prompt_rows = [row["extra_info"]["provider"] for row in json.loads((out / "prompt.json").read_text())["benchmarks"]]
    assert sorted(prompt_rows) == ["hf-dynamic", "vase-32"], prompt_rows
    report = (out / "report.md").read_text()
    assert "## the paper's throughput protocol" in report and "## prompt" in report
    for method in methods + prompt_rows:
        assert f"| {method} |" in report, method


def test_the_profile_step_alone_profiles_vase_and_the_default_full_cache_first_and_needs_no_report(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    result = _run(out, VASE_GPU_CHECK_STEPS="profile")
    assert result.returncode == 0, result.stdout + result.stderr
    steps = (out / "steps.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in steps] == ["== profile", "== report"], steps
    assert steps[-1] == "== report: no benchmark step was named" and not (out / "report.md").exists()
    rows = [line.split("|")[1].strip() for line in (out / "profile.md").read_text().splitlines()
            if line.startswith("| ") and " ms |" in line]  # fmt: skip
    assert rows == ["vase-32", "hf-dynamic", "hf-dynamic-no-cudnn", "hf-static"], rows
