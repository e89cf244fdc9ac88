"""Pull the final answer out of a model's output text.

In order of preference: the last brace-matched `\\boxed{...}` (or `\\fbox{...}`), a GSM8K
style `#### 42` line (a number alone, so a `#### Step 2` heading does not count), then the
last final-answer statement (`Final answer: 42`, `The answer is 42.`: the word "answer"
alone, as in "the answer must be at least 15", states nothing). An output that reasons in
`<think> ... </think>` is read after `</think>` first, then its reasoning's boxes; one cut
off inside `<think>` (its own, or one its prompt opened) states an answer only by a box or
a `####` line. For multiple-choice
questions the result is reduced to a letter.
"""

from __future__ import annotations

import re
from typing import Optional

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_HASH_ANSWER = re.compile(
    r"####[ \t]*\$?[ \t]*([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)[ \t]*\.?[ \t]*$", re.MULTILINE
)
_ANSWER_LINE = re.compile(
    r"\b(?:final\s+answer\s*(?:is\b|:|=|\*\*|$)|answer\s*(?:\*\*\s*)?(?:is\b|:|=))[ \t]*[:=*]*[ \t]*(.*)",
    re.IGNORECASE | re.MULTILINE,
)
# `$...$` as pandoc reads it (no space inside either dollar, no digit after the closing one), so
# that the dollars of `$5 and $6` are amounts, not a formula; or `\\(...\\)`.
_INLINE_MATH = re.compile(r"\$(?!\s)([^$]*?[^\s$])\$(?!\d)|\\\((.+?)\\\)")
_MATH_DELIMITERS = ("\\[", "\\]", "\\(", "\\)", "$$")
_SENTENCE_END = re.compile(r"\.\s")
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_LETTER = re.compile(r"^\(?\s*([A-Z])\s*\)?[.:)]?$", re.IGNORECASE)
_LETTER_AND_VALUE = re.compile(r"^\(?([A-Z])\s*[):.]\s", re.IGNORECASE)
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{([^{}]*)\}")


def _escaped(text: str, index: int) -> bool:
    """Whether `text[index]` follows an odd number of backslashes (`\\{` is a literal brace,
    `\\\\{` a line break and then a group)."""
    start = index
    while start > 0 and text[start - 1] == "\\":
        start -= 1
    return (index - start) % 2 == 1


def _braced(text: str, open_index: int) -> Optional[str]:
    """Content of the brace group opening at `text[open_index] == '{'`, or None if unclosed."""
    depth = 0
    for index in range(open_index, len(text)):
        char = text[index]
        if char == "{" and not _escaped(text, index):
            depth += 1
        elif char == "}" and not _escaped(text, index):
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
        argument = rest
        while argument < len(text) and text[argument] in " \t":  # TeX skips spaces after a command name
            argument += 1
        if argument < len(text) and text[argument] == "{":
            content = _braced(text, argument)
            if content is not None and content.strip():  # an empty box is a template, not an answer
                return content.strip()
        elif argument > rest:
            word = text[argument:].split(maxsplit=1)
            if word:
                return word[0].rstrip("$.").strip()
    return None


def _statement(text: str) -> str:
    """What a final-answer statement says: up to the end of its sentence, markup stripped; the
    content of its first inline formula when it has one (`$72$ clips` says `72`)."""
    text = _SENTENCE_END.split(text.strip().strip("*").strip(), maxsplit=1)[0]
    formula = _INLINE_MATH.search(text)
    if formula is not None:
        return (formula.group(1) or formula.group(2)).strip()
    text = text.rstrip(".").strip().strip("*$").strip()
    for delimiter in _MATH_DELIMITERS:
        text = text.removeprefix(delimiter).removesuffix(delimiter).strip()
    return text


def _heading_answer(text: str) -> str:
    """The statement on the first line after a `**Final Answer**` heading that is more than a
    display-math delimiter (`\\[`, `$$`)."""
    for line in text.lstrip("\n").split("\n", 3)[:3]:
        if line.strip() not in _MATH_DELIMITERS:
            return _statement(line)
    return ""


def _final_answer_line(text: str) -> Optional[str]:
    """The last final-answer statement; a `**Final Answer**` heading's answer is on the next line."""
    for match in reversed(list(_ANSWER_LINE.finditer(text))):
        answer = _statement(match.group(1)) or _heading_answer(text[match.end() :])
        if answer:
            return answer
    return None


def _stated_answer(text: str, *, statements: bool) -> Optional[str]:
    """A box, else a `####` line, else (with `statements`) a final-answer statement."""
    boxed = last_boxed(text)
    if boxed:
        return boxed
    hashes = _HASH_ANSWER.findall(text)
    if hashes:
        return hashes[-1]
    return _final_answer_line(text) if statements else None


def opens_reasoning(prompt: str) -> bool:
    """Whether `prompt` ends inside a `<think>` block (DeepSeek-R1 templates open it), which the
    model's output then continues."""
    return prompt.rfind(_THINK_OPEN) > prompt.rfind(_THINK_CLOSE)


def extract_answer(text: str, *, reasoning_open: bool = False) -> Optional[str]:
    """The final answer stated in `text`, or None when it states none.

    `reasoning_open`: `text` continues a `<think>` block its prompt opened (`opens_reasoning`).
    """
    reasoning, closed, conclusion = text.rpartition(_THINK_CLOSE)
    if closed:
        return _stated_answer(conclusion, statements=True) or _stated_answer(reasoning, statements=False)
    # Reasoning cut off: its musings ("the answer must be ...") are not an answer, a box is.
    return _stated_answer(text, statements=not reasoning_open and _THINK_OPEN not in text)


def choice_letter(answer: Optional[str], n_choices: int) -> Optional[str]:
    """The option letter (`A`, `B`, ...) an extracted answer names, or None.

    Accepts `B`, `b`, `(B)`, `B)`, `B.`, `\\text{B}`, `B) 42`, `(B) 42`, `B: 42`, `\\text{(B) } 42`.
    """
    if answer is None:
        return None
    text, unwrapped = answer.strip().strip("$").replace("\\ ", " ").replace("~", " "), 1
    while unwrapped:
        text, unwrapped = _TEXT_WRAPPER.subn(r"\1", text)
    text = text.strip()
    valid = {chr(ord("A") + index) for index in range(n_choices)}
    match = _LETTER.match(text) or _LETTER_AND_VALUE.match(text)
    if match and match.group(1).upper() in valid:
        return match.group(1).upper()
    return None
