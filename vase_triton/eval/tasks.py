"""Evaluation problems: hub benchmarks by name, local JSONL files, and the built-in testbed.

A task name is one of `HUB_TASKS` (loaded with `datasets` when a network is reachable),
`testbed` (generated, no download), or a path to a JSONL file with one problem per line:

    {"id": "p1", "question": "What is 2 + 3?", "answer": "5"}
    {"id": "p2", "question": "Which is prime?", "answer": "B", "choices": ["4", "5", "6", "8"]}

`id` and `question` are non-empty strings, `answer` is the gold answer (for multiple
choice the letter of the correct option, `A` first), and `choices` is optional (2 to 26
options, lettered A to Z). An optional
`reference` holds a complete expected output, graded for whole-trace exact match.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path
from typing import Callable, Optional

from vase_triton.commands.common import endpoint_unreachable


class TaskError(ValueError):
    """A task that cannot be loaded; the message is one line meant for the user."""


@dataclasses.dataclass(frozen=True)
class Problem:
    task: str
    id: str
    question: str
    answer: str
    choices: Optional[tuple[str, ...]] = None
    reference: Optional[str] = None
    instruct: bool = True  # False: the prompt is the bare question, without the answer-format instruction


@dataclasses.dataclass(frozen=True)
class HubTask:
    """Where a benchmark lives on the hub and how its rows become `Problem`s."""

    dataset: str
    config: Optional[str]
    split: str
    convert: Callable[[str, int, dict], Problem]


def _plain(question_field: str, answer_field: str, id_fields: tuple[str, ...] = ("id", "unique_id")):
    def convert(task: str, index: int, row: dict) -> Problem:
        identifier = next((str(row[f]) for f in id_fields if row.get(f) not in (None, "")), str(index))
        return Problem(task, identifier, str(row[question_field]).strip(), str(row[answer_field]).strip())

    return convert


def gsm8k_gold(solution: str) -> str:
    """The number after the last `####` of a GSM8K solution, thousands separators removed."""
    if "####" not in solution:
        raise TaskError(f"gsm8k: expected an answer ending '#### N'; got {solution[-60:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def _gsm8k(task: str, index: int, row: dict) -> Problem:
    return Problem(task, str(index), row["question"].strip(), gsm8k_gold(row["answer"]))


def shuffled_choices(correct: str, incorrect: list[str], seed: int) -> tuple[tuple[str, ...], str]:
    """The options in an order fixed by `seed`, and the letter of the correct one."""
    options = [correct.strip(), *(option.strip() for option in incorrect)]
    order = list(range(len(options)))
    random.Random(seed).shuffle(order)
    shuffled = tuple(options[i] for i in order)
    return shuffled, chr(ord("A") + order.index(0))


def _gpqa(task: str, index: int, row: dict) -> Problem:
    incorrect = [row[f"Incorrect Answer {k}"] for k in (1, 2, 3)]
    choices, letter = shuffled_choices(row["Correct Answer"], incorrect, seed=index)
    identifier = str(row.get("Record ID") or index)
    return Problem(task, identifier, row["Question"].strip(), letter, choices)


HUB_TASKS: dict[str, HubTask] = {
    "aime24": HubTask("HuggingFaceH4/aime_2024", None, "train", _plain("problem", "answer")),
    "aime25": HubTask("yentinglin/aime_2025", None, "train", _plain("problem", "answer")),
    "math500": HubTask("HuggingFaceH4/MATH-500", None, "test", _plain("problem", "answer", ("unique_id",))),
    "gsm8k": HubTask("openai/gsm8k", "main", "test", _gsm8k),
    "gpqa-diamond": HubTask("Idavidrein/gpqa", "gpqa_diamond", "train", _gpqa),
    "hmmt25": HubTask("MathArena/hmmt_feb_2025", None, "train", _plain("problem", "answer", ("problem_idx",))),
}
TESTBED_TASK = "testbed"
DEFAULT_TESTBED_PROBLEMS = 64


def load_jsonl(path: Path) -> list[Problem]:
    """Problems of a local JSONL file (schema in the module docstring), recorded under `task_label(path)`."""
    problems, seen = [], set()
    try:
        lines = path.read_text(encoding="utf-8-sig").split("\n")  # "\n" only: strings may hold U+2028
    except OSError as error:
        raise TaskError(f"--tasks: cannot read {str(path)!r}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise TaskError(
            f"--tasks: expected UTF-8 text in {str(path)!r}; got {error.reason} at byte {error.start}"
        ) from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise TaskError(f"--tasks: {where}: expected a JSON object; got invalid JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise TaskError(f"--tasks: {where}: expected a JSON object; got {type(row).__name__}")
        for field in ("id", "question", "answer"):
            value = row.get(field)
            if not isinstance(value, (str, int, float)) or isinstance(value, bool) or not str(value).strip():
                raise TaskError(f"--tasks: {where}: expected field {field!r} (a non-empty string); got {value!r}")
        if row.get("reference") is not None and not isinstance(row["reference"], str):
            raise TaskError(f"--tasks: {where}: expected 'reference' to be a string (a whole expected output); "
                            f"got {row['reference']!r}")
        choices = row.get("choices")
        if choices is not None:
            if (
                not isinstance(choices, list) or not 2 <= len(choices) <= 26
                or not all(isinstance(c, str) and c.strip() for c in choices)
            ):
                raise TaskError(f"--tasks: {where}: expected 'choices' to be a list of 2 to 26 non-empty strings "
                                f"(lettered A to Z); got {choices!r}")
            letters = [chr(ord("A") + k) for k in range(len(choices))]
            if str(row["answer"]).strip().upper() not in letters:
                raise TaskError(
                    f"--tasks: {where}: expected 'answer' to be one of the letters {''.join(letters)}; got {row['answer']!r}"
                )
        identifier = str(row["id"])
        if identifier in seen:
            raise TaskError(f"--tasks: {where}: expected unique ids; got {identifier!r} twice")
        seen.add(identifier)
        problems.append(
            Problem(
                task_label(str(path)), identifier, str(row["question"]), str(row["answer"]).strip(),
                tuple(choices) if choices else None, row.get("reference"),
            )
        )
    if not problems:
        raise TaskError(f"--tasks: {str(path)!r} holds no problems")
    return problems


def _load_hub(name: str, spec: HubTask) -> list[Problem]:
    try:
        import datasets
    except ImportError:
        raise TaskError(
            f"--tasks: {name} is loaded from the hub with the `datasets` package, which is not installed "
            "(pip install 'vase-triton[eval]'), or pass a local JSONL file"
        ) from None
    from huggingface_hub import constants
    from huggingface_hub.utils import logging as hub_logging

    datasets.logging.set_verbosity_error()
    hub_logging.set_verbosity_error()
    if not constants.HF_HUB_OFFLINE:
        reason = endpoint_unreachable(constants.ENDPOINT)
        if reason:
            raise TaskError(
                f"--tasks: cannot load {name} ({spec.dataset}): the hub at {constants.ENDPOINT} is unreachable "
                f"({reason}); pass a local JSONL file, or set HF_HUB_OFFLINE=1 to use a cached copy"
            )
    try:
        rows = datasets.load_dataset(spec.dataset, spec.config, split=spec.split)
    except Exception as error:  # offline, gated, renamed: all become one line
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise TaskError(
            f"--tasks: cannot load {name} ({spec.dataset}) from the hub: {first[:200]} "
            "(no network? pass a local JSONL file instead)"
        ) from None
    return [spec.convert(name, index, dict(row)) for index, row in enumerate(rows)]


def load_task(
    name: str, *, limit: Optional[int] = None, testbed_problems: int = DEFAULT_TESTBED_PROBLEMS
) -> list[Problem]:
    """The problems of task `name` (first `limit` of them when given)."""
    if name == TESTBED_TASK:
        from vase_triton.testbed.harness import testbed_problems as make

        problems = make(testbed_problems)
    elif name in HUB_TASKS:
        problems = _load_hub(name, HUB_TASKS[name])
    elif name.endswith(".jsonl") or os.sep in name or Path(name).is_file():
        problems = load_jsonl(Path(name))
    else:
        known = ", ".join([*HUB_TASKS, TESTBED_TASK])
        raise TaskError(f"--tasks: expected one of {known} or a path to a .jsonl file; got {name!r}")
    return problems[:limit] if limit else problems


def task_label(name: str) -> str:
    """The name a task is recorded under: its own name, or a file's stem (`data/mine.txt`: `mine`)."""
    if name in HUB_TASKS or name == TESTBED_TASK:
        return name
    return Path(name).stem
