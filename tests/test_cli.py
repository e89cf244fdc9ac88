"""The `vase-triton` command: first-run path, help, and one-line errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from model_dirs import save_model_dir
from vase_triton.cli import main


def _row(out: str, name: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(name))


def test_generate_on_builtin_testbed_compares_full_cache_and_policy(capsys, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    assert main(["generate", "--policy", "h2o", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    from vase_triton.testbed.harness import compression_budget, testbed_problems
    from vase_triton.testbed.task import DEFAULT_STEPS

    expected = testbed_problems(4)[3].answer
    assert f"expected answer: {expected} after {DEFAULT_STEPS} steps" in out
    assert "full cache" in _row(out, " ") and "h2o" in _row(out, " ")
    verdicts = re.findall(r"(\d+) \((right|wrong)\)|none", _row(out, "answer"))
    assert len(verdicts) == 2
    for value, verdict in verdicts:
        assert verdict == ("" if not value else "right" if value == expected else "wrong")
    evictions = _row(out, "evictions").split()
    assert evictions[1] == "0" and int(evictions[4]) > 0
    assert f"budget {compression_budget(4)} + window 16 (4.0x)" in _row(out, "cache")


def test_the_testbed_view_of_a_budget_past_the_sequence_and_a_short_trace(capsys, monkeypatch):
    from vase_triton.testbed.harness import SEQUENCE_TOKENS

    monkeypatch.setenv("VASE_BACKEND", "torch")
    assert main(["generate", "--budget", "100000", "--max-new-tokens", "5"]) == 0
    out = capsys.readouterr().out
    assert f"  budget 100000 + window 16 (holds all {SEQUENCE_TOKENS})" in _row(out, "cache")  # columns apart
    assert "full cache: 0:a 1 1:b 1 2:c" in out.splitlines()  # 5 words, shown once


def test_generate_on_builtin_testbed_picks_the_problem_of_a_large_seed_cheaply(capsys, monkeypatch):
    from vase_triton.testbed import demo

    monkeypatch.setenv("VASE_BACKEND", "torch")
    all_problems = demo.testbed_problems

    def first_problems(count):
        assert count <= 1024, f"drew {count} problems to show one"
        return all_problems(count)

    monkeypatch.setattr(demo, "testbed_problems", first_problems)
    assert main(["generate", "--seed", str(2**31 - 1), "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "testbed problem 1023 (held-out)" in out
    assert f"expected answer: {all_problems(1024)[1023].answer} after" in out


# A Qwen3-style template: thinking on unless `enable_thinking=False` (then an empty think block).
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>"
    "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}{% endif %}"
)


def test_generate_with_a_local_model_directory(saved_model_dir, capsys, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    argv = ["generate", "--model", str(saved_model_dir), "--max-new-tokens", "40", "--budget", "24", "--window", "8"]
    assert main(argv + ["--prompt", "A prompt long enough to be compressed at prefill, twice over."]) == 0
    out = capsys.readouterr().out
    assert f"model:            {saved_model_dir}" in out
    assert "prompts:          1 (61 prompt tokens)" in out
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


@pytest.mark.parametrize(
    "argv", [["--help"], ["generate", "--help"], ["eval", "--help"], ["autotune", "--help"]],
    ids=["top", "generate", "eval", "autotune"],
)
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    assert "usage: vase-triton" in capsys.readouterr().out


def test_policy_help_describes_every_policy_by_its_summary(capsys, monkeypatch):
    from vase_triton.policies import POLICIES

    monkeypatch.setenv("COLUMNS", "100000")  # argparse wraps help to the terminal, hyphens included
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = capsys.readouterr().out
    for name, policy in POLICIES.items():
        assert f"{name}: {policy.summary}" in text, name


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


def one_line_error(capsys, argv, fragment, status=1):
    """`argv` fails with exit status `status` and one stderr line holding `fragment`; returns the line."""
    capsys.readouterr()  # drop what the set-up printed
    if status == 2:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
    else:
        assert main(argv) == status
    err = capsys.readouterr().err.strip()
    assert err.startswith("vase-triton: error:") and fragment in err and len(err.splitlines()) == 1, err
    return err


def test_invalid_config_and_missing_model_are_one_line_errors(tmp_path, capsys, monkeypatch):
    one_line_error(capsys, ["generate", "--budget", "8", "--window", "8"], "--budget: expected budget > window")
    one_line_error(capsys, ["generate", "--model", str(tmp_path / "missing-model")], "no such directory")
    one_line_error(capsys, ["generate", "--model", "./models/qwen"], "no such directory: ./models/qwen")
    one_line_error(capsys, ["generate", "--model", ""], "--model: expected a transformers model directory or a hub id; got ''")
    monkeypatch.setattr("vase_triton.commands.common.hub_reachable", lambda timeout=3.0: False)
    one_line_error(capsys, ["generate", "--model", "no-such-model-anywhere"], "the hub is unreachable")
    (tmp_path / "empty").mkdir()
    one_line_error(capsys, ["generate", "--model", str(tmp_path / "empty")], "has no config.json")


def test_every_bad_input_is_one_line(saved_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    model_only = tmp_path / "model-only"
    from vase_triton.demo_model import tiny_qwen3

    tiny_qwen3(seed=3).save_pretrained(model_only)
    model = ["generate", "--model", str(saved_model_dir)]
    one_line_error(capsys, ["generate", "--model", str(model_only)], "has no tokenizer files")
    one_line_error(capsys, model + ["--prompt", ""], "--prompt: the prompt is empty (0 tokens)")
    one_line_error(capsys, ["generate", "--prompt", "hello"], "--prompt: only with --model")
    one_line_error(capsys, ["generate", "--policy", "full"], "--policy: the testbed demo compares")
    one_line_error(capsys, ["generate", "--temperature", "inf"], "--temperature", status=2)
    one_line_error(capsys, ["generate", "--evict-temperature", "nan"], "--evict-temperature", status=2)
    one_line_error(capsys, ["generate", "--policy", "random", "--evict-temperature", "0"], "--evict-temperature:")
    one_line_error(capsys, model + ["--prompts", str(tmp_path / "none.jsonl")], "--prompts: no such file")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"text": "no prompt"}\n')
    one_line_error(capsys, model + ["--prompts", str(bad)], "line 2: expected an object with a \"prompt\" string")
    one_line_error(capsys, model + ["--out", str(tmp_path / "x.jsonl")], "--out: only with --prompts")
    one_line_error(capsys, model + ["--chat"], "--chat: this tokenizer has no chat template")
    monkeypatch.setenv("VASE_BACKEND", "fastest")
    one_line_error(capsys, ["generate"], "VASE_BACKEND: expected one of auto, triton, torch")


def test_unusable_environment_settings_are_one_line_errors(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("VASE_BACKEND", "triton")
    one_line_error(capsys, ["generate"], "VASE_BACKEND=triton on cpu tensors needs the Triton interpreter")
    # On a CUDA machine the check is of the device asked for, not the default one.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for command in ("generate", "eval"):
        one_line_error(capsys, [command, "--device", "cpu"], "VASE_BACKEND=triton on cpu tensors needs the Triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("VASE_BACKEND", "auto")
    monkeypatch.setenv("VASE_AUTOTUNE", "bogus")
    one_line_error(capsys, ["generate"], "VASE_AUTOTUNE: expected one of off, cached, online; got 'bogus'")


def test_unsupported_architecture_is_one_line(tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    directory = save_model_dir(tmp_path)
    GPT2LMHeadModel(GPT2Config(vocab_size=103, n_embd=64, n_layer=1, n_head=2)).save_pretrained(directory)
    one_line_error(capsys, ["generate", "--model", str(directory)], "--model: expected a transformers causal LM of type")


def test_prompts_file_runs_batches_and_writes_one_line_per_completion(saved_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(r) for r in [{"prompt": "abc", "id": "a"}, {"prompt": "a longer one"},
                                                             {"prompt": "third", "id": 7}]) + "\n")
    out = tmp_path / "out.jsonl"
    argv = ["generate", "--model", str(saved_model_dir), "--prompts", str(prompts), "--out", str(out),
            "--batch-size", "2", "--max-new-tokens", "30", "--budget", "16", "--window", "4", "--temperature", "0"]
    assert main(argv) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["id"] for line in lines] == ["a", "2", "7"]
    assert [line["prompt_tokens"] for line in lines] == [3, 12, 5]
    for line in lines:
        assert set(line) == {"id", "prompt_tokens", "tokens_generated", "evictions", "seconds", "kv_memory_bytes", "text"}
        assert 1 <= line["tokens_generated"] <= 30 and line["kv_memory_bytes"] > 0
    assert "prompts:          3 (20 prompt tokens)" in capsys.readouterr().out


def test_batches_of_one_size_share_a_cache_and_generate_as_alone(saved_model_dir, tmp_path, monkeypatch):
    """Four prompts in batches of two: the second batch reuses the first's cache (reset), and generates
    what it generates on its own, evictions included."""
    from vase_triton.integrations import hf_cache

    monkeypatch.setenv("VASE_BACKEND", "torch")
    made = []
    for_model = hf_cache.VaSECache.for_model.__func__
    monkeypatch.setattr(hf_cache.VaSECache, "for_model",
                        classmethod(lambda cls, *a, **k: made.append(for_model(cls, *a, **k)) or made[-1]))
    records = [{"prompt": text, "id": text} for text in ("abc", "a longer one", "third", "fourth prompt")]

    def run(rows, name):
        prompts, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}-out.jsonl"
        prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
        argv = ["generate", "--model", str(saved_model_dir), "--prompts", str(prompts), "--out", str(out),
                "--batch-size", "2", "--max-new-tokens", "40", "--budget", "16", "--window", "4", "--temperature", "0"]
        assert main(argv) == 0
        return {line["id"]: (line["text"], line["evictions"]) for line in map(json.loads, out.read_text().splitlines())}

    together = run(records, "together")
    assert len(made) == 1 and together["fourth prompt"][1] > 0
    alone = run(records[2:], "alone")
    assert {key: together[key] for key in alone} == alone


def test_json_summary_and_streamed_text_agree(saved_model_dir, capsys, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    argv = ["generate", "--model", str(saved_model_dir), "--prompt", "stream me", "--max-new-tokens", "24",
            "--budget", "16", "--window", "4", "--temperature", "0"]
    assert main(argv + ["--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["tokens_generated"] == 24 and summary["prompt_tokens"] == 9 and summary["sampling"] == {"do_sample": False}
    assert (summary["budget"], summary["window"], summary["capacity"]) == (16, 4, 20)
    assert main(argv) == 0
    streamed = capsys.readouterr().out
    assert streamed.startswith(summary["text"]) and "tokens generated: 24" in streamed


def test_chat_template_and_thinking_switch(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    directory = save_model_dir(tmp_path, chat_template=CHAT_TEMPLATE)
    base = ["generate", "--model", str(directory), "--prompt", "hi", "--max-new-tokens", "4", "--json"]
    counts = {}
    for name, extra in {"chat": [], "no-think": ["--no-think"], "plain": ["--no-chat"]}.items():
        assert main(base + extra) == 0
        counts[name] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["prompt_tokens"]
    # "<user>hi<assistant>" is 19 characters; the empty think block adds 15; plain is the prompt alone.
    assert counts == {"chat": 19, "no-think": 34, "plain": 2}


def test_a_chat_template_that_writes_the_bos_gets_no_second_one(tmp_path, capsys, monkeypatch):
    """The prompt is the template's tokens exactly: a tokenizer that also adds a BOS must not add it again."""
    from transformers import AutoTokenizer

    monkeypatch.setenv("VASE_BACKEND", "torch")
    directory = save_model_dir(tmp_path, chat_template="{{ bos_token }}" + CHAT_TEMPLATE, add_bos=True)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    messages = [{"role": "user", "content": "hi"}]
    templated = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = tokenizer(templated, add_special_tokens=False)["input_ids"]
    assert expected[:2] == [1, tokenizer.convert_tokens_to_ids("<")]  # one BOS, then the template's text
    assert main(["generate", "--model", str(directory), "--prompt", "hi", "--max-new-tokens", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["prompt_tokens"] == len(expected)
    # Without the template the tokenizer's own BOS stays.
    assert main(["generate", "--model", str(directory), "--prompt", "hi", "--max-new-tokens", "2", "--json",
                 "--no-chat"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["prompt_tokens"] == 3


def test_bad_out_paths_fail_before_the_model_loads(saved_model_dir, tmp_path, capsys, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("vase_triton.commands.generate.load_model", no_loading)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "abc"}\n')
    model = ["generate", "--model", str(saved_model_dir), "--prompts", str(prompts)]
    one_line_error(capsys, model + ["--out", str(tmp_path / "missing" / "out.jsonl")], "--out: cannot write")
    one_line_error(capsys, model + ["--out", str(tmp_path)], "is a directory; expected a file path")
    one_line_error(capsys, model + ["--out", str(prompts)], "is the --prompts file")
    assert prompts.read_text() == '{"prompt": "abc"}\n'


def test_an_earlier_out_stays_until_the_first_batch_is_written(saved_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    out.write_text('{"earlier": 1}\n')
    prompts.write_text('{"prompt": "abc"}\n{"prompt": ""}\n')  # the second prompt is refused after loading
    model = ["generate", "--model", str(saved_model_dir), "--prompts", str(prompts), "--out", str(out)]
    one_line_error(capsys, model, "the prompt is empty (0 tokens)")
    assert out.read_text() == '{"earlier": 1}\n'
    os.link(prompts, tmp_path / "linked.jsonl")  # the prompts file under another name
    one_line_error(capsys, model[:-1] + [str(tmp_path / "linked.jsonl")], "is the --prompts file")
    assert prompts.read_text() == '{"prompt": "abc"}\n{"prompt": ""}\n'


def test_prompt_lines_end_at_newlines_only_and_ids_are_strings_or_integers(saved_model_dir, tmp_path, capsys,
                                                                          monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    # U+2028 and U+0085 inside a prompt, written raw as JSON allows; CRLF line ends.
    prompts.write_text(json.dumps({"prompt": "a\u2028b\u0085c", "id": 5}, ensure_ascii=False) + "\r\n"
                       + json.dumps({"prompt": "d"}) + "\r\n", encoding="utf-8")  # fmt: skip
    argv = ["generate", "--model", str(saved_model_dir), "--prompts", str(prompts), "--out", str(out),
            "--max-new-tokens", "2"]
    assert main(argv) == 0
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["5", "2"]
    for bad in ("null", "true", '{"x": 1}', "1.5"):
        prompts.write_text('{"prompt": "abc", "id": ' + bad + "}\n")
        one_line_error(capsys, argv, f'line 1: expected an "id" string or integer; got {json.dumps(json.loads(bad))}')


def test_the_summary_capacity_is_that_of_the_largest_cache(saved_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "a" * 45}) + "\n" + json.dumps({"prompt": "abc"}) + "\n")
    assert main(["generate", "--model", str(saved_model_dir), "--prompts", str(prompts), "--out",
                 str(tmp_path / "out.jsonl"), "--batch-size", "1", "--max-new-tokens", "5", "--policy", "full",
                 "--json"]) == 0  # fmt: skip
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # The full cache of the first batch holds its 45 prompt tokens and 5 new ones, the second's 8:
    # the summary's capacity and memory are both the first's.
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert summary["capacity"] == 50 and summary["kv_memory_bytes"] == lines[0]["kv_memory_bytes"]
    assert summary["budget"] is None and summary["window"] is None  # `full` has neither
    assert lines[0]["kv_memory_bytes"] > lines[1]["kv_memory_bytes"]


def test_options_the_run_would_ignore_are_refused(saved_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    model = ["generate", "--model", str(saved_model_dir), "--max-new-tokens", "2"]
    one_line_error(capsys, model + ["--policy", "full", "--budget", "16"], "--budget: the 'full' policy keeps every")
    one_line_error(capsys, model + ["--policy", "full", "--window", "5000"], "--window: the 'full' policy keeps every")
    for policy, option, value, why in (
        ("full", "--n-sink", "8", "the 'full' policy keeps every token"),
        ("full", "--evict-temperature", "0.5", "the 'full' policy keeps every token"),
        ("full", "--score-mode", "emitted", "the 'full' policy keeps every token"),
        ("snapkv", "--evict-temperature", "0.5", "policy 'snapkv' keeps the top-ranked candidates without sampling"),
        ("h2o", "--score-mode", "emitted", "policy 'h2o' does not observe the window's attention"),
        ("snapkv", "--value-stat", "l2", "value protection is off for policy 'snapkv' (--protect-values turns it on)"),
        ("snapkv", "--n-protect", "5", "value protection is off for policy 'snapkv' (--protect-values turns it on)"),
        ("full", "--protect-values", None, "the 'full' policy keeps every token"),
        ("full", "--no-protect-values", None, "the 'full' policy keeps every token"),
        ("vase", "--rkv-lambda", "0.5", "policy 'vase' does not read rkv_lambda"),
        ("vase", "--dkv-rank", "7", "policy 'vase' does not read dkv_rank"),
        ("streaming", "--pool-kernel", "7", "policy 'streaming' does not read pool_kernel"),
    ):
        named = option.replace("--no-", "--")
        one_line_error(capsys, model + ["--policy", policy, option] + ([value] if value else []),
                       f"{named}: {why}, so {named} would be ignored; drop {named}")  # fmt: skip
    one_line_error(capsys, model + ["--no-protect-values", "--n-protect", "5"],
                   "--n-protect: value protection is off for policy 'vase'")  # fmt: skip
    one_line_error(capsys, model + ["--batch-size", "4"], "--batch-size: only with --prompts")
    one_line_error(capsys, model + ["--no-think"], "--no-think: only with a chat template")
    directory = save_model_dir(tmp_path / "failing", chat_template="{{ raise_exception('a system message is required') }}")
    one_line_error(capsys, ["generate", "--model", str(directory), "--prompt", "hi"],
                   "--chat: the tokenizer's chat template failed: a system message is required")  # fmt: skip
    unpadded = save_model_dir(tmp_path / "unpadded")
    settings = json.loads((unpadded / "tokenizer_config.json").read_text())
    for name in ("pad_token", "eos_token"):
        settings.pop(name, None)
    (unpadded / "tokenizer_config.json").write_text(json.dumps(settings))
    one_line_error(capsys, ["generate", "--model", str(unpadded), "--prompt", "hi"],
                   "--model: the tokenizer has neither a padding nor an end-of-sequence token")  # fmt: skip


def test_options_a_policy_reads_are_taken(saved_model_dir, capsys, monkeypatch):
    """Each option is accepted where its policy reads it, and sets the configuration; a chunk
    shorter than the default window is fine for `full`, which never compresses a chunk."""
    from vase_triton.commands import common

    monkeypatch.setenv("VASE_BACKEND", "torch")
    configs = []
    make = common.config_from_arguments
    monkeypatch.setattr("vase_triton.commands.generate.config_from_arguments",
                        lambda *args, **kwargs: configs.append(make(*args, **kwargs)) or configs[-1])  # fmt: skip
    model = ["generate", "--model", str(saved_model_dir), "--max-new-tokens", "2", "--json"]
    for policy, option, value, field in (
        ("vase", "--evict-temperature", "0.5", "temperature"),
        ("vase", "--score-mode", "emitted", "score_mode"),
        ("vase", "--value-stat", "l2", "value_stat"),
        ("snapkv", "--value-stat", "absmax", "value_stat"),  # with --protect-values below
        ("rkv", "--rkv-lambda", "0.5", "rkv_lambda"),
        ("rkv", "--pool-kernel", "7", "pool_kernel"),
        ("vase-dkv", "--dkv-rank", "7", "dkv_rank"),
        ("full", "--prefill-chunk-size", "8", "prefill_chunk_size"),
    ):
        extra = ["--protect-values"] if policy == "snapkv" else []
        assert main(model + ["--policy", policy, option, value, *extra]) == 0
        assert str(getattr(configs[-1], field)) == value and configs[-1].policy == policy
    capsys.readouterr()


def test_each_batch_is_written_as_it_finishes(saved_model_dir, tmp_path, monkeypatch):
    """A run interrupted in its second batch keeps the first batch's lines."""
    from vase_triton.commands import generate

    monkeypatch.setenv("VASE_BACKEND", "torch")
    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": text, "id": text}) + "\n" for text in ("ab", "cd", "ef")))
    calls = []
    lengths = generate._generated_lengths

    def failing_second_batch(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return lengths(*args)

    monkeypatch.setattr(generate, "_generated_lengths", failing_second_batch)
    assert main(["generate", "--model", str(saved_model_dir), "--prompts", str(prompts), "--out", str(out),
                 "--batch-size", "2", "--max-new-tokens", "3"]) == 130  # fmt: skip
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["ab", "cd"]


@pytest.mark.parametrize("device", ["meta", "xpu", "cpu:3", "cuda:x"])
def test_devices_other_than_cpu_and_cuda_are_refused_by_name(device, capsys):
    one_line_error(capsys, ["generate", "--device", device], f"--device: expected cpu, cuda, cuda:N or auto; got {device!r}")


def test_a_cuda_index_must_name_an_existing_device(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    one_line_error(capsys, ["generate", "--device", "cuda:2"], "--device: expected cuda:N with N < 2")


def test_a_home_relative_model_directory_loads(saved_model_dir, capsys, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    monkeypatch.setenv("HOME", str(saved_model_dir.parent))
    argv = ["generate", "--model", f"~/{saved_model_dir.name}", "--prompt", "hi", "--max-new-tokens", "2", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["prompt_tokens"] == 2
    (saved_model_dir / "model.gguf").write_bytes(b"GGUF")
    one_line_error(capsys, ["generate", "--model", str(saved_model_dir / "model.gguf")], "model.gguf is a file")


def test_prompts_from_a_pipe_and_undecodable_prompts(saved_model_dir, tmp_path, capsys, monkeypatch):
    import threading

    monkeypatch.setenv("VASE_BACKEND", "torch")
    model = ["generate", "--model", str(saved_model_dir), "--max-new-tokens", "2"]
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    writer = threading.Thread(target=lambda: pipe.write_text('{"prompt": "abc", "id": "piped"}\n'), daemon=True)
    writer.start()
    status = main(model + ["--prompts", str(pipe)])
    if writer.is_alive():  # the pipe was never read: release the writer
        os.close(os.open(pipe, os.O_RDONLY | os.O_NONBLOCK))
    writer.join(timeout=10)
    assert status == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["id"] == "piped"
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"prompt": "caf\xe9"}\n')
    one_line_error(capsys, model + ["--prompts", str(latin)], "latin.jsonl is not UTF-8 text (byte 15)")
    one_line_error(capsys, model + ["--prompt", "ab\udcffcd"], "--prompt: not valid UTF-8 text (character 2)")


def test_sampling_options_that_would_be_ignored_are_refused(saved_model_dir, capsys, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    model = ["generate", "--model", str(saved_model_dir), "--prompt", "hi", "--max-new-tokens", "2"]
    # The tiny model's generation config decodes greedily.
    one_line_error(capsys, model + ["--top-p", "0.5"], "--top-p: only applies when sampling, and the model's")
    one_line_error(capsys, model + ["--top-k", "5", "--temperature", "0"], "--top-k: only applies when sampling, and --te")
    one_line_error(capsys, model + ["--temperature", "1e-300"], "--temperature: expected 0 (greedy) or at least 0.001")
    for option in (["--temperature", "0.7"], ["--top-k", "3"], ["--batch-size", "2"], ["--no-think"]):
        one_line_error(capsys, ["generate", *option], f"{option[0]}: only with --model")


def test_a_chat_prompt_must_not_be_empty_before_its_template(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    directory = save_model_dir(tmp_path, chat_template=CHAT_TEMPLATE)
    one_line_error(capsys, ["generate", "--model", str(directory), "--prompt", ""], "--prompt: the prompt is empty")


def test_the_full_cache_summary_names_its_real_capacity(saved_model_dir, capsys, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    argv = ["generate", "--model", str(saved_model_dir), "--policy", "full", "--prompt", "hello", "--max-new-tokens", "30"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "policy:           full (no eviction, capacity 35)" in out and "eviction pays off" not in out


@pytest.mark.parametrize(
    "change, fragment",
    [({"head_dim": 48}, "expected an attention head dim in"), ({"layer_types": "sliding"}, "every layer must use global attention")],
    ids=["head-dim", "sliding-window"],
)
def test_an_unsupported_attention_layout_is_refused_before_the_weights_load(tmp_path, capsys, monkeypatch, change, fragment):
    def no_loading(*args, **kwargs):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr("vase_triton.integrations.loading.load_causal_lm", no_loading)
    directory = save_model_dir(tmp_path)
    config = json.loads((directory / "config.json").read_text())
    if change.get("layer_types") == "sliding":
        change = {"layer_types": ["sliding_attention"] * config["num_hidden_layers"], "sliding_window": 8}
    (directory / "config.json").write_text(json.dumps({**config, **change}))
    one_line_error(capsys, ["generate", "--model", str(directory)], f"--model: {str(directory)!r}: {fragment}")


def test_the_testbed_demo_takes_value_protection_options_for_the_evicting_run_only(capsys, monkeypatch):
    """The full-cache run it compares with never evicts, so it must not inherit --n-protect / --protect-values."""
    monkeypatch.setenv("VASE_BACKEND", "torch")
    assert main(["generate", "--policy", "snapkv", "--protect-values", "--n-protect", "5", "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "full cache" in out and "snapkv" in out


def test_a_cache_too_large_for_memory_is_a_one_line_error(saved_model_dir, capsys, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    too_long = ["--max-new-tokens", str(10**15), "--device", "cpu"]  # beyond any address space
    err = one_line_error(
        capsys, ["generate", "--model", str(saved_model_dir), "--policy", "full", *too_long],
        "generate: out of memory on cpu for 1 prompt(s) of up to",
    )
    assert err.endswith("with the 'full' cache; lower --max-new-tokens")  # not --batch-size: one --prompt
    one_line_error(  # the built-in testbed: the full cache it compares with is sized by --max-new-tokens
        capsys, ["generate", *too_long], "generate: out of memory on cpu for the testbed problem with the 'vase' "
        "cache; lower --max-new-tokens or --budget",
    )
    one_line_error(
        capsys, ["eval", "--policies", "full", "--problems", "2", "--no-progress", "--out", str(saved_model_dir / "e"),
                 *too_long], "eval: out of memory on cpu at --batch-size 64, --max-new-tokens 1000000000000000",
    )
