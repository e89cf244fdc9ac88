"""Pull the final answer out of a model's output text.

In order of preference: the last brace-matched `\\boxed{...}` (or `\\fbox{...}`), a GSM8K
style `#### 42` line, then the last final-answer line (`Final answer: 42`,
`The answer is 42.`). For multiple-choice questions the result is reduced to a letter.
"""

from __future__ import annotations

import re
from typing import Optional

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_HASH_ANSWER = re.compile(r"####\s*([^\n]+)")
_ANSWER_LINE = re.compile(
    r"(?:final\s+answer|answer)\s*(?:is|:|=)?\s*[:=]?\s*(.+)", re.IGNORECASE
)
_LETTER = re.compile(r"^\(?\s*([A-Z])\s*\)?[.:)]?$")
_TEXT_WRAPPER = re.compile(r"^\\(?:text|textbf|mathrm|mathbf)\{(.*)\}$")


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
        return hashes[-1].strip().rstrip(".").strip() or None
    return _final_answer_line(text)


def choice_letter(answer: Optional[str], n_choices: int) -> Optional[str]:
    """The option letter (`A`, `B`, ...) an extracted answer names, or None.

    Accepts `B`, `(B)`, `B)`, `B.`, `\\text{B}`, `B) 42`, `(B) 42`.
    """
    if answer is None:
        return None
    text = answer.strip().strip("$").strip()
    wrapped = _TEXT_WRAPPER.match(text)
    if wrapped:
        text = wrapped.group(1).strip()
    valid = {chr(ord("A") + index) for index in range(n_choices)}
    match = _LETTER.match(text)
    if match and match.group(1) in valid:
        return match.group(1)
    leading = re.match(r"^\(?([A-Z])\)\s", text)
    if leading and leading.group(1) in valid:
        return leading.group(1)
    return None
