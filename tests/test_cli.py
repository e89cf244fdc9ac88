"""The `vase-triton` command: first-run path, help, and one-line errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from vase_triton.cli import main


def _row(out: str, name: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(name))


def test_generate_on_builtin_testbed_compares_full_cache_and_policy(capsys, monkeypatch, one_thread):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    assert main(["generate", "--policy", "h2o", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    from vase_triton.testbed.harness import testbed_problems

    expected = testbed_problems(4)[3].answer
    assert f"expected answer: {expected} after 128 steps" in out
    assert "full cache" in _row(out, " ") and "h2o" in _row(out, " ")
    verdicts = re.findall(r"(\d+) \((right|wrong)\)|none", _row(out, "answer"))
    assert len(verdicts) == 2
    for value, verdict in verdicts:
        assert verdict == ("" if not value else "right" if value == expected else "wrong")
    evictions = _row(out, "evictions").split()
    assert evictions[1] == "0" and int(evictions[4]) > 0
    assert "budget 82 + window 16 (4.0x)" in _row(out, "cache")


def test_generate_with_a_local_model_directory(saved_model_dir, capsys, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    argv = ["generate", "--model", str(saved_model_dir), "--max-new-tokens", "40", "--budget", "24", "--window", "8"]
    assert main(argv + ["--prompt", "A prompt long enough to be compressed at prefill, twice over."]) == 0
    out = capsys.readouterr().out
    assert f"model:            {saved_model_dir}" in out
    assert "prompt tokens:    61" in out
    assert int(out.split("evictions:")[1].split()[0]) > 0


def test_first_run_path_as_module_in_a_fresh_process():
    env = dict(os.environ, VASE_BACKEND="torch")
    env.pop("TRITON_INTERPRET", None)
    result = subprocess.run(
        [sys.executable, "-m", "vase_triton", "generate", "--policy", "snapkv", "--max-new-tokens", "40"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "expected answer:" in result.stdout and "snapkv" in result.stdout
    assert result.stderr.strip() == ""


@pytest.mark.parametrize("argv", [["--help"], ["generate", "--help"], ["eval", "--help"]], ids=["top", "generate", "eval"])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    assert "usage: vase-triton" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["generate", "--policy", "nope"], "--policy"),
        (["generate", "--budget", "-3"], "--budget"),
        (["generate", "--max-new-tokens", "many"], "--max-new-tokens"),
        ([], "COMMAND"),
    ],
    ids=["policy", "budget", "max-new-tokens", "no-command"],
)
def test_bad_arguments_exit_non_zero(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vase-triton: error:") and fragment in err and len(err.splitlines()) == 1


def test_invalid_config_and_missing_model_are_one_line_errors(tmp_path, capsys):
    assert main(["generate", "--budget", "8", "--window", "8"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("vase-triton: error:") and "budget" in err and len(err.splitlines()) == 1

    assert main(["generate", "--prompt", "hello"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("vase-triton: error: --prompt") and len(err.splitlines()) == 1

    assert main(["generate", "--model", str(tmp_path / "missing-model")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("vase-triton: error: --model") and len(err.splitlines()) == 1
