"""Prompt templates: a problem text -> the string the policy model continues.

Two forms:

- plain (base models, tokenizers without a chat template)::

      Question: <problem>
      <instruction>
      Answer:

- chat (instruction-tuned models): ``tokenizer.apply_chat_template`` over an
  optional system message and one user message ``<problem>\\n\\n<instruction>``,
  with ``add_generation_prompt=True`` and ``tokenize=False``.

``render_prompt`` picks chat when the tokenizer has a ``chat_template`` and plain
otherwise. Instructions are per task kind (``INSTRUCTIONS``): math asks for the
final answer in ``\\boxed{}`` (what ``rewards.math`` reads first), code asks for a
stdin/stdout Python program in a fenced block (what ``rewards.code`` extracts).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

INSTRUCTIONS: dict[str, str] = {
    "math": "Reason step by step, and put your final answer within \\boxed{}.",
    "code": (
        "Write a Python 3 program that reads the input from standard input and writes the answer "
        "to standard output. Put the complete program in one ```python code block."
    ),
}


def _instruction(task: str, instruction: str | None) -> str:
    if instruction is not None:
        return instruction
    if task not in INSTRUCTIONS:
        raise ValueError(f"task {task!r} has no default instruction; use one of {sorted(INSTRUCTIONS)} "
                         "or pass instruction=")
    return INSTRUCTIONS[task]


def plain_prompt(problem: str, *, task: str = "math", instruction: str | None = None) -> str:
    """``"Question: {problem}\\n{instruction}\\nAnswer:"``."""
    if not isinstance(problem, str) or not problem.strip():
        raise ValueError(f"problem must be a non-empty string, got {problem!r:.80}")
    return f"Question: {problem.strip()}\n{_instruction(task, instruction)}\nAnswer:"


def chat_messages(
    problem: str, *, task: str = "math", instruction: str | None = None, system: str | None = None
) -> list[dict[str, str]]:
    """``[{"role": "system", ...}?, {"role": "user", "content": problem + instruction}]``."""
    if not isinstance(problem, str) or not problem.strip():
        raise ValueError(f"problem must be a non-empty string, got {problem!r:.80}")
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": f"{problem.strip()}\n\n{_instruction(task, instruction)}"})
    return messages


def has_chat_template(tokenizer: Any) -> bool:
    """True when ``tokenizer`` carries a non-empty ``chat_template``."""
    return bool(getattr(tokenizer, "chat_template", None)) and hasattr(tokenizer, "apply_chat_template")


def render_prompt(
    problem: str,
    tokenizer: Any = None,
    *,
    task: str = "math",
    instruction: str | None = None,
    system: str | None = None,
) -> str:
    """The prompt string for ``problem``: chat template when the tokenizer has one, else plain.

    ``system`` is used only by the chat form.
    """
    if has_chat_template(tokenizer):
        text = tokenizer.apply_chat_template(
            chat_messages(problem, task=task, instruction=instruction, system=system),
            add_generation_prompt=True,
            tokenize=False,
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str (tokenize=False)")
        return text
    return plain_prompt(problem, task=task, instruction=instruction)


def render_prompts(
    rows: Iterable[Mapping[str, Any]],
    tokenizer: Any = None,
    *,
    task: str = "math",
    instruction: str | None = None,
    system: str | None = None,
) -> list[str]:
    """``render_prompt`` over the ``prompt`` field of each row (e.g. a hub loader's Dataset)."""
    out = []
    for i, row in enumerate(rows):
        if "prompt" not in row:
            raise ValueError(f"row {i} has no 'prompt' field (fields: {sorted(row)})")
        out.append(render_prompt(row["prompt"], tokenizer, task=task, instruction=instruction, system=system))
    return out
