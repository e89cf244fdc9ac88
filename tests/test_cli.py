"""The `vase-triton` command: first-run path, help, and one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vase_triton.cli import main


def test_generate_on_builtin_default_reports_summary(capsys, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    assert main(["generate", "--max-new-tokens", "160", "--budget", "40", "--window", "8"]) == 0
    out = capsys.readouterr().out
    assert "built-in tiny random Qwen3" in out
    assert "tokens generated: 160" in out
    assert "tokens/s" in out
    evictions = int(out.split("evictions:")[1].split()[0])
    assert evictions > 0
    assert "static cache vs" in out


@pytest.fixture
def saved_model_dir(tmp_path):
    """A tiny Qwen3 and a character-level fast tokenizer saved as a local model directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from vase_triton.demo_model import tiny_qwen3

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    vocab = {token: index for index, token in enumerate(specials + [chr(c) for c in range(32, 127)])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    ).save_pretrained(tmp_path)
    tiny_qwen3(seed=3).save_pretrained(tmp_path)
    return tmp_path


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
        [sys.executable, "-m", "vase_triton", "generate", "--max-new-tokens", "80", "--policy", "snapkv"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "tokens generated: 80" in result.stdout


@pytest.mark.parametrize("argv", [["--help"], ["generate", "--help"]], ids=["top", "generate"])
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

    assert main(["generate", "--model", str(tmp_path / "missing-model")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("vase-triton: error: --model") and len(err.splitlines()) == 1
