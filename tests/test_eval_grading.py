"""Answer extraction and grading on real-looking model outputs."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from vase_triton.eval import grading
from vase_triton.eval.extraction import choice_letter, extract_answer, last_boxed, opens_reasoning
from vase_triton.eval.grading import canonical, grade, string_verdict
from vase_triton.eval.tasks import gsm8k_gold, shuffled_choices
from vase_triton.eval.verifier import Overrun, Verifier

@pytest.fixture(scope="module")
def verifier():
    with Verifier() as shared:
        yield shared


THINKING = (
    "<think>\nLet me set up the equation. If $x = \\frac{1}{2}$ then maybe \\boxed{2}? No, recheck: "
    "the ratio is $\\frac{\\sqrt{3}}{2}$.\n</think>\n\nThe ratio is $\\boxed{\\dfrac{\\sqrt{3}}{2}}$."
)


@pytest.mark.parametrize(
    "text, expected",
    [
        (THINKING, "\\dfrac{\\sqrt{3}}{2}"),
        ("So $f(x) = \\boxed{\\left\\{ x \\mid x^{2} > 1 \\right\\}}$ and we are done.", "\\left\\{ x \\mid x^{2} > 1 \\right\\}"),
        ("First guess \\boxed{3}. Wait, I dropped a term: \\boxed{5}.", "5"),
        ("The perimeter is \\boxed{10\\text{ cm}}.", "10\\text{ cm}"),
        ("Hence \\fbox{42} is the count.", "42"),
        ("The rows: \\boxed{a \\\\{b}}", "a \\\\{b}"),
        ("so the answer is \\boxed 7.", "7"),
        ("so \\boxed {x + 1}.", "x + 1"),
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72"),
        ("Adding these up gives 1,234 in all.\n#### 1,234", "1,234"),
        ("After simplifying we get 12.\n\n**Final Answer:** 12", "12"),
        ("Thus the answer is $\\frac{3}{4}$.", "\\frac{3}{4}"),
        ("#### Step 1: set up\nWe add.\n#### Step 2: compute\n\nThe final answer is 42.", "42"),
        ("The total is 7.\n#### -1,250.5.", "-1,250.5"),
        ("She earns 1,234 dollars.\n#### $1,234", "1,234"),
        ("I answered 3 of them. After all that: 7", None),
        ("I answered 3 of them, so the answer is 7.", "7"),
    ],
    ids=["nested-dfrac", "escaped-braces", "multiple-boxed", "units", "fbox", "line-break-then-group", "boxed-space", "boxed-space-then-group", "gsm8k", "gsm8k-comma",
         "final-answer-line", "answer-is", "markdown-headings", "gsm8k-signed-decimal", "gsm8k-dollars", "answered-is-not-answer",
         "answer-after-answered"],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>\nThe answer seems to be 15? No wait, let me recompute: 3*4 =", None),
        ("<think>\nI need to find the answer. Let x = 7. Then", None),
        ("<think>\nthe answer must be at least 15, so let me try n = 16", None),
        ("<think>\nSo far: the answer is 15, but let me check the", None),
        ("<think>\nso \\boxed{5}. But wait, the sign", "5"),
        ("Is 12 the right answer? I computed 15 instead.", None),
        ("<think>\nOK.</think>\nThe answer is 12.\n\nI hope this answer helps!", "12"),
        ("My answer is 12.\n\nHmm, I'm not confident in this answer.", "12"),
        ("The answer is 12. Let me double check it later though.", "12"),
        ("The answer is 3.5. Done.", "3.5"),
        ("We are done.\n\n**Final Answer**\n42", "42"),
        ("<think>\nmaybe \\boxed{41}\n</think>\nThe final answer is 42.", "42"),
        ("<think>\nso it is \\boxed{41}\n</think>\n", "41"),
        ("The answer is **42**.", "42"),
        ("<think>\nso \\boxed{5}. Put the final answer within \\boxed{}, let me check", "5"),
        ("Adding up.\n\n**Answer**: 42", "42"),
        ("Natalia sold 72 clips. The answer is $72$ clips.", "72"),
        ("We are done.\n\n**Final Answer**\n\\[\n42\n\\]", "42"),
        ("The answer is \\[ 42 \\]", "42"),
        ("The answer is $5 and $6 is the change.", "5 and $6 is the change"),
    ],
    ids=["cut-off-musing", "cut-off-find-the-answer", "cut-off-at-least", "cut-off-interim-statement",
         "cut-off-box", "question-about-the-answer", "answer-word-after-the-answer", "doubt-after-the-answer",
         "rest-of-the-sentence", "decimal-then-sentence", "final-answer-heading", "conclusion-over-reasoning-box",
         "reasoning-box-when-the-conclusion-states-none", "bold-statement", "empty-template-box-after-an-answer",
         "bold-answer-then-colon", "formula-then-words", "heading-then-display-math", "display-math",
         "dollar-amounts-are-no-formula"],
)  # fmt: skip
def test_what_counts_as_a_stated_answer(text, expected):
    """A truncated reasoning's musings are not an answer; a statement is read to its sentence's end;
    the text after `</think>` comes before the reasoning."""
    assert extract_answer(text) == expected


def test_a_reasoning_the_prompt_opened_is_read_as_one():
    """DeepSeek-R1 templates end the prompt with `<think>`: the output continues the reasoning."""
    r1_prompt = "<｜User｜>What is 3*4?<｜Assistant｜><think>\n"
    assert opens_reasoning(r1_prompt) and not opens_reasoning("<think>\n\n</think>\n\nAnswer:")
    assert not opens_reasoning("What is 3*4?")
    cut_off = "Let me see, the answer is 15, but 3*4 is"
    assert extract_answer(cut_off, reasoning_open=True) is None and extract_answer(cut_off) is not None
    finished = "3*4 = 12.\n</think>\n\nThe answer is 12."
    assert extract_answer(finished, reasoning_open=True) == extract_answer(finished) == "12"
    assert extract_answer("so \\boxed{12}. But wait", reasoning_open=True) == "12"


@pytest.mark.parametrize(
    "text",
    ["I am not sure how to continue; the recursion", "We get \\boxed{12 and then the proof breaks off", ""],
    ids=["rambling", "unclosed-brace", "empty"],
)
def test_no_answer(text, verifier):
    assert extract_answer(text) is None
    assert grade(extract_answer(text), "12", verifier=verifier) == grading.Grade(False, "no-answer")


def test_last_boxed_skips_an_unclosed_final_box():
    assert last_boxed("We have \\boxed{4}. Double-check: \\boxed{4") == "4"


@pytest.mark.parametrize(
    "output, gold, correct",
    [
        (THINKING, "\\frac{\\sqrt{3}}{2}", True),
        ("so \\boxed{\\frac{1}{2}}", "0.5", True),
        ("so \\boxed{1+x^2}", "x^2+1", True),
        ("The area is \\boxed{10\\text{ cm}}.", "10", True),
        ("The angle is \\boxed{30^\\circ}.", "30", True),
        ("The angle is \\boxed{30°}.", "30", True),
        ("so \\boxed{12 square meters}", "12", True),
        ("#### 1,234", "1234", True),
        ("so \\boxed{(1, 2)}", "(1,2)", True),
        ("so \\boxed{4}", "3", False),
        ("so \\boxed{\\frac{2}{3}}", "\\frac{3}{2}", False),
        ("First \\boxed{3}, finally \\boxed{5}.", "3", False),
        ("so \\boxed{2,100}", "2100", True),
        ("so \\boxed{2, 100}", "2100", False),
        ("so \\boxed{-2, 100}", "-2100", False),
        ("so \\boxed{2100}", "2, 100", False),
    ],
    ids=["sqrt-dfrac", "fraction-decimal", "commuted", "units", "degrees", "degree-sign", "two-unit-words", "thousands", "pair", "wrong", "inverted",
         "last-box-wins", "thousands-token", "pair-is-not-thousands", "negative-pair", "gold-pair"],
)
def test_grade_math(output, gold, correct, verifier):
    assert grade(extract_answer(output), gold, verifier=verifier).correct is correct


@pytest.mark.parametrize(
    "output, letter",
    [
        ("The compound must be the ketone. \\boxed{B}", "B"),
        ("Therefore \\boxed{(C)}.", "C"),
        ("I conclude \\boxed{\\text{D}}", "D"),
        ("The answer is (A).", "A"),
        ("\\boxed{C) 4.2 eV}", "C"),
        ("\\boxed{c}", "C"),
        ("\\boxed{C: 4.2 eV}", "C"),
        ("\\boxed{\\text{(C) } 4.2 eV}", "C"),
        ("\\boxed{\\textbf{\\text{C}}}", "C"),
        ("\\boxed{\\textbf{(C)}\\ 4.2}", "C"),
        ("\\boxed{E}", None),
        ("\\boxed{4.2}", None),
    ],
    ids=["plain", "parenthesised", "text", "answer-line", "letter-and-value", "lowercase", "letter-colon-value",
         "text-letter-and-value", "nested-text", "amc-bold-letter-and-value", "out-of-range", "value-only"],
)
def test_choice_letters(output, letter, verifier):
    assert choice_letter(extract_answer(output), 4) == letter
    verdict = grade(extract_answer(output), "C", verifier=verifier, choices=["1", "2", "3", "4"])
    assert verdict.correct is (letter == "C")


def test_canonical_forms():
    assert canonical("$\\dfrac{1}{2}$") == canonical("\\frac{1}{2}")
    assert canonical("10 \\text{ cm}") == ("10", "cm")
    assert canonical("10 square meters") == ("10", "square meters")
    assert canonical("x + m") == ("x+m", "")  # a variable, not a unit: only a quantity's unit is split off
    assert canonical("\\left( 1, 2 \\right)") == ("(1,2)", "")
    assert canonical("12.0") == ("12", "")
    assert canonical("50\\%") == ("50", "")
    assert canonical("10 000") == canonical("10,000") == canonical("10\\,000") == ("10000", "")
    assert canonical("1 2") == ("1 2", "")
    assert canonical("10cm") == canonical("10\\,\\text{cm}") == canonical("10\\text{cm}") == ("10", "cm")
    assert canonical("2m") == ("2m", "")  # a one-letter unit glued to its number may be a variable
    assert canonical("x + 1") != canonical("x - 1")


@pytest.mark.parametrize(
    "answer, gold, same",
    [
        ("10 cm", "10", True), ("10", "10 cm", True), ("10 cm", "10 CM", True), ("5 dollars", "5", True),
        ("3 m", "3 km", False), ("4 minutes", "4 hours", False), ("1 2", "12", False), ("12", "1 2", False),
        ("1 2", "1 2", True), ("10 000", "10000", True), ("2 100 000", "2,100,000", True),
    ],
)
def test_string_match_keeps_units_and_digit_groups_apart(answer, gold, same):
    assert (string_verdict(answer, gold) is True) is same


@pytest.mark.parametrize(
    "answer, gold",
    [("10 m", "10 cm"), ("7 minutes", "7 hours"), ("10 meters", "10 m"), ("4\\,\\text{hours}", "4 minutes"),
     ("5\\text{cm}", "5\\text{ m}"), ("10 \\mathrm{~cm}", "10 m"), ("10cm", "10 m")],
)
def test_differing_units_are_wrong_without_asking_math_verify(answer, gold, verifier):
    assert grade(answer, gold, verifier=verifier) == grading.Grade(False, "string")


def test_gsm8k_gold_and_choice_shuffle():
    assert gsm8k_gold("Natalia sold 48/2 = 24 clips in May.\n#### 1,072") == "1072"
    choices, letter = shuffled_choices("right", ["w1", "w2", "w3"], seed=7)
    assert sorted(choices) == ["right", "w1", "w2", "w3"]
    assert choices[ord(letter) - ord("A")] == "right"
    assert shuffled_choices("right", ["w1", "w2", "w3"], seed=7) == (choices, letter)
    letters = {shuffled_choices("right", ["w1", "w2", "w3"], seed=s)[1] for s in range(40)}
    assert letters == {"A", "B", "C", "D"}


def test_grading_works_off_the_main_thread(verifier):
    verdicts = []
    worker = threading.Thread(target=lambda: verdicts.append(grade("\\dfrac{6}{8}", "\\frac{3}{4}", verifier=verifier)))
    worker.start()
    worker.join(60)
    assert verdicts == [grading.Grade(True, "math-verify")]


def test_a_verdict_that_holds_the_interpreter_is_killed_and_the_next_one_still_graded(verifier):
    """sympy spends ~30 s inside one C call on `3^{3^{16}}`: a thread could not be stopped and
    would stall the caller; the verifier kills its process and starts a new one."""
    verifier.verdict("1", "1", timeout_s=60)  # the child is up before the timed verdict
    start = time.perf_counter()
    verdict = grade("3^{3^{16}}", "7", verifier=verifier, timeout_s=0.5)
    waited = time.perf_counter() - start
    assert verdict == grading.Grade(False, "timeout")
    assert waited < 5
    assert grade("\\frac{2}{4}", "0.5", verifier=verifier) == grading.Grade(True, "math-verify")
    assert grade("\\frac{2}{5}", "0.5", verifier=verifier) == grading.Grade(False, "math-verify")


def test_ctrl_c_in_the_terminal_leaves_the_verifier_process_to_the_caller():
    """Ctrl-C sends SIGINT to the whole process group: the child ignores it (no traceback of
    its own on the shared stderr), and the caller, which handles it, stops the child."""
    with Verifier() as own:
        assert own.verdict("1", "1", timeout_s=60) is True
        child = own._process
        child.send_signal(signal.SIGINT)
        assert own.verdict("\\frac{1}{2}", "0.5", timeout_s=60) is True
        assert own._process is child and child.poll() is None
    assert child.poll() is not None


def test_a_verifier_that_cannot_start_says_why(tmp_path, monkeypatch):
    with Verifier(start_timeout_s=0.001) as impatient:
        with pytest.raises(RuntimeError, match="the math-verify process did not start .no answer within 0.001 s"):
            impatient.verdict("1", "2", timeout_s=1)
    (tmp_path / "math_verify.py").write_text("raise ImportError('math_verify is broken here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with Verifier() as broken:
        with pytest.raises(RuntimeError, match="did not start .ImportError: math_verify is broken here"):
            broken.verdict("1", "2", timeout_s=60)


def test_a_verdict_past_the_memory_limit_is_an_overrun_and_the_process_grades_on(tmp_path, monkeypatch):
    """A `math_verify` planted first on the child's path allocates 1.5 GiB for one answer: under a
    1 GiB cap that verdict is `Overrun.MEMORY` (graded wrong, `memory-limit`), the next ones are
    graded by the same process; without a cap the allocation succeeds."""
    (tmp_path / "math_verify.py").write_text(
        "def parse(text, parsing_timeout=None):\n"
        "    return [text]\n"
        "def verify(gold, answer, timeout_seconds=None):\n"
        "    if 'expand' in answer[0]:\n"
        "        return len(bytearray(3 * 2**29)) > 0\n"
        "    return gold == answer\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with Verifier(memory_limit_bytes=2**30) as capped:
        assert capped.verdict("1", "1", timeout_s=60) is True
        child = capped._process.pid
        assert capped.verdict("1", "expand", timeout_s=60) is Overrun.MEMORY
        assert grade("expand", "1", verifier=capped, timeout_s=60) == grading.Grade(False, "memory-limit")
        assert capped.verdict("1", "2", timeout_s=60) is False
        assert capped._process.pid == child
    with Verifier(memory_limit_bytes=None) as uncapped:
        assert uncapped.verdict("1", "expand", timeout_s=60) is True


def test_the_verifier_process_loads_neither_the_package_nor_torch(tmp_path, monkeypatch):
    """Each start after a kill costs only math-verify's imports: modules that refuse to be
    imported, planted first on the child's path, leave it grading."""
    for name in ("torch", "vase_triton"):
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('the grading process imported {name}')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with Verifier() as isolated:
        assert isolated.verdict("\\frac{1}{2}", "0.5", timeout_s=60) is True


def test_a_script_without_a_main_guard_is_not_run_again_by_the_verifier(tmp_path):
    script = tmp_path / "grade.py"
    script.write_text(
        "from vase_triton.eval.verifier import Verifier\n"
        "print('script body ran')\n"
        "with Verifier() as verifier:\n"
        "    print(verifier.verdict('\\\\frac{1}{2}', '0.5', 60))\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["script", "body", "ran", "True"]
