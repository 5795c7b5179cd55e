"""Prompts that ask for the final answer in ``\\boxed{}``.

``build_messages`` gives chat messages; ``render_prompt`` turns them into the
model's text through the tokenizer's own chat template (``prompt_format: chat``)
or writes a plain completion prompt (``prompt_format: plain``) for base models
without a template. The instruction goes in the user turn, not a system turn:
several small models' templates reject or drop system messages.
"""

from __future__ import annotations

from typing import Any

INSTRUCTION = "Think step by step, then give your final answer in \\boxed{}."
PROMPT_FORMATS = ("chat", "plain")


# Small models ramble when told to think step by step; "direct" asks for the answer alone.
# An instruction holding "{question}" is the whole user turn, the question put in its place
# ("search": the tool protocol and one worked example come first, so the question is the last
# thing the model reads before it writes its query).
INSTRUCTIONS = {
    "think": INSTRUCTION,
    "direct": "Reply with only the final answer in \\boxed{}, for example \\boxed{42}.",
    "search": (
        "Answer the question with the help of a search engine. Search with <search> query "
        "</search>; the results appear between <information> and </information>. Then give "
        "the final answer as <answer> answer </answer>.\n"
        "Example. Question: In which city was Lorma Vesk born?\n"
        "<search> Lorma Vesk </search>\n"
        "<information> Doc 1: Lorma Vesk was a baker born in 1802 in the city of Drun. "
        "</information>\n"
        "<answer> Drun </answer>\n\n"
        "Question: {question}"
    ),
    # Questions that need a second look-up (search_qa's hops: 2): the example searches twice.
    "search_multi": (
        "Answer the question with the help of a search engine. Search with <search> query "
        "</search>; the results appear between <information> and </information>. Search again "
        "when the results do not answer the question yet. Then give the final answer as "
        "<answer> answer </answer>.\n"
        "Example. Question: In which country was Lorma Vesk born?\n"
        "<search> Lorma Vesk </search>\n"
        "<information> Doc 1: Lorma Vesk was a baker born in 1802 in the city of Drun. "
        "</information>\n"
        "<search> Drun </search>\n"
        "<information> Doc 1: Drun is a city in the country of Belmar. </information>\n"
        "<answer> Belmar </answer>\n\n"
        "Question: {question}"
    ),
}


def build_messages(
    question: str, system: str | None = None, instruction: str = "think"
) -> list[dict[str, str]]:
    """Chat messages for ``question``: an optional system turn, then the user turn."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question must be a non-empty string; got {question!r}")
    if instruction not in INSTRUCTIONS:
        raise ValueError(f"instruction={instruction!r}: choose one of {sorted(INSTRUCTIONS)}")
    messages = [] if system is None else [{"role": "system", "content": system}]
    text = INSTRUCTIONS[instruction]
    if "{question}" in text:
        content = text.replace("{question}", question.strip())
    else:
        content = f"{question.strip()}\n{text}"
    messages.append({"role": "user", "content": content})
    return messages


def plain_prompt(question: str) -> str:
    """Completion-style prompt for models without a chat template."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question must be a non-empty string; got {question!r}")
    return f"Question: {question.strip()}\n{INSTRUCTION}\nSolution:"


def render_prompt(
    tokenizer: Any, question: str, *, prompt_format: str = "chat", system: str | None = None
) -> str:
    """The prompt text for ``question``, ready to tokenize and generate from.

    ``chat`` applies ``tokenizer.apply_chat_template(..., add_generation_prompt=True)``;
    a tokenizer without a chat template is an error (base models have none).
    """
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(
            f"prompt_format={prompt_format!r} is not known; use one of {list(PROMPT_FORMATS)}"
        )
    if prompt_format == "plain":
        if system is not None:
            return f"{system}\n\n{plain_prompt(question)}"
        return plain_prompt(question)
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
        raise ValueError(
            f"tokenizer {name!r} has no chat template, so prompt_format 'chat' cannot be used; "
            "set `chat_template` for the model (a Jinja template string) or use "
            "`prompt_format: plain` for a base model"
        )
    text = tokenizer.apply_chat_template(
        build_messages(question, system), tokenize=False, add_generation_prompt=True
    )
    if not isinstance(text, str):
        raise TypeError(
            f"apply_chat_template returned {type(text).__name__}, expected str; "
            "the tokenizer must support tokenize=False"
        )
    return text
