"""`benchmarks/compile_audit.py --capability`: the target each value audits and what its launchers
choose there, recorded without compiling (no ptxas needed). Importing the audit pops
`TRITON_INTERPRET`, so it runs in a process of its own."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Per capability: its target, and the launches recorded on its profile (D = 128 bf16 prefill
# of 8192 tokens, forward then scores; batch-1 decode over 4160 slots).
_PROBE = """
import json
import torch
from benchmarks import compile_audit as audit

found = {}
for capability in (80, 86, 89, 90):
    target = audit.parse_target([] if capability == 90 else ["--capability", str(capability)])
    with audit.launched_on(target.profile):
        prefill = audit.prefill_launches(torch.bfloat16, 128, ragged=False)
        splits = audit._production_splits(1, 128, torch.bfloat16)
    found[capability] = dict(
        arch=target.arch, capability=target.capability, shared=target.profile.shared_memory,
        prefill_stages=[launch.kwargs["num_stages"] for launch in prefill], decode_splits=splits,
    )
print(json.dumps(found))
"""


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *argv], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def targets() -> dict:
    result = _run("-c", _PROBE)
    assert result.returncode == 0, result.stderr
    return {int(capability): found for capability, found in json.loads(result.stdout).items()}


# `main` with each launch's compilation replaced by a row of the shared bytes given first: which
# capabilities it compiled for, its exit code and what it printed.
_MAIN = """
import contextlib, io, json, sys
from unittest import mock
from benchmarks import compile_audit as audit

shared, argv = int(sys.argv[1]), sys.argv[2:]
compiled_for = set()

def compile_as(launch, case, capability):
    compiled_for.add(capability)
    return audit.Audit(launch.kernel.__name__, case, "", 4, 1, shared, 32, 0, 0)

out = io.StringIO()
with mock.patch.object(audit, "audit", compile_as), \\
        mock.patch.object(audit, "nvidia_backend_available", lambda capability: True), \\
        contextlib.redirect_stdout(out):
    code = audit.main(argv)
lines = out.getvalue().strip().splitlines()
print(json.dumps(dict(code=code, compiled_for=sorted(compiled_for), header=lines[0], last=lines[-1])))
"""


@pytest.mark.parametrize(
    "argv, shared, code, header, last",
    [([], 227 * 1024, 0, "compiled for sm_90a", "all 165 launches fit: shared <= 232448 B"),
     ([], 227 * 1024 + 1, 1, "compiled for sm_90a", "exceed the H100/H200 (sm_90a) limits"),
     (["--capability", "80"], 163 * 1024 + 1, 1, "compiled for sm_80", "exceed the A100 (sm_80) limits"),
     (["--capability", "86"], 99 * 1024, 0, "compiled for sm_86", "all 165 launches fit: shared <= 101376 B"),
     (["--capability", "86"], 99 * 1024 + 1, 1, "compiled for sm_86", "exceed the RTX 3090 (sm_86) limits"),
     (["--capability", "89"], 99 * 1024 + 1, 1, "compiled for sm_89", "exceed the RTX 4090 (sm_89) limits")],
)  # fmt: skip
def test_each_capability_compiles_for_its_architecture_within_its_shared_memory(argv, shared, code, header, last):
    result = _run("-c", _MAIN, str(shared), *argv)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
    capability = int(argv[1]) if argv else 90
    assert found["code"] == code and found["compiled_for"] == [capability]
    assert found["header"].endswith(header) and last in found["last"]


def test_launchers_fit_prefill_stages_and_split_decode_by_the_targets_profile(targets):
    # The forward's 3-stage estimate (128 KiB) exceeds 99 KiB: sm_86 and sm_89 take 2 stages.
    assert {capability: found["prefill_stages"] for capability, found in targets.items()} == {
        80: [3, 3], 86: [2, 3], 89: [2, 3], 90: [3, 3],
    }
    # About four programs per SM over 8 rows (108, 82, 128 and 132 SMs), at most the 65 key blocks.
    assert {capability: found["decode_splits"] for capability, found in targets.items()} == {
        80: 54, 86: 41, 89: 64, 90: 65,
    }


def test_an_unaudited_capability_is_refused_naming_the_argument():
    result = _run("benchmarks/compile_audit.py", "--capability", "75")
    assert result.returncode == 2 and "argument --capability: invalid choice: 75" in result.stderr, result.stderr
