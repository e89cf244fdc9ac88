"""Resuming `vase-triton eval` into an existing `--out`: what is accepted, what is refused, and the
one-line errors for a broken output directory."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from vase_triton.cli import main
from vase_triton.eval.runner import RunError, read_results
from vase_triton.eval.tasks import load_task, task_label

TESTBED = ["eval", "--policies", "full", "--max-new-tokens", "6", "--no-progress"]
VARYING_FIELDS = ("seconds",)  # wall time: the only field a rerun may change


@pytest.fixture(autouse=True)
def cpu_reference(monkeypatch):
    """Whole generations run the PyTorch reference."""
    monkeypatch.setenv("VASE_BACKEND", "torch")


def _records(out) -> list[dict]:
    lines = (out / "results.jsonl").read_text().splitlines()
    records = [{k: v for k, v in json.loads(line).items() if k not in VARYING_FIELDS} for line in lines]
    return sorted(records, key=lambda r: (r["id"], r["sample"]))


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("vase-triton: error:") and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    "first, second, named",
    [
        (["--problems", "4", "--samples", "2", "--batch-size", "4"], ["--problems", "8", "--samples", "2", "--batch-size", "4"],
         "problems 4 there, 8 now"),
        (["--problems", "4", "--samples", "2", "--batch-size", "4"], ["--problems", "4", "--samples", "1", "--batch-size", "4"],
         "samples 2 there, 1 now"),
        (["--problems", "4", "--limit", "3", "--batch-size", "2"], ["--problems", "4", "--limit", "2", "--batch-size", "2"],
         "problems 3 there, 2 now"),
        (["--problems", "2", "--dtype", "float32"], ["--problems", "2", "--dtype", "bfloat16"], "dtype"),
    ],
    ids=["more-problems-other-batches", "fewer-samples", "smaller-limit", "dtype"],
)
def test_resume_refuses_settings_that_change_recorded_results(tmp_path, capsys, first, second, named):
    out = tmp_path / "run"
    assert main(TESTBED + first + ["--out", str(out)]) == 0
    before = (out / "results.jsonl").read_bytes()
    capsys.readouterr()
    assert main(TESTBED + second + ["--out", str(out)]) == 1
    err = _one_line_error(capsys)
    assert err.startswith("vase-triton: error: --out") and named in err
    assert (out / "results.jsonl").read_bytes() == before


@pytest.mark.parametrize(
    "change, named",
    [(["--seed", "7"], "seed: 0 there, 7 now"), (["--max-new-tokens", "8"], "max_new_tokens: 6 there, 8 now"),
     (["--problems", "4"], "problems 2 there, 4 now")],
    ids=["seed", "max-new-tokens", "problems"],
)  # fmt: skip
def test_settings_that_do_not_depend_on_the_model_are_refused_before_it_loads(tmp_path, capsys, monkeypatch, change,
                                                                              named):
    out = tmp_path / "run"
    assert main(TESTBED + ["--problems", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    monkeypatch.setattr("vase_triton.testbed.model.load_testbed", lambda **_: pytest.fail("the model was loaded"))
    assert main(TESTBED + ["--problems", "2", *change, "--out", str(out)]) == 1
    assert named in _one_line_error(capsys)


@pytest.mark.parametrize(
    "first, final",
    [
        (["--problems", "2", "--samples", "1", "--batch-size", "2"], ["--problems", "4", "--samples", "1", "--batch-size", "2"]),
        (["--problems", "2", "--samples", "1", "--batch-size", "2"], ["--problems", "2", "--samples", "2", "--batch-size", "2"]),
    ],
    ids=["more-problems", "more-samples"],
)
def test_resume_that_keeps_every_batch_matches_a_fresh_run(tmp_path, capsys, first, final):
    resumed, fresh = tmp_path / "resumed", tmp_path / "fresh"
    assert main(TESTBED + first + ["--out", str(resumed)]) == 0
    assert main(TESTBED + final + ["--out", str(resumed)]) == 0
    assert main(TESTBED + final + ["--out", str(fresh)]) == 0
    assert _records(resumed) == _records(fresh)
    assert len(_records(fresh)) == 4


def test_summary_covers_only_the_budgets_of_this_run(tmp_path):
    out = tmp_path / "run"
    argv = ["eval", "--problems", "2", "--policies", "vase", "--max-new-tokens", "6", "--no-progress", "--out", str(out)]
    assert main(argv + ["--budgets", "41,82"]) == 0
    assert main(argv + ["--budgets", "41"]) == 0
    with (out / "summary.csv").open() as handle:
        assert [(row["policy"], row["budget"]) for row in csv.DictReader(handle)] == [("vase", "41")]


def test_truncated_settings_record_is_a_one_line_error(tmp_path, capsys):
    out = tmp_path / "run"
    argv = TESTBED + ["--problems", "2", "--out", str(out)]
    assert main(argv) == 0
    (out / "run.json").write_text((out / "run.json").read_text()[:20])
    capsys.readouterr()
    assert main(argv) == 1
    err = _one_line_error(capsys)
    assert err.startswith("vase-triton: error: --out") and "run.json" in err


def test_out_naming_a_file_is_a_one_line_error(tmp_path, capsys):
    out = tmp_path / "results.txt"
    out.write_text("not a directory\n")
    assert main(TESTBED + ["--problems", "2", "--out", str(out)]) == 1
    err = _one_line_error(capsys)
    assert err.startswith("vase-triton: error: --out") and str(out) in err


def test_unknown_backend_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "fastest")
    assert main(TESTBED + ["--problems", "2", "--out", str(tmp_path / "run")]) == 1
    err = _one_line_error(capsys)
    assert "VASE_BACKEND" in err and "fastest" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("seconds", ["0", "-1", "nan", "86401", "1e12"])
def test_a_grading_timeout_outside_a_day_is_refused_by_name(seconds, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--grading-timeout", seconds])
    assert exit_info.value.code == 2
    err = _one_line_error(capsys)
    assert "--grading-timeout" in err and "positive" in err


@pytest.mark.parametrize(
    "file_name, label", [("mine.txt", "mine"), ("mine.jsonl", "mine"), ("mine.v2.jsonl", "mine.v2"), ("mine", "mine")]
)
def test_a_task_file_is_recorded_under_its_label(tmp_path, file_name, label):
    path = tmp_path / file_name
    path.write_text(json.dumps({"id": "p1", "question": "What is 2 + 3?", "answer": "5"}) + "\n")
    assert task_label(str(path)) == label
    assert [problem.task for problem in load_task(str(path))] == [label]


def test_a_last_line_missing_only_its_newline_is_kept_and_the_resume_completes(tmp_path):
    out = tmp_path / "run"
    argv = TESTBED + ["--problems", "4", "--batch-size", "1", "--out", str(out)]
    assert main(argv) == 0
    complete = _records(out)
    lines = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text(lines[0] + "\n" + lines[1])  # two complete records, the second unterminated
    assert main(argv) == 0
    assert _records(out) == complete
    assert all(json.loads(line) for line in (out / "results.jsonl").read_text().splitlines())


def test_a_line_cut_inside_a_character_is_redone_and_line_separators_in_records_survive(tmp_path):
    path = tmp_path / "results.jsonl"
    kept = [{"task": "t", "id": f"p{i}\u2028\u0085", "policy": "full", "budget": None, "sample": 0} for i in range(2)]
    whole = json.dumps({**kept[0], "id": "x ≤ y"}, ensure_ascii=False).encode()
    torn = whole[: whole.index("≤".encode()) + 1]  # an interrupted write that ends inside '≤'
    path.write_bytes(b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in kept) + torn)
    assert read_results(path) == kept
    assert read_results(path) == kept and path.read_bytes().endswith(b"\n")


@pytest.mark.parametrize("line", ["{}", "[1]", '{"task": "t"}'])
def test_a_line_that_is_not_a_result_record_is_refused_naming_the_file(tmp_path, line):
    path = tmp_path / "results.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(RunError, match="results.jsonl: expected one result record per line"):
        read_results(path)


@pytest.mark.parametrize("damage", ["missing", "no-tasks"])
def test_results_without_their_settings_record_are_refused(tmp_path, capsys, damage):
    out = tmp_path / "run"
    argv = TESTBED + ["--problems", "2", "--out", str(out)]
    assert main(argv) == 0
    if damage == "missing":
        (out / "run.json").unlink()
    else:
        record = json.loads((out / "run.json").read_text())
        del record["tasks"]
        (out / "run.json").write_text(json.dumps(record))
    before = (out / "results.jsonl").read_bytes()
    capsys.readouterr()
    assert main(TESTBED + ["--problems", "2", "--seed", "7", "--out", str(out)]) == 1
    err = _one_line_error(capsys)
    assert err.startswith("vase-triton: error: --out") and "run.json" in err
    assert (out / "results.jsonl").read_bytes() == before


def test_settings_recorded_by_a_run_that_wrote_no_result_are_replaced(tmp_path, capsys):
    """A run stopped before its first batch leaves `run.json` alone: it binds no result, so a
    rerun with other settings takes the directory."""
    out = tmp_path / "run"
    assert main(TESTBED + ["--problems", "2", "--out", str(out)]) == 0
    (out / "results.jsonl").write_text("")
    assert main(TESTBED + ["--problems", "4", "--out", str(out)]) == 0
    assert [task["problems"] for task in json.loads((out / "run.json").read_text())["tasks"].values()] == [4]
    assert len(_records(out)) == 4


def test_a_null_reference_is_no_reference(tmp_path):
    tasks = tmp_path / "nulls.jsonl"
    tasks.write_text(json.dumps({"id": "a", "question": "q", "answer": "1", "reference": None, "choices": None}) + "\n")
    (problem,) = load_task(str(tasks))
    assert problem.reference is None and problem.choices is None


def test_a_non_string_reference_and_a_task_named_average_are_refused(tmp_path, capsys):
    bad = tmp_path / "refs.jsonl"
    bad.write_text(json.dumps({"id": "a", "question": "q", "answer": "1", "reference": 5}) + "\n")
    assert main(TESTBED + ["--tasks", str(bad), "--out", str(tmp_path / "r1")]) == 1
    assert "refs.jsonl:1: expected 'reference' to be a string" in _one_line_error(capsys)
    average = tmp_path / "average.jsonl"
    average.write_text(json.dumps({"id": "a", "question": "q", "answer": "1"}) + "\n")
    assert main(TESTBED + ["--tasks", str(average), "--out", str(tmp_path / "r2")]) == 1
    assert "would be recorded as 'average', the summary's mean over tasks" in _one_line_error(capsys)


def test_missing_grading_and_plotting_packages_are_named_before_any_work(tmp_path, capsys, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else find_spec(name, *a))
    assert main(TESTBED + ["--problems", "2", "--out", str(tmp_path / "run")]) == 1
    assert "eval: needs math-verify (grading and plots), not installed" in _one_line_error(capsys)
    assert not (tmp_path / "run").exists()


def test_a_math_verify_that_fails_to_import_is_a_one_line_error_before_the_model_loads(tmp_path, capsys, monkeypatch):
    (tmp_path / "shadow").mkdir()
    (tmp_path / "shadow" / "math_verify.py").write_text("raise ImportError('math_verify is broken here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "shadow"))  # the grading process's, not this one's
    monkeypatch.setattr("vase_triton.testbed.model.load_testbed", lambda **_: pytest.fail("the model was loaded"))
    assert main(TESTBED + ["--problems", "2", "--out", str(tmp_path / "run")]) == 1
    err = _one_line_error(capsys)
    assert "eval: grading: the math-verify process did not start (ImportError: math_verify is broken here)" in err
    assert not (tmp_path / "run").exists()


def test_another_checkpoint_at_the_same_path_is_refused(tmp_path, capsys, saved_model_dir):
    from vase_triton.demo_model import tiny_qwen3

    task = tmp_path / "task.jsonl"
    task.write_text(json.dumps({"id": "p1", "question": "1+1?", "answer": "2"}) + "\n")
    out = tmp_path / "run"
    argv = ["eval", "--model", str(saved_model_dir), "--tasks", str(task), "--policies", "full", "--samples", "1",
            "--max-new-tokens", "4", "--no-progress", "--device", "cpu", "--dtype", "float32", "--out", str(out)]
    assert main(argv) == 0
    assert main(argv) == 0  # the same weights: nothing to redo
    respelled = [f"{saved_model_dir}/." if arg == str(saved_model_dir) else arg for arg in argv]
    assert main(respelled) == 0  # the same directory, spelled otherwise
    tiny_qwen3(seed=4).save_pretrained(saved_model_dir)
    capsys.readouterr()
    assert main(argv) == 1
    err = _one_line_error(capsys)
    assert err.startswith("vase-triton: error: --out") and "weights: '" in err


def test_results_of_the_other_implementation_are_refused(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    argv = TESTBED + ["--problems", "2", "--out", str(out)]
    assert main(argv) == 0
    before = (out / "results.jsonl").read_bytes()
    monkeypatch.setenv("VASE_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    capsys.readouterr()
    assert main(argv) == 1
    assert "kernels: 'torch' there, 'triton' now" in _one_line_error(capsys)
    assert (out / "results.jsonl").read_bytes() == before


def test_a_settings_record_from_before_the_weights_digest_is_refused_by_name(tmp_path, capsys):
    out = tmp_path / "run"
    argv = TESTBED + ["--problems", "2", "--out", str(out)]
    assert main(argv) == 0
    record = json.loads((out / "run.json").read_text())
    del record["weights"], record["kernels"]
    (out / "run.json").write_text(json.dumps(record))
    capsys.readouterr()
    assert main(argv) == 1
    err = _one_line_error(capsys)
    assert "kernels: not recorded there, 'torch' now" in err and "weights: not recorded there" in err


def test_the_weights_digest_follows_the_weights_not_the_object():
    from vase_triton.demo_model import tiny_qwen3
    from vase_triton.eval.runner import weights_digest

    model, twin = tiny_qwen3(seed=3), tiny_qwen3(seed=3)
    assert weights_digest(model) == weights_digest(twin)
    assert weights_digest(model) != weights_digest(tiny_qwen3(seed=4))
    with torch.no_grad():
        next(twin.parameters()).view(-1)[-1] += 1.0
    assert weights_digest(model) != weights_digest(twin)
    assert weights_digest(model) != weights_digest(model.to(torch.float64))
    offloaded = tiny_qwen3(seed=3)
    offloaded.model.norm.weight = torch.nn.Parameter(torch.empty_like(offloaded.model.norm.weight, device="meta"))
    # An offloaded weight counts by name and shape: the digest is stable and lacks its values.
    assert weights_digest(offloaded) == weights_digest(offloaded) != weights_digest(model)


def test_the_full_cache_takes_no_budget(tmp_path, capsys):
    """`full` runs once, without a budget or window: budgets are checked for the policies that run at
    them, and refused when `full` runs alone (they would be ignored)."""
    rest = ["--max-new-tokens", "6", "--no-progress", "--problems", "2"]
    assert main(["eval", "--policies", "full", *rest, "--out", str(tmp_path / "full")]) == 0
    assert {(record["budget"], record["window"]) for record in _records(tmp_path / "full")} == {(None, None)}
    capsys.readouterr()
    assert main(["eval", "--policies", "full", *rest, "--budgets", "10,41", "--out", str(tmp_path / "f2")]) == 1
    assert "--budgets: only the evicting policies use it" in _one_line_error(capsys)
    assert main(["eval", "--policies", "full,vase", *rest, "--budgets", "10,41", "--out", str(tmp_path / "vase")]) == 1
    assert "--budgets: 10 with 'vase': budget: expected budget > window" in _one_line_error(capsys)
    assert main(["eval", "--policies", "vase", *rest, "--window", "200", "--out", str(tmp_path / "wide")]) == 1
    assert "--budgets/--window: 135/200 with 'vase': budget: expected budget > window" in _one_line_error(capsys)
    assert not any((tmp_path / name).exists() for name in ("f2", "vase", "wide"))


def test_a_full_cache_run_shares_its_out_with_evicting_runs_of_any_window_and_score_mode(tmp_path, capsys):
    """The full cache uses neither the window nor the score mode: its run binds neither, and the first
    evicting run in the directory binds both."""
    out, rest = tmp_path / "run", ["--max-new-tokens", "6", "--no-progress", "--problems", "2"]
    assert main(["eval", "--policies", "full", *rest, "--out", str(out)]) == 0
    assert main(["eval", "--policies", "vase", *rest, "--budgets", "40", "--window", "8", "--score-mode", "emitted",
                 "--out", str(out)]) == 0  # fmt: skip
    assert main(["eval", "--policies", "full", *rest, "--out", str(out)]) == 0
    recorded = json.loads((out / "run.json").read_text())
    assert (recorded["window"], recorded["score_mode"]) == (8, "emitted")
    assert {(r["policy"], r["window"]) for r in _records(out)} == {("full", None), ("vase", 8)}
    capsys.readouterr()
    assert main(["eval", "--policies", "full,vase", *rest, "--budgets", "40", "--out", str(out)]) == 1
    assert "window: 8 there, 16 now" in _one_line_error(capsys)


def test_answers_that_overran_in_grading_are_counted_in_notes(tmp_path, capsys, monkeypatch):
    from vase_triton.eval import grading, runner

    verdicts = iter(
        [grading.Grade(False, "timeout"), grading.Grade(True, "string"), grading.Grade(False, "memory-limit")]
    )
    monkeypatch.setattr(runner, "grade", lambda *args, **kwargs: next(verdicts))
    assert main(TESTBED + ["--problems", "3", "--out", str(tmp_path / "run")]) == 0
    assert [record["grading"] for record in _records(tmp_path / "run")] == ["timeout", "string", "memory-limit"]
    err = capsys.readouterr().err
    assert "note: 1 of 3 answers could not be graded within --grading-timeout 10 s and count as wrong" in err
    assert "note: 1 of 3 answers could not be graded within the grading process's 4 GiB and count as wrong" in err
