"""Pull the final answer out of a model's output text.

In order of preference: the last brace-matched `\\boxed{...}` (or `\\fbox{...}`), a GSM8K
style `#### 42` line (a number alone, so a `#### Step 2` heading does not count), then the
last final-answer line (`Final answer: 42`, `The answer is 42.`). For multiple-choice
questions the result is reduced to a letter.
"""

from __future__ import annotations

import re
from typing import Optional

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_HASH_ANSWER = re.compile(r"####[ \t]*([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)[ \t]*\.?[ \t]*$", re.MULTILINE)
_ANSWER_LINE = re.compile(
    r"\b(?:final\s+answer|answer)\b\s*(?:is|:|=)?\s*[:=]?\s*(.+)", re.IGNORECASE
)
_LETTER = re.compile(r"^\(?\s*([A-Z])\s*\)?[.:)]?$", re.IGNORECASE)
_LETTER_AND_VALUE = re.compile(r"^\(?([A-Z])\s*[):.]\s", re.IGNORECASE)
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{([^{}]*)\}")


def _braced(text: str, open_index: int) -> Optional[str]:
    """Content of the brace group opening at `text[open_index] == '{'`, or None if unclosed."""
    depth = 0
    for index in range(open_index, len(text)):
        char = text[index]
        if char == "{" and text[index - 1 : index] != "\\":
            depth += 1
        elif char == "}" and text[index - 1 : index] != "\\":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : index]
    return None


def last_boxed(text: str) -> Optional[str]:
    """Content of the last complete `\\boxed{...}` / `\\fbox{...}` (braces matched), else None.

    `\\boxed 5` (argument without braces) gives `5`.
    """
    starts = sorted(
        (match.start(), command) for command in _BOX_COMMANDS for match in re.finditer(re.escape(command), text)
    )
    for start, command in reversed(starts):
        rest = start + len(command)
        if rest < len(text) and text[rest] == "{":
            content = _braced(text, rest)
            if content is not None:
                return content.strip()
        elif rest < len(text) and text[rest] == " ":
            word = text[rest:].split(maxsplit=1)
            if word:
                return word[0].rstrip("$.").strip()
    return None


def _final_answer_line(text: str) -> Optional[str]:
    matches = list(_ANSWER_LINE.finditer(text))
    if not matches:
        return None
    answer = matches[-1].group(1).strip().strip("*").strip()
    answer = answer.rstrip(".").strip().strip("$").strip()
    return answer or None


def extract_answer(text: str) -> Optional[str]:
    """The final answer stated in `text`, or None when it states none."""
    boxed = last_boxed(text)
    if boxed:
        return boxed
    hashes = _HASH_ANSWER.findall(text)
    if hashes:
        return hashes[-1]
    return _final_answer_line(text)


def choice_letter(answer: Optional[str], n_choices: int) -> Optional[str]:
    """The option letter (`A`, `B`, ...) an extracted answer names, or None.

    Accepts `B`, `b`, `(B)`, `B)`, `B.`, `\\text{B}`, `B) 42`, `(B) 42`, `B: 42`, `\\text{(B) } 42`.
    """
    if answer is None:
        return None
    text, unwrapped = answer.strip().strip("$"), 1
    while unwrapped:
        text, unwrapped = _TEXT_WRAPPER.subn(r"\1", text)
    text = text.strip()
    valid = {chr(ord("A") + index) for index in range(n_choices)}
    match = _LETTER.match(text) or _LETTER_AND_VALUE.match(text)
    if match and match.group(1).upper() in valid:
        return match.group(1).upper()
    return None
