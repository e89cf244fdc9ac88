"""The evaluation harness end to end on the testbed: output files, resuming, summary maths, errors."""

from __future__ import annotations

import csv
import json
import math
import os
import socket
import subprocess
import sys
import time

import pytest

from vase_triton.cli import main
from vase_triton.eval import runner
from vase_triton.eval.prompting import render_prompt, user_message
from vase_triton.eval.summary import AVERAGE, summarise
from vase_triton.eval.tasks import Problem, load_jsonl


@pytest.fixture
def cpu_reference(monkeypatch):
    """Whole generations run the PyTorch reference."""
    monkeypatch.setenv("VASE_BACKEND", "torch")


TESTBED_RUN = [
    "eval", "--problems", "6", "--policies", "full,vase,streaming", "--budgets", "82,41", "--samples", "2",
    "--batch-size", "12", "--no-progress",
]


def test_testbed_eval_writes_results_and_resumes_without_new_work(tmp_path, cpu_reference, capsys, monkeypatch):
    out = tmp_path / "run"
    assert main(TESTBED_RUN + ["--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| testbed | full (no eviction) |" in printed and "| testbed | vase |" in printed
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 6 * 2 * (1 + 2 * 2)
    keys = {(r["id"], r["policy"], r["budget"], r["sample"]) for r in records}
    assert len(keys) == len(records)
    for name in ("summary.md", "summary.csv", "accuracy.png", "length.png", "run.json"):
        assert (out / name).stat().st_size > 0
    full = [r for r in records if r["policy"] == "full"]
    assert all(r["budget"] is None and r["evictions"] == 0 for r in full)
    evicting = [r for r in records if r["policy"] != "full"]
    assert all(r["evictions"] > 0 and r["kv_bytes"] < full[0]["kv_bytes"] for r in evicting)
    assert all(r["prompt_tokens"] == 66 and r["output_tokens"] > 0 for r in records)
    assert all(r["correct"] == (r["answer"] == r["gold"]) for r in records)

    # Same seed, same batches: the greedy full-cache rows agree across the two samples.
    by_sample = {(r["id"], r["sample"]): r["output"] for r in full}
    assert all(by_sample[(i, 0)] == by_sample[(i, 1)] for i, _ in by_sample)

    before = (out / "results.jsonl").read_bytes()

    def no_new_work(*args, **kwargs):
        raise AssertionError("a finished sample was generated again")

    monkeypatch.setattr(runner, "generate_batch", no_new_work)
    assert main(TESTBED_RUN + ["--out", str(out)]) == 0
    assert (out / "results.jsonl").read_bytes() == before

    with (out / "summary.csv").open() as handle:
        rows = {(row["policy"], row["budget"]): row for row in csv.DictReader(handle)}
    for policy, budget in (("full", None), ("vase", 41), ("streaming", 82)):
        cell = [r for r in records if r["policy"] == policy and r["budget"] == budget]
        per_sample = [sum(r["correct"] for r in cell if r["sample"] == s) / 6 for s in (0, 1)]
        row = rows[(policy, "full" if budget is None else str(budget))]
        assert float(row["accuracy"]) == pytest.approx(sum(per_sample) / 2)
        assert float(row["stderr"]) == pytest.approx(abs(per_sample[0] - per_sample[1]) / 2)
        assert float(row["output_tokens"]) == pytest.approx(sum(r["output_tokens"] for r in cell) / len(cell))
        exact = sum(r["output"] == r_ref for r, r_ref in zip(cell, [_reference(r["id"]) for r in cell])) / len(cell)
        assert float(row["trace_exact"]) == pytest.approx(exact)


def _reference(problem_id: str) -> str:
    from vase_triton.testbed.harness import testbed_problems

    index = int(problem_id.split("-")[1])
    return testbed_problems(index + 1)[index].reference


def test_a_run_without_budgets_removes_the_plots_of_an_earlier_run_into_its_directory(tmp_path, cpu_reference):
    out = tmp_path / "run"
    argv = ["eval", "--problems", "1", "--samples", "1", "--no-progress", "--max-new-tokens", "4", "--out", str(out)]
    assert main(argv + ["--policies", "full,vase"]) == 0
    assert (out / "accuracy.png").exists() and (out / "length.png").exists()
    assert main(argv + ["--policies", "full"]) == 0
    assert not (out / "accuracy.png").exists() and not (out / "length.png").exists()
    assert "| full (no eviction) |" in (out / "summary.md").read_text() and "vase" not in (out / "summary.md").read_text()


def test_resume_refuses_an_output_directory_of_other_settings(tmp_path, cpu_reference, capsys):
    out = tmp_path / "run"
    argv = ["eval", "--problems", "2", "--policies", "full", "--samples", "1", "--no-progress", "--out", str(out)]
    assert main(argv + ["--max-new-tokens", "8"]) == 0
    printed = capsys.readouterr().out
    assert "| testbed | full (no eviction) |" in printed and "(+ summary.csv)" in printed
    assert not (out / "accuracy.png").exists()
    assert main(argv + ["--max-new-tokens", "9"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("vase-triton: error: --out") and "max_new_tokens" in err and len(err.splitlines()) == 1


def test_torn_last_line_is_dropped_and_redone(tmp_path, cpu_reference):
    out = tmp_path / "run"
    argv = ["eval", "--problems", "2", "--policies", "full", "--batch-size", "1", "--max-new-tokens", "8",
            "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    lines = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])
    assert main(argv) == 0
    again = (out / "results.jsonl").read_text().splitlines()
    assert len(again) == 2 and again[0] == lines[0]
    assert json.loads(again[1])["output"] == json.loads(lines[1])["output"]


def _record(task, policy, budget, sample, problem, correct, answer="1", tokens=10, seconds=1.0, batch=0):
    return {
        "task": task, "id": problem, "policy": policy, "budget": budget, "sample": sample, "correct": correct,
        "answer": answer, "output_tokens": tokens, "finished": True, "seconds": seconds, "batch": batch,
        "trace_exact": None,
    }


def test_summary_maths_on_hand_made_records():
    records = []
    # task x: 3 samples x 2 problems; per-sample accuracies 1/2, 1, 0.
    for sample, outcomes in enumerate([(True, False), (True, True), (False, False)]):
        for problem, correct in zip("pq", outcomes):
            answer = None if (sample, problem) == (2, "q") else "1"
            records.append(_record("x", "vase", 64, sample, problem, correct, answer, tokens=10 + sample, seconds=2.0, batch=sample))
    # task y: per-sample accuracies 1, 0, 1 over one problem.
    for sample, correct in enumerate([True, False, True]):
        records.append(_record("y", "vase", 64, sample, "r", correct, tokens=30, seconds=3.0, batch=sample))
    cells = {(c.task, c.policy, c.budget): c for c in summarise(records)}
    x, y, average = cells[("x", "vase", 64)], cells[("y", "vase", 64)], cells[(AVERAGE, "vase", 64)]
    assert x.accuracy == pytest.approx(0.5) and x.stderr == pytest.approx(0.5 / math.sqrt(3))
    assert y.accuracy == pytest.approx(2 / 3) and y.stderr == pytest.approx(math.sqrt(1 / 3) / math.sqrt(3))
    assert x.no_answer_rate == pytest.approx(1 / 6) and y.no_answer_rate == 0
    assert x.output_tokens == pytest.approx(11.0)
    # Task x: three batches (one per sample) of 2 rows, 66 tokens in 6 s; task y: 90 tokens in 9 s.
    assert x.tokens_per_s == pytest.approx(66 / 6) and y.tokens_per_s == pytest.approx(10.0)
    assert average.accuracy == pytest.approx((0.5 + 2 / 3) / 2)
    assert average.stderr == pytest.approx(math.hypot(x.stderr, y.stderr) / 2)
    # Task w: 3 problems x 2 samples in batches of 4; batch 0 spans both samples: 60 tokens in 1 + 1 s.
    spanning = [_record("w", "vase", 64, s, p, True, seconds=1.0, batch=k // 4) for k, (s, p) in
                enumerate((s, p) for s in (0, 1) for p in "abc")]
    assert summarise(spanning)[0].tokens_per_s == pytest.approx(60 / 2)
    single = summarise([_record("z", "h2o", 64, 0, "p", True)])[0]
    assert single.accuracy == 1.0 and math.isnan(single.stderr)


def test_batches_and_seeds_are_fixed_by_seed_and_batch_size():
    problems = [Problem("t", str(k), "q", "1") for k in range(5)]
    batches = runner.plan_batches(problems, samples=2, batch_size=4)
    assert [[(p.id, s) for p, s in batch] for batch in batches] == [
        [("0", 0), ("1", 0), ("2", 0), ("3", 0)], [("4", 0), ("0", 1), ("1", 1), ("2", 1)], [("3", 1), ("4", 1)],
    ]
    seeds = {runner.batch_seed(0, "t", k) for k in range(50)}
    assert len(seeds) == 50 and all(0 <= s < 2**31 for s in seeds)
    assert runner.batch_seed(0, "t", 3) == runner.batch_seed(0, "t", 3) != runner.batch_seed(1, "t", 3)
    assert runner.plan_runs(["vase", "full"], [8, 16]) == [
        runner.Run("full", None), runner.Run("vase", 8), runner.Run("vase", 16),
    ]


def test_jsonl_tasks_and_prompts(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(
        json.dumps({"id": "p1", "question": "What is 2 + 3?", "answer": 5}) + "\n\n"
        + json.dumps({"id": "p2", "question": "Which is prime?", "answer": "b", "choices": ["4", "5", "6", "8"]}) + "\n"
    )
    first, second = load_jsonl(path)
    assert (first.task, first.id, first.answer, first.choices) == ("mine", "p1", "5", None)
    assert second.choices == ("4", "5", "6", "8") and second.answer == "b"
    assert user_message(first).endswith("within \\boxed{}.")
    assert "A) 4\nB) 5\nC) 6\nD) 8" in user_message(second) and "letter" in user_message(second)

    class Templated:
        chat_template = "set"

        def apply_chat_template(self, messages, **kwargs):
            assert kwargs["enable_thinking"] is True and kwargs["add_generation_prompt"] is True
            return "<user>" + messages[0]["content"] + "<assistant><think>"

    assert render_prompt(Templated(), first).startswith("<user>What is 2 + 3?")


@pytest.mark.parametrize(
    "content, fragment",
    [
        ('{"id": "1", "question": "q"}\n', "'answer'"),
        ('{"id": "1", "question": "q", "answer": "Z", "choices": ["x", "y"]}\n', "letters AB"),
        ('{"id": "1", "question": "q", "answer": "1"}\n{"id": "1", "question": "r", "answer": "2"}\n', "unique ids"),
        ("not json\n", "invalid JSON"),
        ("", "no problems"),
        ('{"id": "1", "question": "q", "answer": " "}\n', "expected field 'answer' (a non-empty string); got ' '"),
        ('{"id": "", "question": "q", "answer": "1"}\n', "expected field 'id' (a non-empty string)"),
        ('{"id": "1", "question": "q", "answer": "A", "choices": ["x", ""]}\n', "2 to 26 non-empty strings"),
        ('{"id": "1", "question": "q", "answer": "A", "choices": ' + json.dumps([str(k) for k in range(27)]) + "}\n",
         "2 to 26 non-empty strings (lettered A to Z)"),
    ],
    ids=["missing-answer", "bad-letter", "duplicate-id", "not-json", "empty", "blank-answer", "empty-id", "empty-choice",
         "27-choices"],
)
def test_bad_jsonl_is_a_one_line_error(tmp_path, content, fragment, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    assert main(["eval", "--tasks", str(path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("vase-triton: error: --tasks") and fragment in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["eval", "--policies", "vase,fastest"], "--policies"),
        (["eval", "--budgets", "64,0"], "--budgets"),
        (["eval", "--samples", "none"], "--samples"),
    ],
    ids=["unknown-policy", "zero-budget", "samples"],
)
def test_bad_eval_arguments_exit_with_status_2(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vase-triton: error:") and fragment in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["eval", "--tasks", "aime99"], "--tasks"),
        (["eval", "--budgets", "10"], "budget"),
        (["eval", "--model", "some/model"], "--out"),
        (["eval", "--policies", "full", "--budgets", "10"], "--budgets: only the evicting policies use it"),
        (["eval", "--policies", "full", "--window", "5000"], "--window: only the evicting policies use it"),
        (["eval", "--policies", "full,h2o", "--score-mode", "emitted"],
         "--score-mode: none of --policies observes the window's attention"),
        (["eval", "--tasks", "gsm8k", "--problems", "5"], "--problems: only the 'testbed' task uses it"),
    ],
    ids=["unknown-task", "budget-below-window", "model-without-out", "budgets-of-full-alone", "window-of-full-alone",
         "score-mode-of-policies-that-do-not-observe", "problems-without-the-testbed-task"],
)
def test_bad_eval_inputs_return_status_1(argv, fragment, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("vase-triton: error:") and fragment in err and len(err.splitlines()) == 1


def test_hub_task_without_network_fails_fast_in_one_line(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", VASE_BACKEND="torch")
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "vase_triton", "eval", "--tasks", "gsm8k", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 1
    err = result.stderr.strip()
    assert err.startswith("vase-triton: error: --tasks") and "gsm8k" in err and len(err.splitlines()) == 1
    assert time.perf_counter() - start < 120


def test_local_model_and_jsonl_task(tmp_path, cpu_reference, saved_model_dir):
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{k}", "question": f"What is {k} + 1?", "answer": str(k + 1)}) + "\n" for k in range(3)))
    out = tmp_path / "out"
    argv = ["eval", "--model", str(saved_model_dir), "--tasks", str(path), "--policies", "full,snapkv", "--budgets", "24",
            "--window", "8", "--samples", "2", "--max-new-tokens", "40", "--batch-size", "4", "--temperature", "0.7",
            "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 3 * 2 * 2 and {r["task"] for r in records} == {"toy"}
    assert all(r["trace_exact"] is None for r in records)
    assert json.loads((out / "run.json").read_text())["sampling"]["temperature"] == 0.7


def test_unreachable_hub_is_detected_without_waiting():
    from vase_triton.commands.common import endpoint_unreachable as _unreachable

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
    start = time.perf_counter()
    assert _unreachable(f"http://127.0.0.1:{port}", timeout_s=5.0)
    assert time.perf_counter() - start < 5


def test_the_reachability_check_goes_through_the_configured_proxy(monkeypatch):
    from vase_triton.commands.common import endpoint_unreachable

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        closed_port = closed.getsockname()[1]
    with socket.socket() as proxy:
        proxy.bind(("127.0.0.1", 0))
        proxy.listen()
        open_port = proxy.getsockname()[1]
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{open_port}")
        monkeypatch.delenv("https_proxy", raising=False)
        endpoint = f"https://127.0.0.1:{closed_port}"  # closed itself, but the proxy answers
        assert endpoint_unreachable(endpoint, timeout_s=5.0) is None
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        assert endpoint_unreachable(endpoint, timeout_s=5.0)
        monkeypatch.delenv("NO_PROXY")
        monkeypatch.setenv("HTTPS_PROXY", f"127.0.0.1:{closed_port}")
        assert endpoint_unreachable(f"https://127.0.0.1:{open_port}", timeout_s=5.0).startswith("proxy 127.0.0.1:")


def test_a_full_cache_only_summary_has_its_values():
    from vase_triton.eval.summary import markdown_table

    records = [_record("x", "full", None, 0, p, correct, tokens=20) for p, correct in zip("pqrs", (True, True, True, False))]
    table = markdown_table(summarise(records), "accuracy", "Accuracy")
    assert "| task | policy | no eviction |" in table
    assert "| x | full (no eviction) | 75.0 |" in table


def test_run_eval_takes_the_demo_model_and_byte_tokenizer(tmp_path, cpu_reference):
    """The library call runs on `tiny_qwen3` and its `ByteTokenizer` (no chat template, a
    BOS of its own); with the full cache and greedy decoding each output is the unpatched
    model's own greedy output for the same prompt."""
    import torch

    from vase_triton.demo_model import ByteTokenizer, tiny_qwen3
    from vase_triton.eval.runner import EvalSettings, run_eval
    from vase_triton.eval.tasks import Problem

    model, tokenizer = tiny_qwen3(seed=5), ByteTokenizer()
    problems = [Problem("toy", str(k), f"What is {k} + {k}?", str(2 * k)) for k in range(3)]
    settings = EvalSettings(model="tiny", max_new_tokens=6, batch_size=1, window=4, seed=0, sampling={"do_sample": False})
    results = run_eval(model, tokenizer, {"toy": problems}, policies=["full"], budgets=[32], samples=1,
                       settings=settings, out_dir=tmp_path / "run", progress=False)
    outputs = {record["id"]: record["output"] for record in map(json.loads, results.read_text().splitlines())}
    for problem in problems:
        prompt = tokenizer(runner.render_prompt(tokenizer, problem))
        with torch.inference_mode():
            expected = model.generate(**prompt, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        new = expected[0, prompt["input_ids"].shape[1]:].tolist()
        new = new[: new.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in new else new
        assert outputs[problem.id] == tokenizer.decode(new)


def test_a_trace_with_a_dropped_special_token_is_not_exact():
    """The output text drops special tokens; the whole-trace match does not: a `<pad>` or `<unk>` the
    model wrote between the reference's words makes the trace differ, its final EOS does not."""
    from vase_triton.eval.runner import EvalSettings, Run, _records
    from vase_triton.eval.verifier import Verifier
    from vase_triton.testbed.harness import testbed_problems
    from vase_triton.testbed.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    problem = testbed_problems(1)[0]
    reference = tokenizer(problem.reference, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    settings = EvalSettings(model="testbed", max_new_tokens=300, batch_size=1, window=16, seed=0,
                            sampling={"do_sample": False})  # fmt: skip

    def exact(ids):
        with Verifier() as verifier:
            (record,) = _records([(problem, 0)], ["prompt"], Run("full", None), settings, 0, 0,
                                 ([ids], [5], 0, 0, 0.1), tokenizer, {eos}, verifier)  # fmt: skip
        return record["trace_exact"], record["correct"]

    assert exact(reference + [eos]) == (True, True)
    for special in (tokenizer.pad_token_id, tokenizer.unk_token_id):
        assert exact(reference[:10] + [special] + reference[10:] + [eos]) == (False, True)
