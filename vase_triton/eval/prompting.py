"""Turn a `Problem` into the model's input text: the chat template in thinking mode.

Math questions ask for the answer in `\\boxed{}`; multiple-choice questions list the
options as `A) ...` and ask for the letter in `\\boxed{}`. A tokenizer with a chat template
renders one user turn with `enable_thinking=True` (Qwen3's switch; templates without
it ignore it); one without a template gets the text as is.
"""

from __future__ import annotations

from vase_triton.eval.tasks import Problem

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
CHOICE_INSTRUCTION = "Please reason step by step, and put the letter of your final answer within \\boxed{}."


def user_message(problem: Problem) -> str:
    """The user turn for `problem`; the bare question (and options) when `problem.instruct` is False."""
    parts = [problem.question.strip()]
    if problem.choices:
        parts.append("\n".join(f"{chr(ord('A') + k)}) {choice}" for k, choice in enumerate(problem.choices)))
    if problem.instruct:
        parts.append(CHOICE_INSTRUCTION if problem.choices else MATH_INSTRUCTION)
    return "\n\n".join(parts)


def render_prompt(tokenizer, problem: Problem) -> str:
    """The full prompt text: the chat template with a generation prompt, thinking on."""
    message = user_message(problem)
    if not getattr(tokenizer, "chat_template", None):
        return message
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True, enable_thinking=True
    )
